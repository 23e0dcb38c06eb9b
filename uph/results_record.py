"""What a results folder was made with: `<results>/.uph-config.json`, the settings of each stage's outputs.

Snakemake reruns a job whose params changed only where its run history (`.snakemake/metadata` of the
working directory) knows the job's outputs. A results folder copied to a new path (a backup restored,
a folder moved to another disk, a colleague's results) has no history there, and Snakemake would
answer a changed `model.source` with "Nothing to be done" and the old tables. So the folder carries
its own record, and the DAG build (`check`) compares the config with it for every stage whose outputs
Snakemake has no history of: a difference is refused in one line naming the key, the folder's value
and the fix (delete the stage's folder: it and every stage after it are rebuilt).

The record is written around each real run (never by a dry run), from the DAG Snakemake built:
`started` (the Snakefile's onstart) gives each stage about to be rebuilt the config's settings, or
marks it pending where its rebuild rests on history alone (changed params: a copy made before the run
ends holds outputs of two configs, and a run without that history would not finish the rebuild);
`finished` (onsuccess and onerror) settles every stage whose outputs are all current. A stage absent
from the record (a folder made before the record existed) is not checked. Torch- and pandas-free: the
DAG build imports it.
"""

from __future__ import annotations

import json
import os
from base64 import urlsafe_b64encode
from dataclasses import dataclass, field
from pathlib import Path

from uph.errors import ConfigError

RECORD = ".uph-config.json"
VERSION = 1


@dataclass(frozen=True)
class Stage:
    """One stage of the study: the rules whose jobs build it, the config settings its outputs depend on
    ('section.key' -> value), the paths under the results folder whose deletion rebuilds it (`fix`; the
    stage counts as built while any of them exists), the outputs that a DAG holding them all covers the
    whole stage with (`final`, as the rules name them), and the stages whose rebuild rebuilds it."""

    name: str
    rules: frozenset[str]
    settings: dict
    fix: tuple[str, ...]
    final: tuple[str, ...]
    after: tuple[str, ...] = field(default=())


def section_settings(name: str, section: dict, keys=None) -> dict:
    """`section`'s `keys` (all if None), in their order, as 'name.key' -> value in JSON's types (lists, not
    tuples): the order in which a difference names them."""
    return json.loads(json.dumps({f"{name}.{key}": section[key] for key in (section if keys is None else keys)}))


def read(results: str | Path) -> dict:
    """stage -> {'settings': ..., 'pending': bool} of the folder's record; empty without one."""
    path = Path(results) / RECORD
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(
            f"config key 'results': the record of what folder '{results}' was made with, '{path}', is damaged "
            f"({str(error).splitlines()[0]}); delete it and run snakemake again (its stages are then not checked "
            "until a run records them)"
        ) from None
    stages = record.get("stages") if isinstance(record, dict) else None
    return stages if isinstance(stages, dict) else {}


def write(results: str | Path, stages: dict) -> None:
    from uph.io import atomic_path  # written only around a real run: the DAG build never needs it

    with atomic_path(Path(results) / RECORD) as tmp:
        tmp.write_text(json.dumps({"version": VERSION, "stages": stages}, indent=1, sort_keys=True) + "\n")


def has_history(output: str, workdir: str | Path = ".") -> bool:
    """Whether Snakemake's run history in `workdir` (its file persistence, `.snakemake/metadata`) has a
    record of `output`, named as its rule names it; the record's path is the base64 of that name, cut
    into parts of the file system's longest name (snakemake.persistence.file.FilePersistence)."""
    metadata = Path(workdir) / ".snakemake" / "metadata"
    if not metadata.is_dir():
        return False
    longest = (os.pathconf(metadata, "PC_NAME_MAX") if os.name == "posix" else 255) or 255
    name = urlsafe_b64encode(output.encode()).decode()
    parts = [name[i : i + longest - 1] for i in range(0, len(name), longest - 1)]
    return metadata.joinpath(*["@" + part for part in parts[:-1]], parts[-1]).is_file()


def _built(results: Path, stage: Stage) -> bool:
    return any((results / path).exists() for path in stage.fix)


def _differences(recorded: dict, settings: dict) -> list[str]:
    """The keys whose values differ, in the order of `settings` (a stage lists first what a user changes
    first), then keys only `recorded` has."""
    missing = object()
    keys = [*settings, *(key for key in recorded if key not in settings)]
    return [key for key in keys if recorded.get(key, missing) != settings.get(key, missing)]


def _shown(settings: dict, key: str) -> str:
    return repr(settings[key]) if key in settings else "no value"


