# Extract: final hidden states of every user token, one parquet shard per job; SVD basis of lm_head.


rule extract:
    input:
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
    output:
        results("cache", "shard-{shard}.parquet"),
    params:
        extract=job_params(config["extract"]),
        device=config["device"],
    threads: workflow.cores
    resources:
        mem_mb=8000,
        gpu=gpus(),
    log:
        results("logs", "extract-{shard}.log"),
    benchmark:
        results("benchmarks", "extract-{shard}.tsv")
    script:
        "../workflow_scripts/extract.py"


rule svd_basis:
    input:
        model=rules.model.output.identity,
    output:
        results("basis", "svd.safetensors"),
    params:
        rank=max(config["fit"]["ds"]),
    log:
        results("logs", "svd_basis.log"),
    benchmark:
        results("benchmarks", "svd_basis.tsv")
    script:
        "../workflow_scripts/svd_basis.py"
