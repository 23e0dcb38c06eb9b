# Corpus: every (play, role) of the Shakespeare texts, then the tokenized, filtered, split users.


rule corpus_roles:
    input:
        corpus_file(),
    output:
        results("corpus", "roles.parquet"),
    log:
        results("logs", "corpus_roles.log"),
    benchmark:
        results("benchmarks", "corpus_roles.tsv")
    priority: LM_PRIORITY
    params:
        source=config["corpus"]["source"],
        plays=config["corpus"]["plays"],
    script:
        "../workflow_scripts/corpus_roles.py"


rule corpus:
    input:
        roles=rules.corpus_roles.output[0],
        model=results("model", "identity.json"),
    output:
        users=results("corpus", "users.parquet"),
    log:
        results("logs", "corpus.log"),
    benchmark:
        results("benchmarks", "corpus.tsv")
    priority: LM_PRIORITY
    params:
        corpus=job_params(config["corpus"], ("min_tokens", "max_users", "max_tokens", "train_fraction")),
        gap=config["extract"]["context"],
    script:
        "../workflow_scripts/corpus.py"
