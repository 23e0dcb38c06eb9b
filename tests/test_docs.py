"""The documentation reads as a document: README.md is the front door (at most 200 lines), README.md and
docs/*.md hold no diary (who worked when, on which lent machine, in which session, under which work item, at
which local path), and every relative link in them names a file that exists, and a heading where it names one."""

import re
from pathlib import Path

import pytest
from conftest import REPO

README_MAX_LINES = 200
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DIARY = {  # pattern -> what it is
    r"\bthis VM\b": "a machine of one session",
    r"\b(this|last|previous|next|that) session\b": "a session of work",
    r"\bissues? \d+": "a work item's number",
    r"\b(lent|lend|lends|lending)\b|\bthe lend\b": "a machine lent for a while",
    r"\bnot drawn\b|\bcan_start_another\b": "the lending tool's words",
    r"\bI (measured|ran|found|tried|stopped|timed)\b": "who did it",
    r"\b(other|another) engineers?'?s?\b": "who else used the machine",
    r"\btoday\b|\byesterday\b|\bon a (faster|slower) day\b": "a day of the work",
    r"(?<![\w.])/(work|tmp)/": "a path on one machine",
}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def page_id(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # a `#` in a code block is no heading
    return {slug(match) for match in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def test_the_readme_is_at_most_200_lines():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move the detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_diary_in_the_docs(page):
    found = [
        f"{page_id(page)}:{number}: {what}: {line.strip()}"
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for pattern, what in DIARY.items()
        if re.search(pattern, line, re.IGNORECASE)
    ]
    assert found == []


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_names_a_file_that_exists(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading '{anchor}' in {linked.name}")
    assert broken == [], page_id(page)


def test_the_patterns_catch_what_they_are_for():
    """Each diary pattern flags its kind of text and passes the ordinary text beside it."""
    diary = [
        "measured on this VM",
        "in the last session",
        "issue 47's budget",
        "no GPU was lent",
        "I measured 12 s",
        "another engineer's test run",
        "on a faster day",
        "see /work/main/results",
        "copied to /tmp/x",
    ]
    ordinary = [
        "the CPU path on this machine",
        "a GPU slot",
        "the lenient rule",
        "results/tables/attention.csv",
        "a known issue of the kernel",
        "`.venv/bin/snakemake`",
        "tmpdir=/tmp",
    ]
    flagged = [text for text in diary if any(re.search(p, text, re.IGNORECASE) for p in DIARY)]
    passed = [text for text in ordinary if not any(re.search(p, text, re.IGNORECASE) for p in DIARY)]
    assert flagged == diary and passed == ordinary
    assert slug("On SLURM, in one command") == "on-slurm-in-one-command"
    assert slug("`config/full.yaml` run to the end") == "configfullyaml-run-to-the-end"


CODE_DIARY = [  # DIARY's patterns that read as diary in code too (code names /tmp, lends memory, draws figures)
    r"\bthis VM\b",
    r"\b(this|last|previous|next|that) session\b",
    r"\bissues? \d+",
    r"\blent (a |the )?(GPU|machine|device)|\b(GPU|machine|device) (was )?lent\b",
    r"\bI (measured|ran|found|tried|stopped|timed)\b",
]
CODE = [  # every tracked text file a reader of the code reads, less the data of measurements and references
    path
    for pattern in ("Snakefile", "Makefile", "*.yaml", "rules/*.smk", "report/*.rst", "schemas/*.yaml", "profiles/*/*")
    for path in sorted(REPO.glob(pattern))
] + [
    path
    for folder in ("uph", "workflow_scripts", "tests", "benchmarks", "config")
    for path in sorted((REPO / folder).rglob("*"))
    if path.suffix in (".py", ".sh", ".yaml") and "measured" not in path.parts and path.name != "test_docs.py"
]


def test_no_diary_in_the_code():
    """Comments and docstrings say what the code does and why, not who changed it under which work item."""
    assert len(CODE) > 100
    found = [
        f"{page_id(path)}:{number}: {line.strip()}"
        for path in CODE
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for pattern in CODE_DIARY
        if re.search(pattern, line, re.IGNORECASE)
    ]
    assert found == []


PERFORMANCE = REPO / "docs" / "performance.md"
CPUS = ("AMD EPYC", "Intel Xeon", "H100", "H200")  # the CPU (or GPU) names a measured figure may name
COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")  # a sha (a digit in it: no hex word), or a link to one
FIGURE = re.compile(  # a number with a unit of time, rate, size or ratio, or a decimal fraction (a version is none)
    r"(?<![\w.,])\d[\d,]*(?:\.\d+)?(?:x\b|\s?%|\s(?:s|ms|us|min|h|GB|MB|GiB|MiB|tok/s|GFLOP/s|TFLOP|MFLOP"
    r"|CPU-s|CPU-seconds|job-seconds|CPU-hours|seconds|minutes)\b)|(?<![\w.])\d+\.\d+(?![\w.])"
)
BARE_NUMBER = re.compile(r"^\**(?:about )?\d[\d,]*(?:\.\d+)?\**$")  # a cell that is a number alone


def tables(markdown: str) -> list[tuple[str, list[str]]]:
    """Each markdown table as (its caption, its body rows). The caption is the paragraph just above the table
    (the block before its blank line); a heading or another table there is none."""
    found, above = [], []
    for block in (block.splitlines() for block in re.split(r"\n\s*\n", markdown)):
        if len(block) > 1 and block[0].startswith("|") and re.fullmatch(r"\|[\s:|-]+", block[1]):
            caption = "" if above[:1] and above[0].startswith(("|", "#")) else " ".join(above)
            found.append((caption, [row for row in block[2:] if row.startswith("|")]))
        above = block
    return found


def holds_a_figure(row: str) -> bool:
    cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
    return any(FIGURE.search(cell) or BARE_NUMBER.match(cell) for cell in cells)


def unsourced_rows(markdown: str) -> list[str]:
    """The table rows holding a measured figure whose row and caption together name no commit or no CPU."""
    return [
        row
        for caption, rows in tables(markdown)
        for row in rows
        if holds_a_figure(row) and not (COMMIT.search(row + caption) and any(cpu in row + caption for cpu in CPUS))
    ]


def test_every_figure_in_performance_names_its_commit_and_cpu():
    """docs/performance.md's contract: each measured figure in a table names the commit and the CPU it was
    measured at, in its row or in the paragraph just above its table."""
    assert len(tables(PERFORMANCE.read_text())) > 10
    assert unsourced_rows(PERFORMANCE.read_text()) == []


def test_a_figure_without_its_commit_or_cpu_is_caught():
    """The check fails on a planted row with no commit and one with no CPU, names them, and passes the rest."""
    planted = """Measured on the AMD EPYC, 2 cores.

| command | figure |
| --- | --- |
| `make test`, commit 13a7cf4 | 550 s |
| `make test-fast` | 275 s |

| command | machine | figure |
| --- | --- | --- |
| `benchmarks/bench_fit.py` | Intel Xeon (AMX), commit f6a4ea6 | 1.5 s |
| `snakemake --report` | 2 cores, commit 1a1159b | 4 s |
| `make test` | 16 cores | not measured |

| name | CPU | torch |
| --- | --- | --- |
| H100 machine | NVIDIA H100 80GB HBM3 and 16 CPU cores | 2.11.0 |
"""
    assert unsourced_rows(planted) == [
        "| `make test-fast` | 275 s |",
        "| `snakemake --report` | 2 cores, commit 1a1159b | 4 s |",
    ]
    assert holds_a_figure("| 64 | 24 min (1,435 s) |") and holds_a_figure("| test_fit.py | 46 | 3 |")
    assert holds_a_figure("| a ratio | capped / native: extract 0.97, validate 1.045 |")
    assert not holds_a_figure("| AMD EPYC, 2 cores | AMD EPYC (Zen 4: AVX512) | 2.13.0+cpu |")
