"""README.md says what the repository holds: its answers block is what the committed reference/default/ gives
(uph.report.readme: no number typed by hand, a stale block fails here), and every repository path it names,
in a code span or a link, exists. Outputs (results/ and the like) and URLs are not repository paths."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from uph import compare
from uph.report import readme
from uph.report.readme import BEGIN, END, answers_block, with_answers, write_readme_answers

README = REPO / "README.md"
FENCE = re.compile(r"```.*?```", re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
OUTPUT = re.compile(r"(results[\w-]*|\.venv|\.snakemake|gpu-check)(/|$)")  # what a run or `make setup` writes
ROOT_FILE = re.compile(r"(Snakefile|Makefile|[\w-]+\.(yaml|yml|toml|txt|py|md|cfg))$")  # a path without a /


def block(text: str) -> str:
    """The answers block of a README's text, markers included ('' where it has none)."""
    start, end = text.find(BEGIN), text.find(END)
    return text[start : end + len(END)] if 0 <= start < end else ""


def named_paths(text: str) -> list[str]:
    """The repository paths a README's text names: each word of a code span (outside fenced blocks, a
    `KEY=` before it dropped) that holds a /, a code span that is a root file's name alone (in a command,
    `my.yaml` is the reader's), and each link that is no URL, its anchor dropped; outputs, absolute paths
    and options left out. A <placeholder> reads as a glob."""
    text = FENCE.sub("", text)
    spans = SPAN.findall(text)
    words = [word.split("=", 1)[-1] for span in spans for word in span.split()]
    links = [target.partition("#")[0] for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]
    paths = [word for word in words if "/" in word] + [span for span in spans if ROOT_FILE.fullmatch(span)]
    paths += [link for link in links if link]
    return sorted(
        {
            re.sub(r"<[^>]+>", "*", path)
            for path in paths
            if not OUTPUT.match(path) and not path.startswith(("/", "-", "<", "~")) and "://" not in path
        }
    )


def missing(paths: list[str], root: Path = REPO) -> list[str]:
    """The paths (globs where they hold a *) that name no file or folder of files under `root`."""

    def holds_a_file(found: Path) -> bool:  # a folder git would not keep (an empty one) names nothing
        return found.is_file() or any(inner.is_file() for inner in found.rglob("*"))

    return [path for path in paths if not any(holds_a_file(found) for found in root.glob(path))]


def test_the_readme_answers_block_is_what_the_committed_reference_gives():
    """Regenerate: `python -m uph.report.readme` (or `make reference` of the default's run)."""
    text = README.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert block(text) == answers_block(REPO / "reference" / "default")


def test_a_stale_answers_block_is_caught(tmp_path):
    """A number changed in the README's block, or in the reference's answers.md, makes them differ; rewriting
    the README mends it, and a second rewrite changes nothing."""
    current = answers_block()
    assert "-1.21 (95 % CI -2.64 to +0.18)" in current  # the number the plants change
    stale_readme = README.read_text().replace("-1.21 (95 % CI", "-1.31 (95 % CI", 1)
    assert block(stale_readme) != current
    reference = tmp_path / "default"
    reference.mkdir()
    answers = (REPO / "reference" / "default" / "answers.md").read_text()
    (reference / "answers.md").write_text(answers.replace("| **not shown** |", "| **yes** |", 1))
    assert block(README.read_text()) != answers_block(reference)
    planted = tmp_path / "README.md"
    planted.write_text(stale_readme)
    assert write_readme_answers(planted) is True
    assert block(planted.read_text()) == current
    assert planted.read_text() == README.read_text()
    assert write_readme_answers(planted) is False


def test_a_readme_without_its_markers_is_refused():
    with pytest.raises(ValueError, match="answers:begin"):
        with_answers("# A README\n", answers_block())


def test_the_answers_block_is_short_and_keeps_each_answer():
    """One row per question of answers.md, in its order, with its answer and n; the number only where short."""
    rows = readme.answer_rows((REPO / "reference" / "default" / "answers.md").read_text())
    lines = answers_block().splitlines()[3:-1]
    assert len(lines) == len(rows) > 0
    for line, (question, answer, rests_on, n, _figure) in zip(lines, rows):
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        assert cells[0] == question and cells[1] == answer and cells[3] == n
        assert cells[2] == "–" or (len(cells[2]) <= readme.SHORT * 1.5 and cells[2].split()[0] in rests_on)


def test_making_the_default_reference_rewrites_the_readme_block(tmp_path, monkeypatch):
    """`make reference` (python -m uph.compare RESULTS --make-reference reference/default) writes answers.md
    from the run's tables and the README's block from it: from the committed run itself, the same block."""
    results = tmp_path / "results"
    source = REPO / "reference" / "default"
    shutil.copytree(source / "tables", results / "tables")
    for name in ("summary.md", "provenance.json"):
        shutil.copy(source / name, results)
    planted = tmp_path / "README.md"
    planted.write_text(README.read_text().replace("-1.21 (95 % CI", "-1.31 (95 % CI", 1))
    monkeypatch.setattr(compare, "REFERENCES", tmp_path / "reference")
    monkeypatch.setattr(readme, "README", planted)
    assert compare.main([str(results), "--make-reference", str(tmp_path / "reference" / "default")]) == 0
    assert (tmp_path / "reference" / "default" / "answers.md").read_text() == (source / "answers.md").read_text()
    assert planted.read_text() == README.read_text()
    other = tmp_path / "reference" / "other"
    before = planted.read_text().replace("-1.21 (95 % CI", "-1.31 (95 % CI", 1)
    planted.write_text(before)
    assert compare.main([str(results), "--make-reference", str(other)]) == 0
    assert planted.read_text() == before  # only the default's reference writes the README


def test_every_path_the_readme_names_exists():
    paths = named_paths(README.read_text())
    assert {"uph/tables.py", "config/full.yaml", ".ci/run", "docs/study.md", "profiles/slurm/config.v8+.yaml"} <= set(
        paths
    )
    assert missing(paths) == []


def test_a_readme_naming_a_missing_path_fails():
    text = (
        "The registry is `uph/report/tables.py`, the study [here](docs/nowhere.md#a-heading), the old profile "
        "`--profile profiles/local`; `make slurm CONFIG=config/missing.yaml`; `Nofile.yaml` at the root.\n"
        "Outputs and the rest are no repository paths: `results/answers.html`, `results-full/`, `<results>/records/`, "
        "`.venv/bin/snakemake --cores all`, `/shared/users.jsonl`, [docs](https://example.org/a/b.md), `uph.compare`, "
        "`.code.json`, `device: cuda`, `snakemake --configfile my.yaml`.\n"
        "These exist: `uph/tables.py`, `rules/*.smk`, `reference/<name>/answers.md`, [the study](docs/study.md).\n"
        "```sh\nmake slurm CONFIG=config/in-a-fence.yaml\n```\n"
    )
    paths = named_paths(text)
    assert missing(paths) == [
        "Nofile.yaml",
        "config/missing.yaml",
        "docs/nowhere.md",
        "profiles/local",
        "uph/report/tables.py",
    ]
    assert {"uph/tables.py", "rules/*.smk", "reference/*/answers.md", "docs/study.md"} <= set(paths)
