# Model: materialize the configured source as a transformers folder once; later stages load it.
# model_candidate writes a candidate folder and stops with one line unless it passes every admission
# check; only then does the local rule model move it into results/model, so a refused source leaves
# the last good model, and everything built on it, as it was. Both rules rerun on a change of the
# model keys or of a local folder's content (MODEL: params, uph.records), never on a touched file.


rule model_candidate:
    input:
        record=check_record("model_candidate"),
    output:
        folder=temp(directory(MODEL_CANDIDATE)),
    log:
        results("logs", "model_candidate.log"),
    benchmark:
        results("benchmarks", "model_candidate.tsv")
    priority: LM_PRIORITY
    params:
        **SETTINGS["model"],
    script:
        "../workflow_scripts/model_candidate.py"


rule model:
    input:
        candidate=rules.model_candidate.output.folder,
        record=check_record("model"),
    output:
        identity=results("model", IDENTITY),
        weights=results("model", WEIGHTS),  # what else the folder holds is named by its tokenizer
        config=results("model", MODEL_CONFIG),
    log:
        results("logs", "model.log"),
    priority: LM_PRIORITY
    params:  # the job only moves the candidate: its settings rerun it (and so the candidate) on a change
        **SETTINGS["model"],
    script:
        "../workflow_scripts/model.py"
