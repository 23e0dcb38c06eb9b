# Fit: the personalization study on the cache. fit_global fits the global theta of every sweep point and
# solver on the pooled users; one fit job per shard fits each of its users' personal and residual thetas at
# every point (p0 computed once per user), the dose-response and the baselines; fit_others scores each
# user's text with the mean of the other users' residual thetas (the control a personal gain must beat);
# cross_user scores the residual thetas on every user's text at the listed points; the tables follow.
wildcard_constraints:
    head="|".join(FIT["heads"]),
    alpha=r"[0-9.e+-]+",
    d=r"\d+",
    shard=r"\d+",


rule fit_global:
    input:
        shards=shard_paths(),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
    output:
        results("fit", "global.parquet"),
    log:
        results("logs", "fit", "global.log"),
    benchmark:
        results("benchmarks", "fit-global.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        mem_mb=8000,
        gpu=gpus(),
    params:
        fit=FIT_GLOBAL,
        cache=CACHE_IDENTITY,
        device=config["device"],
    script:
        "../workflow_scripts/fit_global.py"


rule fit:
    input:
        global_fit=rules.fit_global.output[0],
        shard=results("cache", "shard-{shard}.parquet"),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
    output:
        fits=f"{FIT_SHARD}/fits.parquet",
        dose=f"{FIT_SHARD}/dose.parquet",
        baselines=f"{FIT_SHARD}/baselines.parquet",
    log:
        results("logs", "fit", "shard-{shard}.log"),
    benchmark:
        results("benchmarks", "fit-shard~{shard}.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        mem_mb=6000,
        gpu=gpus(),
    params:
        fit=FIT_USERS,
        cache=CACHE_IDENTITY,
        device=config["device"],
    script:
        "../workflow_scripts/fit.py"


rule cross_user:
    input:
        global_fit=rules.fit_global.output[0],
        fits=fit_shard_paths("fits.parquet"),
        shards=shard_paths(),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
    output:
        f"{SWEEP}/cross_user.parquet",
    log:
        results("logs", "fit", "head~{head}-alpha~{alpha}-d~{d}-cross_user.log"),
    benchmark:
        results("benchmarks", "fit-head~{head}-alpha~{alpha}-d~{d}-cross_user.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        gpu=gpus(),
    params:
        solver=lambda wildcards: cross_user_solver(FIT, wildcards.head, wildcards.alpha, wildcards.d),
        heads=FIT_HEADS,
        cache=CACHE_IDENTITY,
        device=config["device"],
    script:
        "../workflow_scripts/fit_cross_user.py"


rule fit_others:
    input:
        global_fit=rules.fit_global.output[0],
        fits=fit_shard_paths("fits.parquet"),
        shards=shard_paths(),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
    output:
        results("fit", "others.parquet"),
    log:
        results("logs", "fit", "others.log"),
    benchmark:
        results("benchmarks", "fit-others.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        gpu=gpus(),
    params:
        fit=FIT_SWEEP,
        cache=CACHE_IDENTITY,
        device=config["device"],
    script:
        "../workflow_scripts/fit_others.py"


rule personalization_table:
    input:
        global_fit=rules.fit_global.output[0],
        fits=fit_shard_paths("fits.parquet"),
        others=rules.fit_others.output[0],
        dose=fit_shard_paths("dose.parquet"),
        baselines=fit_shard_paths("baselines.parquet"),
        cross_user=cross_user_paths(),
        model=rules.model.output.identity,
    output:
        personalization=report(
            results("tables", "personalization.csv"),
            caption="../report/personalization.rst",
            category="User prior heads",
        ),
        dose_response=report(
            results("tables", "dose_response.csv"), caption="../report/dose_response.rst", category="User prior heads"
        ),
        cross_user=report(
            results("tables", "cross_user.csv"), caption="../report/cross_user.rst", category="User prior heads"
        ),
    log:
        results("logs", "personalization_table.log"),
    benchmark:
        results("benchmarks", "personalization_table.tsv")
    priority: LM_PRIORITY
    params:
        bootstrap=FIT["bootstrap"],
        max_norm=FIT["max_norm"],
    script:
        "../workflow_scripts/fit_tables.py"
