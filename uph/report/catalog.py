"""What the aggregate stage makes, by name: the contract tables and the figures with their titles,
paper sizes and report categories.

Light on purpose (no pandas, no matplotlib): the DAG build reads it (rules/aggregate.smk) to name
the aggregate rule's outputs. `uph.report.figures` holds one draw function per figure named here.
"""

from __future__ import annotations

from dataclasses import dataclass

TABLES = (  # results/tables/<name>.csv
    "personalization",
    "capacity",  # every validation curve of the personalization study, its choice marked
    "dose_response",
    "cross_user",
    "copy_task",
    "gram_resilience",
    "feedback",
    "attention",  # the attention study (issue 13): tests at each cell's chosen lr
    "attention_sweep",  # its lr sweeps
    "attention_curves",  # and its curves at the chosen lr
)

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
        "User prior heads",
    ),
    "capacity": FigureSpec(
        "Validation NLL against the ball's radius, every head and arm", (FULL_WIDTH, 2.6), "User prior heads"
    ),
    "dose_response": FigureSpec(
        "Personal gain beyond global against the user's train tokens", (FULL_WIDTH, 2.6), "User prior heads"
    ),
    "cross_user": FigureSpec("Cross-user matrix of residual thetas", (FULL_WIDTH, 6.2), "User prior heads"),
    "solver_gap": FigureSpec("Adam vs exact solver", (FULL_WIDTH, 2.6), "User prior heads"),
    "copy_task_curves": FigureSpec("Copy-task learning curves", (FULL_WIDTH, 2.6), "Copy task"),
    "copy_task_lengths": FigureSpec("Copy-task accuracy against evaluation length", (FULL_WIDTH, 2.6), "Copy task"),
    "gram_resilience": FigureSpec("Gram-score resilience", (COLUMN_WIDTH, 3.4), "Copy task"),
    "attention_offset_copy": FigureSpec("Variable-offset copy by attention kind", (FULL_WIDTH, 2.6), "Attention study"),
    "attention_loud_copy": FigureSpec("Loud-distractor copy by attention kind", (FULL_WIDTH, 2.6), "Attention study"),
    "attention_mqar": FigureSpec(
        "Multi-query associative recall by attention kind", (FULL_WIDTH, 2.6), "Attention study"
    ),
    "attention_dynamics": FigureSpec(
        "Attention score magnitude and gradient norm", (FULL_WIDTH, 4.2), "Attention study"
    ),
    "feedback": FigureSpec("Feedback loss and alignment over training", (FULL_WIDTH, 2.8), "Feedback"),
}
