# Extract: final hidden states of every user token, one parquet shard per job; SVD basis of lm_head.


rule extract:
    input:
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        record=check_record("extract"),
    output:
        results("cache", "shard-{shard}.parquet"),
    log:
        results("logs", "extract-{shard}.log"),
    benchmark:
        results("benchmarks", "extract-{shard}.tsv")
    priority: LM_PRIORITY
    threads: extract_threads
    resources:
        mem_mb=8000,
        gpu=gpus("extract"),
    params:
        **SETTINGS["extract"],
    script:
        "../workflow_scripts/extract.py"


rule svd_basis:
    input:
        model=rules.model.output.identity,
        record=check_record("svd_basis"),
    output:
        results("basis", "svd.safetensors"),
    log:
        results("logs", "svd_basis.log"),
    benchmark:
        results("benchmarks", "svd_basis.tsv")
    priority: LM_PRIORITY
    params:
        **SETTINGS["svd_basis"],
    script:
        "../workflow_scripts/svd_basis.py"
