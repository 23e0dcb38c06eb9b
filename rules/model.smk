# Model: materialize the configured source once as a transformers folder; later stages load it.


rule model:
    output:
        identity=results("model", "identity.json"),
    params:
        model=config["model"],
    log:
        results("logs", "model.log"),
    benchmark:
        results("benchmarks", "model.tsv")
    script:
        "../workflow_scripts/model.py"
