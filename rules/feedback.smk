# Feedback: a character MLP language model on the corpus text, trained with backprop, direct
# feedback alignment and factored feedback (seed 003: frozen U, U learned from node perturbation,
# U learned from the true gradient as an oracle); one job per (method, seed), then the table.

# The feedback keys beyond the common ones that each method reads, so that changing, say, the node
# perturbation's sigma reruns feedback_learned only.
FEEDBACK_METHOD_KEYS = {
    "backprop": [],
    "dfa": [],
    "feedback_frozen": ["rank"],
    "feedback_learned": ["rank", "update", "signal", "node_perturbation"],
    "feedback_learned_oracle": ["rank", "update"],
}
FEEDBACK_COMMON_KEYS = ["test_fraction", "context", "hidden", "steps", "batch_size", "lr", "log_every", "eval_windows"]


def feedback_settings(wildcards):
    return job_params(config["feedback"], FEEDBACK_COMMON_KEYS + FEEDBACK_METHOD_KEYS[wildcards.method])


rule feedback_train:
    input:
        roles=rules.corpus_roles.output[0],
    output:
        results("feedback", "method~{method}", "seed~{seed}", "curves.parquet"),
    log:
        results("logs", "feedback_train-method~{method}-seed~{seed}.log"),
    benchmark:
        results("benchmarks", "feedback_train-method~{method}-seed~{seed}.tsv")
    wildcard_constraints:
        method="|".join(config["feedback"]["methods"]),
        seed=r"\d+",
    threads: 1
    resources:
        gpu=gpus(),
    params:
        feedback=feedback_settings,
        device=config["device"],
    script:
        "../workflow_scripts/feedback_train.py"


rule feedback_table:
    input:
        expand(rules.feedback_train.output[0], method=config["feedback"]["methods"], seed=config["feedback"]["seeds"]),
    output:
        csv=report(results("tables", "feedback.csv"), caption="../report/feedback.rst", category="Feedback"),
        md=results("tables", "feedback.md"),
        tex=results("tables", "feedback.tex"),
    log:
        results("logs", "feedback_table.log"),
    benchmark:
        results("benchmarks", "feedback_table.tsv")
    script:
        "../workflow_scripts/feedback_table.py"
