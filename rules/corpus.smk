# Corpus: every (play, role) of the Shakespeare texts, then the tokenized, filtered, split users.


rule corpus_roles:
    input:
        corpus=corpus_file(),
        record=check_record("corpus_roles"),
    output:
        results("corpus", "roles.parquet"),
    log:
        results("logs", "corpus_roles.log"),
    benchmark:
        results("benchmarks", "corpus_roles.tsv")
    priority: LM_PRIORITY
    params:
        **SETTINGS["corpus_roles"],
    script:
        "../workflow_scripts/corpus_roles.py"


rule corpus:
    input:
        roles=rules.corpus_roles.output[0],
        model=results("model", "identity.json"),
        record=check_record("corpus"),
    output:
        users=results("corpus", "users.parquet"),
    log:
        results("logs", "corpus.log"),
    benchmark:
        results("benchmarks", "corpus.tsv")
    priority: LM_PRIORITY
    params:
        **SETTINGS["corpus"],
    script:
        "../workflow_scripts/corpus.py"
