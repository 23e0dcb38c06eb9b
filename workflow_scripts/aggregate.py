"""Rule aggregate: every figure (PNG and PDF) and results/summary.md, from the tables and curves."""

from uph.io import atomic_path
from uph.logs import rule_logging
from uph.report.catalog import FIGURES, TABLES
from uph.report.figures import render, save
from uph.report.study import load_study
from uph.report.summary import summary_markdown

with rule_logging(snakemake) as log:
    study = load_study(
        dict(zip(TABLES, snakemake.input.tables)),
        snakemake.input.copy_task_curves,
        snakemake.input.feedback_curves,
        snakemake.params.copy_task_vocab,
    )
    for name, png, pdf in zip(FIGURES, snakemake.output.png, snakemake.output.pdf):
        save(render(name, study), png, pdf)
        log.info("figure %s: %s, %s", name, png, pdf)
    with atomic_path(snakemake.output.summary) as tmp:
        tmp.write_text(summary_markdown(study))
