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
