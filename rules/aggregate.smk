# Aggregate: the study's figures and one-page summary from the tables and curves alone (no model,
# no cache, so `snakemake --forcerun aggregate` redraws them anywhere), then provenance.json.
from uph.report.catalog import FIGURES


rule aggregate:
    input:
        tables=table_targets(),
        copy_task_curves=rules.copy_task_table.input.curves,
        feedback_curves=rules.feedback_table.input.runs,
        record=check_record("aggregate"),
    output:
        png=[
            report(results("figures", f"{name}.png"), caption=f"../report/figures/{name}.rst", category=spec.category)
            for name, spec in FIGURES.items()
        ],
        pdf=[results("figures", f"{name}.pdf") for name in FIGURES],
        summary=report(results("summary.md"), caption="../report/summary.rst", category="Summary"),
        answers=report(results("answers.html"), caption="../report/answers.rst", category="Summary"),
    log:
        results("logs", "aggregate.log"),
    benchmark:
        results("benchmarks", "aggregate.tsv")
    threads: min(workflow.cores, len(FIGURES))  # a process a figure: the DAG's last computation, alone
    params:
        **SETTINGS["aggregate"],
    script:
        "../workflow_scripts/aggregate.py"


rule provenance:
    input:
        model=rules.model.output.identity,
        summary=rules.aggregate.output.summary,  # last: every other job's benchmark file is written
        record=check_record("provenance"),
    output:
        report(results("provenance.json"), caption="../report/provenance.rst", category="Provenance"),
    log:
        results("logs", "provenance.log"),
    benchmark:
        results("benchmarks", "provenance.tsv")
    params:
        **SETTINGS["provenance"],
        benchmarks=lambda wildcards: benchmark_patterns(),
    script:
        "../workflow_scripts/provenance.py"
