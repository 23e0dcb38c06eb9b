"""The study's tables, one spec each: which rule writes it and with which script, where the report files
it, and how `make compare` holds it to a reference.

Every list of tables is read from TABLES: the targets of `rule all` and each table rule's outputs
(rules/common.smk: table_targets, table_outputs), the aggregate stage's inputs (rules/aggregate.smk,
uph.report.catalog) and the fields of the study it reads (uph.report.study.Study), the report's captions
(report/<name>.rst) and the comparison (uph.compare).
tests/test_tables_registry.py checks it against the rules, the captions and compare.

How to add a table:

1. Add its TableSpec below: its name (results/tables/<name>.csv), the rule and script that write it,
   its branch of the study, and how compare reads it (a Comparison: its key columns, the kind of each
   other column).
2. Write the script in workflow_scripts/: `uph.io.write_table(table, snakemake.output.<output>)`.
3. Add the rule, or the spec to an existing rule (a rule may write several tables): its outputs are
   `**table_outputs("<rule>")`, every table whose spec names that rule. A new rule lists
   `record=check_record("<rule>")` among its inputs, as every rule does.
4. Where `report` is True, write its caption, report/<name>.rst.
5. Read it in the figures, summary or answers as `study.<name>`: uph.report.study.Study has a field
   per spec, made from TABLES.

Light on purpose (no pandas, no matplotlib): the DAG build reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The report's categories, one per branch of the study (the figures of uph.report.catalog use them too)
LM, COPY_TASK, ATTENTION, FEEDBACK = "User prior heads", "Copy task", "Attention study", "Feedback"

POINT = ("model", "head", "alpha", "d", "solver")  # the key columns of a sweep point in the LM tables


@dataclass(frozen=True)
class Comparison:
    """How `make compare` (uph.compare) holds a table to its reference. `kind`: "lm" (float32 NLLs
    within a tolerance of the table's NLL scale), "seeded" (seed means against a margin,
    uph.seeded_comparison), "exact" (within float32 rounding) or "summarized" (not row by row: `why`).
    `keys` name a row (over `seed` for seeded tables), `cell` the training cell a seeded row belongs to
    (its choice of lr), `runs` the keys of one training run where its rows (test lengths, levels) are
    several; the other tuples name columns by kind."""

    kind: str
    keys: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    counts: tuple[str, ...] = ()  # users counted: within one user
    exact: tuple[str, ...] = ()
    norms: tuple[str, ...] = ()
    certificates: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()  # seeded: compared over seeds
    cell: tuple[str, ...] = ()
    runs: tuple[str, ...] = ()  # seeded: the keys naming one training run (with its seed), whose rows are averaged
    timings: tuple[str, ...] = ()  # wall-clock columns: a measure of the machine, never compared
    skipped: dict = field(default_factory=dict)  # column -> why it is not compared
    why: str = ""  # summarized: why its rows are not compared one by one


@dataclass(frozen=True)
class TableSpec:
    """One table, results/tables/<name>.csv with its companions (uph.io.write_table)."""

    name: str  # results/tables/<name>.csv
    rule: str  # the rule that writes it
    script: str  # the rule's script, under workflow_scripts/
    branch: str  # the study's branch, its category in the report
    compared: Comparison  # how make compare reads it
    output: str = "csv"  # the CSV's name among its rule's outputs (its companions: <output>_md, ...)
    report: bool = True  # in Snakemake's report, captioned by report/<name>.rst

    @property
    def caption(self) -> str | None:
        """The report caption's path, relative to the repository; None where it is not in the report."""
        return f"report/{self.name}.rst" if self.report else None


SIGN_TEST = {"sign_test_p": "a function of the users improved, compared as a count"}
NEVER_THERE = "NaN where a seed never got there"

