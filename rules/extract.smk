# Extract: final hidden states of every user token, one parquet shard per job; SVD basis of lm_head.


rule extract:
    input:
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
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
        extract=job_settings(config["extract"]),
        device=job_device("extract"),
    script:
        "../workflow_scripts/extract.py"


rule svd_basis:
    input:
        model=rules.model.output.identity,
    output:
        results("basis", "svd.safetensors"),
    log:
        results("logs", "svd_basis.log"),
    benchmark:
        results("benchmarks", "svd_basis.tsv")
    priority: LM_PRIORITY
    params:
        rank=max(d for _, _, d in sweep_points(config["fit"])),
    script:
        "../workflow_scripts/svd_basis.py"