def check(results: str | Path, stages: list[Stage], history=has_history) -> None:
    """Refuse, in one line, a config that differs from what the folder's outputs were made with in a
    stage whose outputs Snakemake has no history of (every final output that exists has none), or a
    stage a run was rebuilding from history alone when it stopped. A stage not built (none of its `fix`
    paths exists) or after one is rebuilt anyway and not checked; the fix names the folders of the
    first stages that differ, which rebuild those after them."""
    results = Path(results)
    record = read(results)
    rebuilt, refused = set(), {}
    for stage in stages:
        if not _built(results, stage) or rebuilt & set(stage.after):
            rebuilt.add(stage.name)
            continue
        if refused.keys() & set(stage.after):
            refused.setdefault(stage.name, None)  # rebuilt with the stage before it
            continue
        known = [output for output in stage.final if Path(output).exists()]
        if stage.name not in record or (known and all(map(history, known))):
            continue
        entry = record[stage.name]
        if entry.get("pending"):
            refused[stage.name] = (
                f"config key 'results': folder '{results}' was copied, or its Snakemake history removed, while a run "
                f"was rebuilding its {stage.name} stage ({results / RECORD}): it may hold outputs of two configs"
            )
        elif keys := _differences(entry.get("settings", {}), stage.settings):
            key, made = keys[0], entry.get("settings", {})
            refused[stage.name] = (
                f"config key '{key}': results folder '{results}' was made with {_shown(made, key)}, not "
                f"{_shown(stage.settings, key)} ({results / RECORD}), and this working directory has no Snakemake "
                "history of it to rerun from"
            )
    first = [(name, why) for name, why in refused.items() if why is not None]
    if first:
        folders = [str(results / path) for name, _ in first for path in _stage(stages, name).fix]
        raise ConfigError(
            f"{first[0][1]}; delete {_listed(folders)} and run snakemake again to rebuild "
            f"{'it' if len(folders) == 1 else 'them'} and what depends on {'it' if len(folders) == 1 else 'them'}, "
            "or use a fresh results folder"
        )


def _stage(stages: list[Stage], name: str) -> Stage:
    return next(stage for stage in stages if stage.name == name)


def _listed(paths: list[str]) -> str:
    quoted = [f"'{path}'" for path in paths]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + f" and {quoted[-1]}"


def _stamp(path: str) -> list[int] | None:
    """[size, mtime_ns] of `path`, None where it is missing: whether a job has rewritten it since."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return [stat.st_size, stat.st_mtime_ns]


def started(results: str | Path, stages: list[Stage], jobs, history=has_history) -> None:
    """Before a run's jobs (onstart): `jobs` are (rule, outputs, needs to run, rests on history) for
    every job of the DAG. A stage with a job to run gets the config's settings, pending where a job
    reruns on history alone (changed params, code or inputs, an incomplete output), with what it had
    before and the stamps of the outputs about to be rebuilt, so that a run that stops before any of
    them was touched (a refused model candidate) leaves the record as it was. A stage whose jobs are all
    current gets the settings where Snakemake's history vouches for them (a folder made before the record)."""
    record = read(results)
    for stage in stages:
        mine = [job for job in jobs if job[0] in stage.rules]
        if any(needs_run for _, _, needs_run, _ in mine):
            entry = {"settings": stage.settings, "pending": any(on_history for *_, on_history in mine)}
            if entry["pending"]:
                rebuilt = [output for _, outputs, needs_run, _ in mine if needs_run for output in outputs]
                entry.update(was=record.get(stage.name), stamps={output: _stamp(output) for output in rebuilt})
            record[stage.name] = entry
        elif (
            mine and stage.name not in record and all(history(output) for _, outputs, *_ in mine for output in outputs)
        ):
            record[stage.name] = {"settings": stage.settings, "pending": False}
    write(results, record)


def finished(results: str | Path, stages: list[Stage], jobs) -> None:
    """After a run (onsuccess, onerror): `jobs` are (rule, outputs, current) for every job of the DAG,
    current when it finished or had nothing to do. A stage whose final outputs the DAG holds all of,
    and whose jobs there are all current, is settled with the config's settings; a pending one none of
    whose outputs was touched gets back what it had before the run."""
    record = read(results)
    outputs = {output for _, job_outputs, _ in jobs for output in job_outputs}
    for stage in stages:
        mine = [current for rule, _, current in jobs if rule in stage.rules]
        entry = record.get(stage.name) or {}
        if mine and all(mine) and set(stage.final) <= outputs:
            record[stage.name] = {"settings": stage.settings, "pending": False}
        elif entry.get("pending") and entry.get("stamps") and all(_stamp(p) == s for p, s in entry["stamps"].items()):
            if entry.get("was") is None:
                del record[stage.name]
            else:
                record[stage.name] = entry["was"]
    write(results, record)


IDENTITY_KEYS = ("source", "name", "revision", "trust_remote_code")  # what identity.json records of model.*


def check_identity(results: str | Path, identity: dict, model: dict, output: str, history=has_history) -> None:
    """A folder made before the record (no 'model' stage in it) still names its model in
    `<results>/model/identity.json` (`output`, as the model rule names it): where Snakemake has no history
    of it, the config's model keys must be the ones it records."""
    if "model" in read(results) or not Path(output).exists() or history(output):
        return
    for key in IDENTITY_KEYS:
        if key in identity and identity[key] != model[key]:
            raise ConfigError(
                f"config key 'model.{key}': results folder '{results}' was made with {identity[key]!r}, not "
                f"{model[key]!r} ({output}), and this working directory has no Snakemake history of it to rerun "
                f"from; delete '{Path(results) / 'model'}' and run snakemake again to rebuild it and what depends "
                "on it, or use a fresh results folder"
            )
