# Attention study: one training job per (model, attention, task) runs the task's lr sweep
# and seeds (uph.attention.training); one table rule gathers them. Independent of the LM branch.
# A kind of attention.split_kinds sweeps its lrs in jobs of their own (attention_lr), which its
# attention_train job reads.


rule attention_lr:
    input:
        record=check_record("attention_lr"),
    output:
        curves=f"{ATTENTION_LR_JOB}/curves.parquet",
        sweep=f"{ATTENTION_LR_JOB}/sweep.parquet",
        weights=f"{ATTENTION_LR_JOB}/weights.safetensors",
    log:
        results("logs", "attention_lr", "model~{model}-attention~{attention}-task~{task}-lr~{lr}.log"),
    benchmark:
        results("benchmarks", "attention_lr-model~{model}-attention~{attention}-task~{task}-lr~{lr}.tsv")
    wildcard_constraints:
        model="|".join(ATTENTION["models"]),
        attention="|".join(ATTENTION["split_kinds"]),
        task="|".join(ATTENTION["tasks"]),
        lr="|".join(re.escape(str(lr)) for lr in ATTENTION["lrs"]),
    priority: SPLIT_KIND_PRIORITY
    threads: 1
    resources:
        gpu=gpus("attention"),
    params:
        **SETTINGS["attention_lr"],
    script:
        "../workflow_scripts/attention_lr.py"


rule attention_train:
    input:
        swept=attention_lr_jobs,
        record=check_record("attention_train"),
    output:
        curves=f"{ATTENTION_JOB}/curves.parquet",
        sweep=f"{ATTENTION_JOB}/sweep.parquet",
        evaluation=f"{ATTENTION_JOB}/eval.parquet",
    log:
        results("logs", "attention_train", "model~{model}-attention~{attention}-task~{task}.log"),
    benchmark:
        results("benchmarks", "attention_train-model~{model}-attention~{attention}-task~{task}.tsv")
    wildcard_constraints:
        model="|".join(ATTENTION["models"]),
        attention="|".join(ATTENTION["attentions"]),
        task="|".join(ATTENTION["tasks"]),
    priority: attention_priority
    threads: 1
    resources:
        gpu=gpus("attention"),
    params:
        # not the lists the wildcards pick: adding or dropping a task (model, kind) reruns no other job
        **SETTINGS["attention_train"],
    script:
        "../workflow_scripts/attention_train.py"


rule attention_table:
    input:
        evaluations=attention_runs("eval.parquet"),
        sweeps=attention_runs("sweep.parquet"),
        curves=attention_runs("curves.parquet"),
        record=check_record("attention_table"),
    output:
        **table_outputs("attention_table"),
    log:
        results("logs", "attention_table.log"),
    benchmark:
        results("benchmarks", "attention_table.tsv")
    script:
        "../workflow_scripts/attention_table.py"
