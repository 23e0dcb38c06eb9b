"""Rule aggregate: every figure (PNG and PDF), results/summary.md and the answers table as HTML for the
report, from the tables and curves (torch-free: tests/test_aggregate.py runs it with torch unimportable)."""

import uph.job_start
from uph.io import atomic_path
from uph.logs import rule_logging
from uph.report.answers import answers, answers_html
from uph.report.catalog import FIGURES, TABLES
from uph.report.figures import save_all
from uph.report.study import load_study
from uph.report.summary import summary_markdown

with rule_logging(snakemake) as log:
    study = load_study(
        dict(zip(TABLES, snakemake.input.tables)),
        snakemake.input.copy_task_curves,
        snakemake.input.feedback_curves,
        snakemake.params.copy_task_vocab,
    )
    paths = dict(zip(FIGURES, zip(snakemake.output.png, snakemake.output.pdf)))
    for name in save_all(study, paths, processes=snakemake.threads):
        log.info("figure %s: %s, %s", name, *paths[name])
    rows = answers(study)
    with atomic_path(snakemake.output.summary) as tmp:
        tmp.write_text(summary_markdown(study, rows))
    with atomic_path(snakemake.output.answers) as tmp:
        tmp.write_text(answers_html(rows))
