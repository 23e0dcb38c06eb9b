"""What made each job's outputs, kept with them: `<results>/records/<rule>/<wildcards>.json`.

A job that ends well writes its record (`write_record`, from uph.logs.rule_logging): its params (exactly
what its outputs rest on besides its input files, canonical, no device), the content digest of each
input file, and the digest, size and mtime of each output. At DAG build each job of the target's DAG is
checked against its record (`Records.needs_rerun`): the params the config gives now, every input's
content now, every output's content now. A job whose record disagrees, or that has none, is forced to
run (`record_check`, an input function of every rule), and Snakemake reruns what is built from it, for
any target; a dry run plans the same, since both read the same disk, and the check writes nothing. No
clock, copy or path history vouches for an output: a folder copied from another config brings that
config's records, a corpus file replaced by older-dated text has another digest.

A small file (SMALL_FILE_BYTES) is hashed at every check; a larger one only where its size or mtime differ
from what its producer's record holds (a copy that kept them, or a job's own output, is read once, when
written); the run's hooks keep the recorded dates in step with the files' (Records.run_started,
Records.run_ended). Snakemake's own judgement by dates is off where the run's rerun triggers leave out
`mtime` (judge_by_content, profiles/default). Torch- and pandas-free: the DAG
build imports it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path

from snakemake.io import apply_wildcards

from uph.model_identity import file_sha256

FOLDER = "records"  # under the results folder
# Outputs up to this size (tables, summaries, figures, most of a job's parquet files: about 8 MB in all in the
# default's folder) are hashed at every DAG build, whatever their size and date: a table edited by hand and
# dated back is rebuilt. Larger ones (shards, the model) are hashed again only where size or date moved.
SMALL_FILE_BYTES = 1 << 20


def canonical(value):
    """`value` with every number a float (5 and 5.0 are one setting) and dict keys sorted: settings that
    mean the same compare equal."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {str(key): canonical(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [canonical(item) for item in value]
    return str(value)


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes, or of a folder's files (relative path and digest, in path order)."""
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_dir():
        for item in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(f"{item.relative_to(path).as_posix()}\0{file_digest(item)}\n".encode())
        return digest.hexdigest()
    return file_sha256([path])


def job_key(wildcards: dict) -> str:
    """The record's file name: the job's wildcards as name~value, joined by '-' ('job' without any)."""
    return "-".join(f"{name}~{value}" for name, value in sorted(wildcards.items())) or "job"


def record_path(results: str | Path, rule: str, wildcards: dict) -> Path:
    return Path(results) / FOLDER / rule / f"{job_key(wildcards)}.json"


