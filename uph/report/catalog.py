"""What the aggregate stage reads and makes, by name: the contract tables (TABLES: uph.tables,
one spec each) and the figures with their titles, paper sizes and report categories.

Light on purpose (no pandas, no matplotlib): the DAG build reads it (rules/aggregate.smk) to name
the aggregate rule's outputs. `uph.report.figures` holds one draw function per figure named here.
"""

from __future__ import annotations

from dataclasses import dataclass

from uph.tables import ATTENTION, COPY_TASK, FEEDBACK, LM, TABLES

__all__ = ["COLUMN_WIDTH", "FIGURES", "FULL_WIDTH", "TABLES", "FigureSpec"]  # TABLES: the tables it reads

FULL_WIDTH = 7.0  # inches: the text width of a two-column paper
COLUMN_WIDTH = 3.4


@dataclass(frozen=True)
class FigureSpec:
    title: str  # what it shows, for links to it
    size: tuple[float, float]  # inches
    category: str  # where the report files it


FIGURES = {
    "personalization": FigureSpec(
        "Held-out NLL change against parameters per user: global, personal, beyond global, own vs others",
        (FULL_WIDTH, 4.2),
        LM,
    ),
    "capacity": FigureSpec("Validation NLL against the ball's radius, every head and arm", (FULL_WIDTH, 2.6), LM),
    "dose_response": FigureSpec("Personal gain beyond global against the user's train tokens", (FULL_WIDTH, 2.6), LM),
    "cross_user": FigureSpec("Cross-user matrix of residual thetas", (FULL_WIDTH, 6.2), LM),
    "solver_gap": FigureSpec("Adam vs exact solver", (FULL_WIDTH, 2.6), LM),
    "copy_task_curves": FigureSpec("Copy-task learning curves", (FULL_WIDTH, 2.6), COPY_TASK),
    "copy_task_lengths": FigureSpec("Copy-task accuracy against evaluation length", (FULL_WIDTH, 2.6), COPY_TASK),
    "gram_resilience": FigureSpec("Gram-score resilience", (COLUMN_WIDTH, 3.4), COPY_TASK),
    "attention_offset_copy": FigureSpec("Variable-offset copy by attention kind", (FULL_WIDTH, 2.6), ATTENTION),
    "attention_loud_copy": FigureSpec("Loud-distractor copy by attention kind", (FULL_WIDTH, 2.6), ATTENTION),
    "attention_mqar": FigureSpec("Multi-query associative recall by attention kind", (FULL_WIDTH, 2.6), ATTENTION),
    "attention_dynamics": FigureSpec("Attention score magnitude and gradient norm", (FULL_WIDTH, 4.2), ATTENTION),
    "feedback": FigureSpec("Feedback loss and alignment over training", (FULL_WIDTH, 2.8), FEEDBACK),
}
