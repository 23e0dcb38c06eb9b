# Fit: the personalization study on the cache, every method at its capacity chosen on validation
# (uph.lm.engine.capacity). The per-user work runs in fit.jobs jobs, users balanced by train tokens
# (uph.lm.jobs.partition), whatever the cache's shards and the run's cores. fit_global walks one method's global
# path of radii on the pooled users' fit parts, chooses on their validation parts and refits;
# fit_global_unigram counts the pooled unigram and chooses its lambdas; fit_global_neural_cache pools the
# neural cache's datastore (capped like the global theta's tokens) and chooses its temperatures and lambdas;
# each validate job walks its users' personal and residual paths (p0 computed once per user) and keeps
# every ball's warm start; capacity chooses every arm's radius (and the caches' knobs) from all of them; each fit job refits its users' arms at
# their choices on all train tokens, warm from the path's ball there, and scores them on test; fit_others
# scores its users' texts with the mean of the other users' residual thetas (the control a personal gain
# must beat); cross_user scores every residual theta on its users' texts at the listed points
# (fit.cross_user), cross_user_headline at the point the summary reports (headline_point: the best own
# against others, picked from the fits and that control); the tables follow.
wildcard_constraints:
    head="|".join(sorted({head for head, _, _ in sweep_points(FIT)})),
    method="|".join(global_methods()),
    alpha=r"[0-9.e+-]+",
    d=r"\d+",
    job=r"\d+",


