# Copy task (seed 004): one training job per (attention, seed), the copy-task table over them,
# and the Gram resilience table. Independent of the LM branch: no model, no corpus.


rule copy_task_train:
    input:
        record=check_record("copy_task_train"),
    output:
        curves=f"{COPY_TASK_JOB}/curves.parquet",
        evaluation=f"{COPY_TASK_JOB}/eval.parquet",
    log:
        results("logs", "copy_task_train", "attention~{attention}-seed~{seed}.log"),
    benchmark:
        results("benchmarks", "copy_task_train-attention~{attention}-seed~{seed}.tsv")
    wildcard_constraints:
        attention="|".join(COPY_TASK["attentions"]),
        seed=r"\d+",
    threads: 1
    resources:
        gpu=gpus("copy_task"),
    params:
        **SETTINGS["copy_task_train"],
    script:
        "../workflow_scripts/copy_task_train.py"


rule copy_task_table:
    input:
        evaluations=copy_task_runs("eval.parquet"),
        curves=copy_task_runs("curves.parquet"),
        record=check_record("copy_task_table"),
    output:
        **table_outputs("copy_task_table"),
    log:
        results("logs", "copy_task_table.log"),
    benchmark:
        results("benchmarks", "copy_task_table.tsv")
    script:
        "../workflow_scripts/copy_task_table.py"


rule gram_resilience:
    input:
        record=check_record("gram_resilience"),
    output:
        **table_outputs("gram_resilience"),
    log:
        results("logs", "gram_resilience.log"),
    benchmark:
        results("benchmarks", "gram_resilience.tsv")
    script:
        "../workflow_scripts/copy_task_resilience.py"