TABLES = {  # name -> spec, in the order the summary lists them
    spec.name: spec
    for spec in (
        TableSpec(
            "personalization",
            "personalization_table",
            "fit_tables.py",
            LM,
            Comparison(
                "lm",
                (*POINT, "control", "reference"),
                choices=("capacity", "temperature", "at_edge"),
                counts=("n_users_improved", "frac_users_improved", "frac_on_ball"),
                exact=("n_users", "params_per_user"),
                norms=("sum_theta_norm",),
                certificates=("fit_certificate_max",),
                skipped=SIGN_TEST,
            ),
            output="personalization",
        ),
        TableSpec(  # every validation curve of the personalization study, its choice marked
            "capacity",
            "personalization_table",
            "fit_tables.py",
            LM,
            Comparison(
                "lm",
                (*POINT, "arm", "train_tokens", "temperature", "capacity"),
                choices=("chosen", "at_edge"),
                counts=("frac_on_ball",),
                exact=("n_users",),
            ),
            output="capacity",
        ),
        TableSpec(
            "dose_response",
            "personalization_table",
            "fit_tables.py",
            LM,
            Comparison(
                "lm",
                (*POINT, "train_tokens"),
                choices=("radius", "at_edge"),
                counts=("n_users_improved", "frac_users_improved"),
                exact=("n_users", "all_train_tokens"),
                skipped=SIGN_TEST,
            ),
            output="dose_response",
        ),
        TableSpec(
            "cross_user",
            "personalization_table",
            "fit_tables.py",
            LM,
            Comparison("lm", (*POINT, "theta_user", "text_user")),
            output="cross_user",
        ),
        TableSpec(
            "copy_task",
            "copy_task_table",
            "copy_task_table.py",
            COPY_TASK,
            Comparison(
                "seeded",
                ("attention", "train_len", "eval_len"),
                metrics=("final_loss", "token_acc", "seq_acc"),
                cell=("attention",),
                runs=("attention",),
            ),
        ),
        TableSpec(
            "gram_resilience",
            "gram_resilience",
            "copy_task_resilience.py",
            COPY_TASK,
            Comparison("exact", ("magnitude", "dot")),
        ),
        TableSpec(
            "feedback",
            "feedback_table",
            "feedback_table.py",
            FEEDBACK,
            Comparison(
                "seeded",
                ("method", "signal", "needs_backward", "forward_passes_per_step"),
                exact=("steps",),
                metrics=("final_loss", "final_acc", "mean_alignment", "final_alignment", "final_train_loss"),
                cell=("method",),
                timings=("seconds_per_step",),
            ),
        ),
        TableSpec(  # the attention study: tests at each cell's chosen lr
            "attention",
            "attention_table",
            "attention_table.py",
            ATTENTION,
            Comparison(
                "seeded",
                ("task", "model", "attention", "train_len", "eval_len", "level"),
                choices=("lr",),
                exact=("family", "loudness_invariant", "lr_at_edge"),
                metrics=("token_acc", "seq_acc", "loss", "val_token_acc", "diverged", "steps_run", "best_step"),
                cell=("task", "model", "attention"),
                runs=("task", "model", "attention"),
                skipped={
                    "steps_to_90": f"{NEVER_THERE}: its seeds' steps_run and accuracy are compared",
                    "steps_to_99": f"{NEVER_THERE}: its seeds' steps_run and accuracy are compared",
                    "at_step_limit": "named by seed in the summary; its seeds' steps_run are compared",
                },
            ),
        ),
        TableSpec(  # its lr sweeps
            "attention_sweep",
            "attention_table",
            "attention_table.py",
            ATTENTION,
            Comparison(
                "seeded",
                ("task", "model", "attention", "lr"),
                exact=("chosen", "extended", "lr_at_edge"),
                metrics=("val_token_acc", "val_loss", "diverged", "steps_run"),
                cell=("task", "model", "attention"),
                skipped={
                    "best_step": "its seeds' steps_run are compared",
                    "steps_to_90": NEVER_THERE,
                    "steps_to_99": NEVER_THERE,
                    "at_step_limit": "its seeds' steps_run are compared",
                },
            ),
            output="sweep",
            report=False,
        ),
        TableSpec(  # and its curves at the chosen lr
            "attention_curves",
            "attention_table",
            "attention_table.py",
            ATTENTION,
            Comparison(
                "summarized",
                why="training curves of runs that diverge across CPUs: their summaries are in attention",
            ),
            output="curves",
            report=False,
        ),
    )
}
