# Fit: the personalization study on the cache, every method at its capacity chosen on validation
# (uph.lm.capacity). fit_global walks the global theta's path of radii on the pooled users' fit parts,
# chooses on their validation parts and refits; one validate job per shard walks its users' personal and
# residual paths (p0 computed once per user); capacity chooses every arm's radius (and unigram lambda)
# from all of them; one fit job per shard refits each arm at its choice on all train tokens and scores it
# on test; fit_others scores each user's text with the mean of the other users' residual thetas (the
# control a personal gain must beat); cross_user scores the residual thetas on every user's text at the
# listed points (fit.cross_user), cross_user_headline at the point the summary reports (the best own against
# others, picked from the fits and that control); the tables follow.
wildcard_constraints:
    head="|".join(sorted({head for head, _, _ in sweep_points(FIT)})),
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
        thetas=results("fit", "global.parquet"),
        validation=results("fit", "global-validation.parquet"),
        unigram=results("fit", "unigram.parquet"),
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


rule validate:
    input:
        global_fit=rules.fit_global.output.thetas,
        unigram=rules.fit_global.output.unigram,
        shard=results("cache", "shard-{shard}.parquet"),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
    output:
        f"{FIT_SHARD}/validation.parquet",
    log:
        results("logs", "fit", "validate-shard-{shard}.log"),
    benchmark:
        results("benchmarks", "fit-validate-shard~{shard}.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        mem_mb=6000,
        gpu=gpus(),
    params:
        fit=FIT_VALIDATE,
        cache=CACHE_IDENTITY,
        device=config["device"],
    script:
        "../workflow_scripts/fit_validate.py"


rule capacity:
    input:
        global_validation=rules.fit_global.output.validation,
        validation=fit_shard_paths("validation.parquet"),
        model=rules.model.output.identity,
    output:
        results("fit", "capacity.parquet"),
    log:
        results("logs", "fit", "capacity.log"),
    priority: LM_PRIORITY
    params:
        fit=FIT_SWEEP,
        cache=CACHE_IDENTITY,
    script:
        "../workflow_scripts/fit_capacity.py"


rule fit:
    input:
        global_fit=rules.fit_global.output.thetas,
        unigram=rules.fit_global.output.unigram,
        capacity=rules.capacity.output[0],
        shard=results("cache", "shard-{shard}.parquet"),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
    output:
        fits=f"{FIT_SHARD}/fits.parquet",
        dose=f"{FIT_SHARD}/dose.parquet",
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
        global_fit=rules.fit_global.output.thetas,
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
        global_fit=rules.fit_global.output.thetas,
        unigram=rules.fit_global.output.unigram,
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
        fit=FIT_OTHERS,
        cache=CACHE_IDENTITY,
        device=config["device"],
    script:
        "../workflow_scripts/fit_others.py"


rule cross_user_headline:
    input:
        global_fit=rules.fit_global.output.thetas,
        fits=fit_shard_paths("fits.parquet"),
        others=rules.fit_others.output[0],
        capacity=rules.capacity.output[0],
        shards=shard_paths(),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
    output:
        results("fit", "cross_user-headline.parquet"),
    log:
        results("logs", "fit", "cross_user-headline.log"),
    benchmark:
        results("benchmarks", "fit-cross_user-headline.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        gpu=gpus(),
    params:
        fit=FIT_SWEEP,
        listed=FIT["cross_user"],
        bootstrap=FIT["bootstrap"],
        cache=CACHE_IDENTITY,
        device=config["device"],
    script:
        "../workflow_scripts/fit_cross_user.py"


rule personalization_table:
    input:
        global_fit=rules.fit_global.output.thetas,
        fits=fit_shard_paths("fits.parquet"),
        others=rules.fit_others.output[0],
        dose=fit_shard_paths("dose.parquet"),
        validation=[rules.fit_global.output.validation, *fit_shard_paths("validation.parquet")],
        capacity=rules.capacity.output[0],
        cross_user=[*cross_user_paths(), rules.cross_user_headline.output[0]],
        model=rules.model.output.identity,
    output:
        personalization=report(
            results("tables", "personalization.csv"),
            caption="../report/personalization.rst",
            category="User prior heads",
        ),
        capacity=report(
            results("tables", "capacity.csv"), caption="../report/capacity.rst", category="User prior heads"
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
        fit=FIT_SWEEP,
        cache=CACHE_IDENTITY,
    script:
        "../workflow_scripts/fit_tables.py"
