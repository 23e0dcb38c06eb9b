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
    write_settings()  # once the config passed every check: a refused config never touches them

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

    note_interrupts()

    # A settings file this run rewrote that no job used is put back (uph.stage_settings); Ctrl-C exits 130.
    onsuccess:
        finished(failed=False)

    onerror:
        finished(failed=True)

    rule all:
        default_target: True
        input:
            all_targets(),
            intermediate_targets(),
            companion_targets(),
