"""What each rule's outputs were made with: `<results>/settings/<rule>.json`, an input of the rule.

A job's outputs rest on its settings (its params, less the device: a device moves rounding only) as much
as on its input files, so the settings are an input file too. At DAG build, once the config has passed
its checks, each rule's file is rewritten where its content would change, and only there: it is then newer
than every output made with the old settings, and Snakemake's ordinary rule (an input newer than an output)
reruns exactly the jobs whose settings changed and what is built from them, for any target, with or
without run history: a results folder copied or restored elsewhere, a run interrupted and restarted with
another `fit.alphas`, a folder whose settings files were deleted (each is written anew, and everything
after it reruns). A file whose content is unchanged is never touched, so the same config has nothing to do.

A file changes with the outputs it vouches for: after the run (onsuccess, onerror), a rewritten file none
of whose rule's outputs was written since is put back as it was, text and mtime (a model candidate refused,
a run of one branch while another's settings changed), so that going back to the old config reruns
nothing. A run killed outright keeps the new file: the old config then reruns the rule, never too little.

A dry run (and every command that only plans: `plans_only`) writes nothing to the results folder: a
changed file goes to Snakemake's own folder (DRY_FOLDER), and the plan is made from it. Torch- and
pandas-free: the DAG build imports it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

FOLDER = "settings"  # under the results folder
DRY_FOLDER = Path(".snakemake") / "uph-dry-settings"  # under the working directory


def content(name: str, settings: dict, stale: int | None = None) -> str:
    """The file's text: the rule and its settings as JSON with sorted keys, so that the same settings in
    another key order are the same file; and when the rule's outputs were last marked `stale` (a time in
    ns): Snakemake reruns a job on a newer input only where the input's content changed since (its
    checksum, in the run history), so a mark must change the content."""
    made = {"rule": name, "settings": settings, **({"stale": stale} if stale is not None else {})}
    return json.dumps(made, indent=1, sort_keys=True) + "\n"


def _same(text: str | None, name: str, settings: dict) -> bool:
    """Whether a file's `text` holds rule `name`'s `settings` (whatever its stale mark)."""
    try:
        made = json.loads(text)
        return made["rule"] == name and made["settings"] == json.loads(json.dumps(settings))
    except (TypeError, ValueError, KeyError):
        return False


def read(results: str | Path, name: str) -> dict | None:
    """The settings `name`'s outputs in `results` were made with; None where there is no readable file."""
    try:
        return json.loads(_text(Path(results) / FOLDER / f"{name}.json"))["settings"]
    except (ValueError, KeyError, TypeError):  # no file (None), or not the JSON of one
        return None


@dataclass
class Rewrite:
    """A settings file about to change: its new text, and what it held before (text and mtime; None where
    there was no file), so that a run none of whose jobs used the new settings can put it back."""

    rule: str
    path: Path
    text: str
    before: str | None = None
    before_ns: int | None = None
    written_ns: int | None = None

    def write(self) -> None:
        _write(self.path, self.text)
        self.written_ns = self.path.stat().st_mtime_ns

    def restore(self, outputs: list[str]) -> bool:
        """Put the file back as it was where no file of `outputs` (those of the rule's jobs) was written
        since it changed: those outputs, or their absence, are the old settings'. Whether it did."""
        if self.written_ns is None or any(_mtime(output) >= self.written_ns for output in outputs):
            return False
        if self.before is None:
            self.path.unlink(missing_ok=True)
        else:
            _write(self.path, self.before)
            os.utime(self.path, ns=(self.before_ns, self.before_ns))
        return True


def _write(path: Path, text: str) -> None:
    from uph.io import atomic_path  # pandas: imported only where a file is written

    with atomic_path(path) as tmp:
        tmp.write_text(text)


def plan(
    results: str | Path, settings: dict[str, dict], stale: set[str], plans_only: bool, writes: bool = True
) -> tuple[dict[str, str], list[Rewrite]]:
    """Rule name -> the path of its settings file (its input), and the Rewrites to write before the DAG is
    built: each file whose settings differ from `settings[name]`, and each of `stale` (rules an input file
    of which is missing: written again with a new stale mark, newer than their outputs, so that any target
    rebuilds the file and them). Where the run `plans_only` (a dry run) a rewritten file is
    under DRY_FOLDER instead, named by the results folder. A cluster job's own parse of the Snakefile
    (`writes` false) takes the files the main process wrote."""
    paths, rewrites = {}, []
    shadow = DRY_FOLDER / hashlib.sha256(str(Path(results).absolute()).encode()).hexdigest()[:12]
    for name, values in settings.items():
        path = Path(results) / FOLDER / f"{name}.json"
        paths[name] = str(path)
        if not writes:
            continue
        before = _text(path)
        same = _same(before, name, values)
        if same and name not in stale:
            continue
        text = content(name, values, time.time_ns() if same else None)
        if plans_only:
            paths[name] = str(shadow / f"{name}.json")
            rewrites.append(Rewrite(name, shadow / f"{name}.json", text))
        else:
            rewrites.append(Rewrite(name, path, text, before, _mtime(path) if before is not None else None))
    return paths, rewrites


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _mtime(path: str | Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


# Snakemake's flags that build the DAG without running a job: dry runs, summaries, graphs, lint, reports, lists
PLANNING = re.compile(
    r"-[A-Za-z]*[nSDl][A-Za-z]*|--(dry|summary|detailed-summary|lint|dag|rulegraph|filegraph|d3dag|list|lt$|li$"
    r"|lp$|lu$|lc$|cm$|cleanup-metadata|delete-|containerize|archive|export-cwl|generate-unit-tests|print-compilation"
    r"|report$|report=).*"
)


def plans_only(argv: list[str] = sys.argv) -> bool:
    """Whether the Snakemake command line builds the DAG without running a job (-n, alone or among other
    one-letter flags, --dry-run or an abbreviation of it, --summary, --lint, --dag, ...: PLANNING).
    Snakemake sets its own dry-run flag only after the Snakefile is read."""
    return any(PLANNING.fullmatch(arg) for arg in argv[1:])