rule fit_global:
    input:
        shards=shard_paths(),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
        record=check_record("fit_global"),
    output:
        thetas=f"{GLOBAL_FIT}/thetas.parquet",
        validation=f"{GLOBAL_FIT}/validation.parquet",
    log:
        results("logs", "fit", "global-method~{method}.log"),
    benchmark:
        results("benchmarks", "fit-global-method~{method}.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        mem_mb=8000,
        gpu=gpus("fit"),
    params:
        **SETTINGS["fit_global"],
    script:
        "../workflow_scripts/fit_global.py"


rule fit_global_unigram:
    input:
        shards=shard_paths(),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
        record=check_record("fit_global_unigram"),
    output:
        unigram=f"{GLOBAL_UNIGRAM}/unigram.parquet",
        validation=f"{GLOBAL_UNIGRAM}/validation.parquet",
    log:
        results("logs", "fit", "global-unigram.log"),
    benchmark:
        results("benchmarks", "fit-global-unigram.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        mem_mb=4000,
        gpu=gpus("fit"),
    params:
        **SETTINGS["fit_global_unigram"],
    script:
        "../workflow_scripts/fit_global_unigram.py"


rule fit_global_neural_cache:
    input:
        shards=shard_paths(),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
        record=check_record("fit_global_neural_cache"),
    output:
        settings=f"{GLOBAL_NEURAL_CACHE}/neural_cache.parquet",
        datastore=f"{GLOBAL_NEURAL_CACHE}/datastore.parquet",
        validation=f"{GLOBAL_NEURAL_CACHE}/validation.parquet",
    log:
        results("logs", "fit", "global-neural_cache.log"),
    benchmark:
        results("benchmarks", "fit-global-neural_cache.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        mem_mb=4000,
        gpu=gpus("fit"),
    params:
        **SETTINGS["fit_global_neural_cache"],
    script:
        "../workflow_scripts/fit_global_neural_cache.py"


rule validate:
    input:
        **CACHE_BASELINES,
        global_fit=global_paths("thetas.parquet"),
        shards=shard_paths(),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
        record=check_record("validate"),
    output:
        validation=f"{FIT_JOB}/validation.parquet",
        warm=f"{FIT_JOB}/warm_starts.parquet",
    log:
        results("logs", "fit", "validate-job~{job}.log"),
    benchmark:
        results("benchmarks", "fit-validate-job~{job}.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        mem_mb=6000,
        gpu=gpus("fit"),
    params:
        **SETTINGS["validate"],
    script:
        "../workflow_scripts/fit_validate.py"


rule capacity:
    input:
        validation=[
            *global_paths("validation.parquet"),
            rules.fit_global_unigram.output.validation,
            rules.fit_global_neural_cache.output.validation,
            *fit_job_paths("validation.parquet"),
        ],
        model=rules.model.output.identity,
        record=check_record("capacity"),
    output:
        results("fit", "capacity.parquet"),
    log:
        results("logs", "fit", "capacity.log"),
    priority: LM_PRIORITY
    params:
        **SETTINGS["capacity"],
    script:
        "../workflow_scripts/fit_capacity.py"


rule fit:
    input:
        **CACHE_BASELINES,
        global_fit=global_paths("thetas.parquet"),
        capacity=rules.capacity.output[0],
        warm=rules.validate.output.warm,
        shards=shard_paths(),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
        record=check_record("fit"),
    output:
        fits=f"{FIT_JOB}/fits.parquet",
        dose=f"{FIT_JOB}/dose.parquet",
    log:
        results("logs", "fit", "fit-job~{job}.log"),
    benchmark:
        results("benchmarks", "fit-job~{job}.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        mem_mb=6000,
        gpu=gpus("fit"),
    params:
        **SETTINGS["fit"],
    script:
        "../workflow_scripts/fit.py"


rule fit_others:
    input:
        **CACHE_BASELINES,
        global_fit=global_paths("thetas.parquet"),
        fits=fit_job_paths("fits.parquet"),
        shards=shard_paths(),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
        record=check_record("fit_others"),
    output:
        f"{FIT_JOB}/others.parquet",
    log:
        results("logs", "fit", "others-job~{job}.log"),
    benchmark:
        results("benchmarks", "fit-others-job~{job}.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        gpu=gpus("fit"),
    params:
        **SETTINGS["fit_others"],
    script:
        "../workflow_scripts/fit_others.py"


rule cross_user:
    input:
        global_fit=global_paths("thetas.parquet"),
        fits=fit_job_paths("fits.parquet"),
        shards=shard_paths(),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
        record=check_record("cross_user"),
    output:
        CROSS_USER_BLOCK,
    log:
        results("logs", "fit", "head~{head}-alpha~{alpha}-d~{d}-cross_user-job~{job}.log"),
    benchmark:
        results("benchmarks", "fit-head~{head}-alpha~{alpha}-d~{d}-cross_user-job~{job}.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        gpu=gpus("fit"),
    params:
        **SETTINGS["cross_user"],
        solver=lambda wildcards: cross_user_solver(FIT, wildcards.head, wildcards.alpha, wildcards.d),
    script:
        "../workflow_scripts/fit_cross_user.py"


rule headline_point:
    input:
        global_fit=global_paths("thetas.parquet"),
        fits=fit_job_paths("fits.parquet"),
        others=fit_job_paths("others.parquet"),
        capacity=rules.capacity.output[0],
        model=rules.model.output.identity,
        record=check_record("headline_point"),
    output:
        results("fit", "headline.parquet"),
    log:
        results("logs", "fit", "headline_point.log"),
    benchmark:
        results("benchmarks", "fit-headline_point.tsv")
    priority: LM_PRIORITY
    params:
        **SETTINGS["headline_point"],
    script:
        "../workflow_scripts/fit_headline.py"


rule cross_user_headline:
    input:
        headline=rules.headline_point.output[0],
        global_fit=global_paths("thetas.parquet"),
        fits=fit_job_paths("fits.parquet"),
        shards=shard_paths(),
        users=rules.corpus.output.users,
        model=rules.model.output.identity,
        basis=rules.svd_basis.output[0],
        record=check_record("cross_user_headline"),
    output:
        f"{FIT_JOB}/cross_user-headline.parquet",
    log:
        results("logs", "fit", "cross_user-headline-job~{job}.log"),
    benchmark:
        results("benchmarks", "fit-cross_user-headline-job~{job}.tsv")
    priority: LM_PRIORITY
    threads: 1
    resources:
        gpu=gpus("fit"),
    params:
        **SETTINGS["cross_user_headline"],
    script:
        "../workflow_scripts/fit_cross_user.py"


rule personalization_table:
    input:
        global_fit=global_paths("thetas.parquet"),
        fits=fit_job_paths("fits.parquet"),
        others=fit_job_paths("others.parquet"),
        dose=fit_job_paths("dose.parquet"),
        validation=rules.capacity.input.validation,
        capacity=rules.capacity.output[0],
        cross_user=[*cross_user_paths(), *fit_job_paths("cross_user-headline.parquet")],
        model=rules.model.output.identity,
        record=check_record("personalization_table"),
    output:
        **table_outputs("personalization_table"),
    log:
        results("logs", "personalization_table.log"),
    benchmark:
        results("benchmarks", "personalization_table.tsv")
    priority: LM_PRIORITY
    params:
        **SETTINGS["personalization_table"],
    script:
        "../workflow_scripts/fit_tables.py"