def _stat(path: str | Path) -> list[int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return [stat.st_size, stat.st_mtime_ns]


def _relative(path: str, results: Path) -> str:
    """`path` relative to the results folder where it lies under it (a record moves with its folder)."""
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(results.absolute()).as_posix()
    except ValueError:
        return str(absolute)


def _absolute(path: str, results: Path) -> Path:
    return Path(path) if os.path.isabs(path) else results / path


def write_record(results: str | Path, rule: str, wildcards: dict, settings: dict, inputs, outputs) -> Path:
    """Write the record of a job that ended well (module docstring)."""
    from uph.io import write_json  # pandas: only a job writes records

    results = Path(results)
    known = Records(results)  # an input another job wrote is read by size and date, as its record has it
    inputs = [_relative(path, results) for path in inputs if os.path.exists(path)]
    record = {
        "rule": rule,
        "wildcards": dict(sorted(wildcards.items())),
        "settings": json.loads(json.dumps(settings, default=str)),
        # an input the job moved away (the model candidate it installs) is no file of the folder any more
        "inputs": {name: known.digest(name) for name in inputs},
        "outputs": {_relative(path, results): [*_stat(path), file_digest(path)] for path in outputs},
    }
    path = record_path(results, rule, wildcards)
    write_json(record, path)
    return path


def check_records_folder(results: str | Path) -> None:
    """At DAG build, before any job: every job must be able to write its record, or a finished job could
    not say what made its outputs. The records folder and each rule's folder in it, where they exist, are
    folders this process can write to, and no record is a folder. Raises ConfigError or ArtifactError, one
    line naming the path."""
    from uph.errors import ArtifactError, ConfigError

    folder = Path(results) / FOLDER
    if not folder.exists():
        return
    for path in [folder, *sorted(folder.iterdir())]:
        if path == folder or path.is_dir():
            if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
                problem = "is not a folder" if not path.is_dir() else "is not writable"
                raise ConfigError(
                    f"config key 'results': '{path}' {problem}, and the jobs write their records there; make it a "
                    "writable folder and run snakemake again"
                )
    for path in sorted(folder.glob("*/*.json")):
        if path.is_dir():
            raise ArtifactError(
                f"'{path}' is a folder, where a job writes its record; delete it and run snakemake again"
            )


def _note_dates(results: Path, unchanged) -> int:
    """Write into the records the present size and date of each output that `unchanged(record file, output,
    [size, mtime_ns] recorded, [size, mtime_ns] now)` says still holds its recorded bytes, so that the next
    DAG build reads it by size and date, not again in full. The number of records written."""
    from uph.io import write_json  # pandas: only when dates moved

    written = 0
    for path in sorted((results / FOLDER).glob("*/*.json")):
        with contextlib.suppress(OSError, ValueError, UnicodeDecodeError, TypeError, KeyError, AttributeError):
            record, moved = json.loads(path.read_text()), False
            for output, made in record["outputs"].items():
                now = _stat(_absolute(output, results))
                if now is not None and now != made[:2] and unchanged(path, output, made[:2], now):
                    made[:2], moved = now, True
            if moved:
                write_json(record, path)
                written += 1
    return written


def redate_future_files(results: str | Path) -> list[Path]:
    """Date now every file of the results folder whose mtime lies in the future (a folder copied from a
    clock running ahead), and its records' note of it: Snakemake dates a job's outputs now when it ends, and
    fails the job if an input is newer. All get the same instant, so no file turns newer than another it
    was made from. Called once a run holds Snakemake's lock (onstart): a dry run changes nothing."""
    results, now = Path(results), time.time_ns()
    redated = []
    for folder, _, names in os.walk(results):
        for name in names:
            path = Path(folder) / name
            stat = _stat(path)
            if stat is not None and stat[1] > now:
                os.utime(path, ns=(now, now))
                redated.append(path)
    moved = {_relative(str(path), results) for path in redated}
    if moved:
        _note_dates(results, lambda record, output, made, present: output in moved)
    return redated


def note_touched_outputs(results: str | Path, since_ns: int) -> int:
    """Note in the records written since `since_ns` (this run's) the dates Snakemake gave their outputs
    when the jobs ended, after the records were written. Called when the run ends (onsuccess, onerror)."""

    def touched(record: Path, output, made, present) -> bool:
        return present[0] == made[0] and (_stat(record) or [0, -1])[1] >= since_ns

    return _note_dates(Path(results), touched)


class Records:
    """The records of a results folder, read at DAG build, and the content digests of the files they
    name, each found once per build."""

    def __init__(self, results: str | Path):
        self.results = Path(results)
        self._made: dict[str, list] = {}  # output (relative) -> [size, mtime_ns, digest] from its record
        self._records: dict[Path, dict | None] = {}
        self._digests: dict[str, str | None] = {}
        self._redated: dict[str, list[int]] = {}  # output -> [size, mtime_ns] now, its bytes as recorded
        for path in sorted((self.results / FOLDER).glob("*/*.json")):
            record = self._read(path)
            for output, made in (record or {}).get("outputs", {}).items():
                self._made[output] = made
        self.since_ns = time.time_ns()  # records written from here on are this run's (run_ended)

    @staticmethod
    def settings_of(results: str | Path, rule: str, wildcards: dict | None = None) -> dict:
        """The params a job's outputs in `results` were made with, as recorded; {} where none are."""
        try:
            made = json.loads(record_path(results, rule, wildcards or {}).read_text()).get("settings")
        except (OSError, ValueError, UnicodeDecodeError, AttributeError):
            return {}
        return made if isinstance(made, dict) else {}

    def _read(self, path: Path) -> dict | None:
        if path not in self._records:
            try:
                record = json.loads(path.read_text())
                self._records[path] = record if isinstance(record, dict) else None
            except (OSError, ValueError, UnicodeDecodeError):
                self._records[path] = None
        return self._records[path]

    def digest(self, relative: str) -> str | None:
        """The content digest of a file named as a record names it; None where it is missing."""
        if relative not in self._digests:
            path = _absolute(relative, self.results)
            stat, made = _stat(path), self._made.get(relative)
            if stat is None and not path.is_dir():
                self._digests[relative] = None
            elif isinstance(made, list) and len(made) == 3 and made[:2] == stat and stat[0] > SMALL_FILE_BYTES:
                self._digests[relative] = made[2]
            else:
                self._digests[relative] = file_digest(path)
                if isinstance(made, list) and len(made) == 3 and made[2] == self._digests[relative]:
                    self._redated[relative] = stat  # the same bytes at another date: note it (note_dates)
        return self._digests[relative]

    def note_dates(self) -> int:
        """Write into the records the new dates of outputs whose bytes this build found unchanged (a folder
        copied without its dates). Called once a run holds Snakemake's lock (onstart), after
        redate_future_files. The number of records written."""
        if not self._redated:
            return 0
        return _note_dates(self.results, lambda record, output, made, present: output in self._redated)

    def run_started(self) -> None:
        """onstart, once a run holds Snakemake's lock: files dated in the future are dated now
        (redate_future_files), then the new dates of outputs this build found unchanged are noted (note_dates)."""
        redate_future_files(self.results)
        self.note_dates()

    def run_ended(self) -> int:
        """onsuccess and onerror: the records this run's jobs wrote note the dates Snakemake gave their
        outputs after (note_touched_outputs). The number of records written."""
        return note_touched_outputs(self.results, self.since_ns)

    def is_current(self, rule: str, wildcards: dict, settings: dict) -> bool:
        """Whether the job's record holds `settings` and every input and output it names holds the content
        it recorded."""
        record = self._read(record_path(self.results, rule, wildcards))
        if record is None or canonical(record.get("settings")) != canonical(
            json.loads(json.dumps(settings, default=str))
        ):
            return False
        files = {**record.get("inputs", {}), **{path: made[-1] for path, made in record.get("outputs", {}).items()}}
        return all(self.digest(path) == digest for path, digest in files.items())

    def needs_rerun(self, rule: str, wildcards: dict, settings: dict, outputs) -> bool:
        """Whether a job whose outputs all exist must run again: its record is missing or not current. A
        job with a missing output runs anyway."""
        return all(os.path.exists(path) for path in outputs) and not self.is_current(rule, wildcards, settings)


def record_check(records: Records | None, workflow, rule: str):
    """An input function that every rule lists and that adds no file. Where a job's outputs all exist but
    its record is missing or not what the config and the inputs give now (Records.needs_rerun), the job is
    forced to run, and Snakemake reruns what is built from it, whatever the mtimes or the run history.
    `records`: None in a cluster job, which runs what it is sent; `workflow`: Snakemake's."""

    def check(wildcards):
        if records is None or workflow.dag is None:
            return []
        made_by = workflow.get_rule(rule)
        params = {key: value(wildcards) if callable(value) else value for key, value in made_by.params.items()}
        outputs = [apply_wildcards(str(pattern), wildcards) for pattern in made_by.output]
        if records.needs_rerun(rule, dict(wildcards.items()), params, outputs):
            # as --forcerun would: Snakemake 9's DAG reads forcefiles when it decides which jobs run, after
            # building them (requirements.txt pins it; tests/test_reliability.py's plans fail if that changes)
            workflow.dag.forcefiles.update(outputs)
        return []

    return check


def judge_by_content(workflow) -> None:
    """Let the records alone decide reruns where the run's --rerun-triggers leave out `mtime`
    (profiles/default). Snakemake 9 (requirements.txt pins 9.27.1) reruns a job whose input is dated after its
    oldest output, unless the working directory's .snakemake metadata holds that input's checksum, whatever
    the triggers say: a `cp -r` copy, a touched shard or a symlink to the same bytes reran the jobs built on
    them. Without `mtime`, an input's date is never newer (`_IOFile.is_newer`, its one use for inputs), and a
    changed byte is found by the records instead (record_check). A job that must run still reruns what is
    built from it (Snakemake's propagation reads no date). With `mtime` among the triggers, Snakemake's own
    judgement stands. The `code` trigger compares the scripts' dates with the outputs' through the same
    method, so it is left out with `mtime` (tests/test_reliability.py plans each case)."""
    from snakemake.io import _IOFile
    from snakemake.settings.enums import RerunTrigger

    dated = _IOFile.is_newer

    async def is_newer(self, time):
        return RerunTrigger.MTIME in workflow.rerun_triggers and await dated(self, time)

    _IOFile.is_newer = is_newer


def gguf_dropped_for(results) -> str | None:
    """The model.source whose model in `results` was made without config.yaml's carried-over GGUF file (the
    model job's record: model.gguf_file None), for uph.config.validate: only the first run on that folder
    warns that it drops it. None where `results` is no folder name (validation will say so)."""
    made = Records.settings_of(results, "model").get("model", {}) if isinstance(results, str) else {}
    return made.get("source") if isinstance(made, dict) and made.get("gguf_file", "") is None else None
