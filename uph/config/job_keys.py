"""What each job reads of the config: `job_params` gives a job exactly the keys its outputs depend on
(Snakemake reruns a job whose params change), and the *_KEYS lists name them, each beside the code
that reads them (tests/test_registries.py checks each equals the keys its dataclass reads)."""

from __future__ import annotations

import dataclasses


def dataclass_fields(cls, section: dict) -> dict:
    """The entries of a validated config `section` that are fields of the frozen dataclass `cls`, lists
    as tuples: what a section's `from_config` builds it from (a job's params may hold more keys)."""
    values = {field.name: section[field.name] for field in dataclasses.fields(cls)}
    return {key: tuple(value) if isinstance(value, list) else value for key, value in values.items()}


def job_params(section: dict, keys=None) -> dict:
    """The keys of a config section that one job reads (all if None), sorted at every level.

    Snakemake reruns a job when the repr of its params changes, so a job gets exactly the settings
    its outputs depend on: not the lists of sweep points or seeds (its wildcards pick one), so adding
    one reruns nothing old (a feedback job's seeds are its own: FEEDBACK_COMMON_KEYS), and never the YAML's
    key order."""

    def canonical(value):
        return {key: canonical(value[key]) for key in sorted(value)} if isinstance(value, dict) else value

    return canonical({key: section[key] for key in (section if keys is None else keys)})


def computed_config(config: dict) -> dict:
    """The config as what the study computes from it (provenance's settings): not where the results go,
    nor any `device` key nor `cpu_kernels` (a device or a kernel cap moves rounding only,
    uph.device.job_device)."""
    return job_params(
        {
            key: {k: v for k, v in value.items() if k != "device"} if isinstance(value, dict) else value
            for key, value in config.items()
            if key not in ("results", "device", "cpu_kernels")
        }
    )


# What each job reads, so that its params hold exactly those keys (`job_params`).
EXTRACT_KEYS = ("context", "dtype", "shards")  # the extract keys a cache reader checks (uph.lm.data.cache.read_users)
SOLVER_KEYS = ("beta", "lam", "clip_norm", "lr", "steps", "tol", "max_iter")  # uph.lm.engine.solvers.SolverSettings
HEAD_KEYS = ("basis_seed", "lm_head_update")  # what building the heads reads besides the point (uph.lm.engine.heads)
SWEEP_KEYS = (
    "heads",
    "alphas",
    "ds",
    "extra_points",
    "solvers",
    "baselines",
    *HEAD_KEYS,
    *SOLVER_KEYS,
)  # every method, every solver
CAPACITY_KEYS = (
    "radii",
    "lambdas",
    "temperatures",
    "validation_fraction",
)  # the grids and the split (uph.lm.engine.capacity)
FIT_GLOBAL_KEYS = (*SWEEP_KEYS, *CAPACITY_KEYS, "global_max_tokens")  # uph.lm.jobs.global_fit.fit_global
FIT_VALIDATE_KEYS = (*SWEEP_KEYS, *CAPACITY_KEYS, "dose_response", "on_cache")  # uph.lm.jobs.validate.validate_users
FIT_SHARD_KEYS = (*SWEEP_KEYS, "dose_response", "on_cache")  # uph.lm.jobs.refit.fit_users (the choices come as a file)
FIT_OTHERS_KEYS = (*SWEEP_KEYS, "on_cache")  # uph.lm.jobs.controls.others


# A feedback job trains every seed of its method (uph.feedback.training.train_seeds): the seeds are its keys too.
FEEDBACK_COMMON_KEYS = (
    "seeds",
    "test_fraction",
    "context",
    "hidden",
    "steps",
    "batch_size",
    "lr",
    "log_every",
    "eval_windows",
)
FEEDBACK_METHOD_KEYS = {  # the feedback keys beyond the common ones each method reads (uph.feedback.training)
    "backprop": (),
    "dfa": (),
    "feedback_frozen": ("rank",),
    "feedback_learned": ("rank", "update", "signal", "node_perturbation"),
    "feedback_learned_oracle": ("rank", "update"),
}
