"""The README's answers block: the default study's answers, one short row each, written from the committed
reference's answers.md (uph.compare.write_answers), so that no number in the README is typed by hand.

The block lies between the lines BEGIN and END of README.md. `make reference` (NAME=default) rewrites it;
`python -m uph.report.readme` rewrites it from the committed reference/default/ alone, and
tests/test_readme.py fails while it differs from what the reference gives.

A row is the question, its answer, the number it rests on where that is short, and n. The number is the
answers table's "rests on" text where it is at most SHORT characters; else its first difference with its
interval and unit (at the start or after a colon); else its words before ", at " (the sweep point) where
those are short; else a dash, and answers.md, linked above the block, holds it.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DEFAULT = REPO / "reference" / "default"
BEGIN, END = "<!-- answers:begin -->", "<!-- answers:end -->"
SHORT = 70
_CELL = re.compile(r"(?<!\\)\|")  # a cell border: a | that uph.report.answers._cell did not escape
_NUMBER = re.compile(r"(?:^|: )([+-]?\d[\d.]*(?: \([^)]*\))?(?: × 10⁻³)? (?:nats/token|nats/character|token accuracy))")


def answer_rows(answers_md: str) -> list[list[str]]:
    """The rows of an answers.md table (question, answer, rests on, n, figure), cells unescaped."""
    rows = []
    for line in answers_md.splitlines():
        if line.startswith("|") and not line.startswith(("| question |", "| --- |")):
            rows.append([cell.strip().replace("\\|", "|") for cell in _CELL.split(line)[1:-1]])
    return rows


def short_number(rests_on: str) -> str:
    """What an answer rests on, where short (module docstring); else a dash."""
    if len(rests_on) <= SHORT:
        return rests_on
    found = _NUMBER.search(rests_on)
    if found:
        return found.group(1)
    clause = rests_on.split(", at ")[0]
    return clause if len(clause) <= SHORT else "–"


def answers_block(reference: Path = DEFAULT) -> str:
    """The README's block, markers included, from `reference`/answers.md."""
    rows = answer_rows((reference / "answers.md").read_text())
    if not rows:
        raise ValueError(f"{reference / 'answers.md'}: no answers table")
    lines = [BEGIN, "| question | answer | rests on | n |", "| --- | --- | --- | --- |"]
    for question, answer, rests_on, n, *_ in rows:
        cells = (question, answer, short_number(rests_on), n)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join([*lines, END])


def with_answers(readme: str, block: str) -> str:
    """`readme` with the text from its BEGIN line to its END line replaced by `block`."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README: no '{BEGIN}' line followed by an '{END}' line")
    return readme[:start] + block + readme[end + len(END) :]


def write_readme_answers(readme: Path = README, reference: Path = DEFAULT) -> bool:
    """Rewrite `readme`'s answers block from `reference`; True where it changed."""
    old = readme.read_text()
    new = with_answers(old, answers_block(reference))
    if new != old:
        readme.write_text(new)
    return new != old


if __name__ == "__main__":
    changed = write_readme_answers()
    print(f"readme: {README.name}'s answers block {'rewritten' if changed else 'unchanged'} from {DEFAULT.name}")
