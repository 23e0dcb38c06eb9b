# Fit: theta for every user x head x alpha x d x solver of the sweep, evaluated held out, with the
# global control and the cross-user matrix. One job per (sweep point, shard); solvers share a job.
wildcard_constraints:
    head="|".join(FIT["heads"]),
    alpha=r"[0-9.e+-]+",
    d=r"\d+",
    shard=r"\d+",


rule fit:
    input:
        shard=results("cache", "shard-{shard}.parquet"),
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
    output:
        f"{SWEEP}/shard-{{shard}}.parquet",
    log:
        results("logs", "fit", "head~{head}-alpha~{alpha}-d~{d}-shard~{shard}.log"),
    benchmark:
        results("benchmarks", "fit-head~{head}-alpha~{alpha}-d~{d}-shard~{shard}.tsv")
    threads: 1
    resources:
        mem_mb=6000,
        gpu=gpus(),
    params:
        fit=FIT_SOLVERS,
        head=head_params,
        cache=CACHE_IDENTITY,
        device=config["device"],
    script:
        "../workflow_scripts/fit.py"


rule fit_global:
    input:
        shards=shard_paths(),
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
    output:
        f"{SWEEP}/global.parquet",
    log:
        results("logs", "fit", "head~{head}-alpha~{alpha}-d~{d}-global.log"),
    benchmark:
        results("benchmarks", "fit-head~{head}-alpha~{alpha}-d~{d}-global.tsv")
    threads: 1
    resources:
        mem_mb=12000,
        gpu=gpus(),
    params:
        fit=FIT_SOLVERS,
        head=head_params,
        cache=CACHE_IDENTITY,
        device=config["device"],
    script:
        "../workflow_scripts/fit_global.py"


rule cross_user:
    input:
        fits=expand(f"{SWEEP}/shard-{{shard}}.parquet", shard=range(config["extract"]["shards"]), allow_missing=True),
        shards=shard_paths(),
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
    output:
        f"{SWEEP}/cross_user.parquet",
    log:
        results("logs", "fit", "head~{head}-alpha~{alpha}-d~{d}-cross_user.log"),
    benchmark:
        results("benchmarks", "fit-head~{head}-alpha~{alpha}-d~{d}-cross_user.tsv")
    threads: 1
    resources:
        gpu=gpus(),
    params:
        solver=lambda wildcards: cross_user_solver(FIT, wildcards.head, wildcards.alpha, wildcards.d),
        head=head_params,
        cache=CACHE_IDENTITY,
        device=config["device"],
    script:
        "../workflow_scripts/fit_cross_user.py"


rule personalization_table:
    input:
        fits=[path for shard in range(config["extract"]["shards"]) for path in sweep_paths(f"shard-{shard}.parquet")],
        controls=sweep_paths("global.parquet"),
        cross_user=cross_user_paths(),
        model=rules.model.output.identity,
    output:
        personalization=report(
            results("tables", "personalization.csv"),
            caption="../report/personalization.rst",
            category="User prior heads",
        ),
        cross_user=report(
            results("tables", "cross_user.csv"), caption="../report/cross_user.rst", category="User prior heads"
        ),
    log:
        results("logs", "personalization_table.log"),
    benchmark:
        results("benchmarks", "personalization_table.tsv")
    params:
        bootstrap=FIT["bootstrap"],
    script:
        "../workflow_scripts/fit_tables.py"
