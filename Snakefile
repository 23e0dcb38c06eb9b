# UPH benchmark suite. Stages: corpus -> model -> extract -> svd -> fit -> tables (LM branch);
# copy task and feedback run beside it; aggregate draws the figures, summary and provenance from
# the tables. `snakemake --cores all` runs everything on config.yaml.
import sys

from snakemake.utils import min_version

min_version("9.0")  # the executor plugins and report syntax used here (requirements.txt pins 9.27.1)


configfile: f"{workflow.basedir}/config.yaml"  # the embedded default; --configfile overrides it


report: "report/workflow.rst"  # front page of `snakemake --report`


# `--unlock` needs no rules: it works whatever the config or the results folder hold.
if "--unlock" not in sys.argv:
    from uph.interrupts import exit_status, noting, quiet_while_building

    quiet_while_building(workflow)  # Ctrl-C before Snakemake's lock: one line, exit 130

    include: "rules/common.smk"
    include: "rules/corpus.smk"
    include: "rules/model.smk"
    include: "rules/extract.smk"
    include: "rules/fit.smk"
    include: "rules/copy_task.smk"
    include: "rules/attention.smk"
    include: "rules/feedback.smk"
    include: "rules/aggregate.smk"

    check_results()

    # Seconds-long jobs (tables read small, the model install moves a folder): on a cluster they run beside
    # Snakemake, not in the queue.
    localrules:
        all,
        model,
        capacity,
        headline_point,
        personalization_table,
        copy_task_table,
        attention_table,
        feedback_table,
        aggregate,
        provenance,

    # Once Snakemake holds its lock: one run at a time on the results folder, from any working directory
    # (uph.config.hold_results_folder); Ctrl-C stops the jobs and the run exits 130 (uph.interrupts); files
    # dated in the future (a copy from a clock running ahead) are dated now, or every job reading one fails;
    # the records note the new dates of unchanged outputs, so the next DAG build need not read them again.
    onstart:
        hold_results()
        noting(workflow)
        RECORDS.run_started()

    # When the run ends: the records note the dates Snakemake gave the outputs after the jobs wrote them.
    onsuccess:
        RECORDS.run_ended()
        exit_status(failed=False)

    onerror:
        RECORDS.run_ended()
        exit_status(failed=True)

    rule all:
        default_target: True
        input:
            all_targets(),
            intermediate_targets(),
            companion_targets(),
