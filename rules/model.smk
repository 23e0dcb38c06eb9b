# Model: materialize the configured source once as a transformers folder; later stages load it. The job
# stops with one line unless the suite's logits (final hidden state -> OutputLayer) are the model's own.


rule model:
    input:
        model_folder_files(),
    output:
        identity=results("model", "identity.json"),
    log:
        results("logs", "model.log"),
    benchmark:
        results("benchmarks", "model.tsv")
    priority: LM_PRIORITY
    params:
        model=job_params(config["model"]),
    script:
        "../workflow_scripts/model.py"
