# Feedback: a character MLP language model on the corpus text, trained with backprop, direct
# feedback alignment and factored feedback (seed 003: frozen U, U learned from node perturbation,
# U learned from the true gradient as an oracle); one job per method, its seeds one after another
# (each seed's run as it would be alone: uph.feedback.training.train_seeds), then the table.


rule feedback_train:
    input:
        roles=rules.corpus_roles.output[0],
        record=check_record("feedback_train"),
    output:
        results("feedback", "method~{method}", "curves.parquet"),  # every seed's curves
    log:
        results("logs", "feedback_train-method~{method}.log"),
    benchmark:
        results("benchmarks", "feedback_train-method~{method}.tsv")
    wildcard_constraints:
        method="|".join(config["feedback"]["methods"]),
    threads: 1
    resources:
        gpu=gpus("feedback"),
    params:  # the seeds among them (uph.config.FEEDBACK_COMMON_KEYS): a changed list reruns every method's job
        feedback=lambda wildcards: SETTINGS[f"feedback_train-{wildcards.method}"]["feedback"],
    script:
        "../workflow_scripts/feedback_train.py"


rule feedback_table:
    input:
        runs=expand(rules.feedback_train.output[0], method=config["feedback"]["methods"]),
        record=check_record("feedback_table"),
    output:
        **table_outputs("feedback_table"),
    log:
        results("logs", "feedback_table.log"),
    benchmark:
        results("benchmarks", "feedback_table.tsv")
    script:
        "../workflow_scripts/feedback_table.py"
