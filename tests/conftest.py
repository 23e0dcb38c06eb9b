"""Shared fixtures: tiny real models (random weights, real architectures) materialized on disk."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from slurm_cluster import SNAKEMAKE_ARGS, SlurmCluster, missing_programs
from tiny_lm import final_hidden, tiny_llama

REPO = Path(__file__).resolve().parent.parent
# The modules whose tests check float32 computations against a tolerance, without a workflow run: `make test`
# runs them a second time on an AVX2-only CPU's kernels (Makefile: AVX2_KERNELS), so a tolerance that holds on
# this machine's kernels alone fails there. A test that reads the tiny study is left to the first pass.
NUMERICAL = {
    "test_attention",
    "test_attention_runs",
    "test_basis",
    "test_capacity",
    "test_char_lm",
    "test_evaluate",
    "test_extract",
    "test_feedback",
    "test_fit",
    "test_fit_tables",
    "test_heads",
    "test_kernels",
    "test_neural_cache",
    "test_round",
}
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
SLURM_PROFILE = REPO / "profiles/slurm"


def slurm_profile() -> dict:
    """profiles/slurm's settings (its default and per-rule resources)."""
    return yaml.safe_load((SLURM_PROFILE / "config.v8+.yaml").read_text())


def snakemake_command(workdir, *args, config="config/test.yaml") -> list[str]:
    """The snakemake command line on this repository's Snakefile in `workdir` (config: relative to
    the repository, or an absolute path)."""
    return [
        SNAKEMAKE,
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(REPO / config),
        "--cores",
        "2",
        *args,
    ]


def make_slurm_command(workdir, *args, config="config/test.yaml") -> list[str]:
    """`make slurm` as docs/cluster-and-gpu.md gives it, on `config` (relative to the repository) in `workdir`,
    with `args` for snakemake: this process's snakemake (BIN) and its environment taken as set up (-o)."""
    snakemake_args = shlex.join(["--directory", str(workdir), "--cores", "2", *args])
    return [
        "make", "-C", str(REPO), "--no-print-directory", "-o", ".venv/.installed", f"BIN={Path(SNAKEMAKE).parent}",
        "slurm", f"CONFIG={config}", f"SNAKEMAKE_ARGS={snakemake_args}",
    ]  # fmt: skip


def snakemake(workdir, *args, config="config/test.yaml", timeout=600, env=None):
    """Run `snakemake_command` to its end (`env`: the environment, default this process's)."""
    return subprocess.run(
        snakemake_command(workdir, *args, config=config), capture_output=True, text=True, timeout=timeout, env=env
    )


def without_modules(folder: Path, *names: str, where: str) -> dict:
    """This process's environment with `names` made unimportable: a package of each name in `folder`,
    first on PYTHONPATH, raises ImportError('<where> imported <name>')."""
    for name in names:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f"raise ImportError('{where} imported {name}')")
    return {**os.environ, "PYTHONPATH": str(folder)}


OUTPUTS = ["results/tables", "results/figures", "results/summary.md"]


def files_under(root, parts=OUTPUTS) -> dict:
    """relative path -> bytes of every file under `parts` of `root`."""
    paths = [p for part in parts for p in ([root / part] if (root / part).is_file() else (root / part).rglob("*"))]
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in paths if p.is_file()}


@dataclass
class Run:
    workdir: Path
    run: subprocess.CompletedProcess  # `rule all`


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory) -> Run:
    """One clean run of the whole DAG on config/test.yaml, shared by every test that reads its outputs.
    Read it, never write to it: tests that perturb a run make their own."""
    workdir = tmp_path_factory.mktemp("tiny-study")
    return Run(workdir, snakemake(workdir))


@dataclass
class SecondRun:
    workdir: Path
    run: subprocess.CompletedProcess
    through_slurm: bool
    slurm_jobs: list[tuple[str, str]]  # (state, comment) of each job SLURM listed after the run


class SlurmRun:
    """The tiny study through sbatch on a one-node SLURM cluster on localhost (tests/slurm_cluster.py), by
    `make slurm` and gram_resilience's first attempt failing on purpose (UPH_FAIL_ONCE), running in the
    background from its start until `finish` (a SecondRun)."""

    def __init__(self, cluster_folder: Path, workdir: Path):
        profile = slurm_profile()
        requests = [profile["default-resources"], *profile["set-resources"].values()]
        # twice the CPUs it has: a tiny job waits on sbatch, polls and start-ups as much as it computes
        memory_mb, cpus = max(r.get("mem_mb", 0) for r in requests), 2 * os.cpu_count()
        self.cluster = SlurmCluster(cluster_folder, memory_mb=memory_mb, cpus=cpus)
        self.workdir, self.result = workdir, None
        env = {**os.environ, "SLURM_CONF": self.cluster.env["SLURM_CONF"], "UPH_FAIL_ONCE": "gram_resilience"}
        command = make_slurm_command(workdir, *SNAKEMAKE_ARGS)
        self.logs = [cluster_folder / "snakemake.out", cluster_folder / "snakemake.err"]
        try:
            with open(self.logs[0], "w") as out, open(self.logs[1], "w") as err:
                self.process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        except BaseException:
            self.cluster.stop()
            raise

    def finish(self) -> SecondRun:
        """Wait for the run, list what SLURM ran, stop the cluster (once)."""
        if self.result is None:
            try:
                returncode = self.process.wait(timeout=1200)
                listed = self.cluster.run("squeue", "--states=all", "--noheader", "--format=%T|%k").stdout
            finally:
                self.stop()
            out, err = (path.read_text() for path in self.logs)
            run = subprocess.CompletedProcess(self.process.args, returncode, out, err)
            jobs = [tuple(line.split("|")) for line in listed.splitlines()]
            self.result = SecondRun(self.workdir, run, True, jobs)
        return self.result

    def stop(self) -> None:
        """End the run where it is (a session that no longer needs it) and stop the cluster."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.cluster.stop()


@pytest.fixture(scope="session", autouse=True)
def slurm_run(request, tmp_path_factory):
    """Where SLURM is installed and a collected test asks for second_run, its run through sbatch starts with
    the session's first test (a SlurmRun): it waits on SLURM's polls and start-ups more than it computes, so
    the tests before the first that needs it run beside it instead of after it. A cluster that does not
    start fails second_run's tests, not every test; a session that ends first stops the run."""
    if missing_programs() or not any("second_run" in item.fixturenames for item in request.session.items):
        yield None
        return
    try:
        run = SlurmRun(tmp_path_factory.mktemp("slurm"), tmp_path_factory.mktemp("second-run"))
    except Exception as error:  # handed to second_run, which raises it
        yield error
        return
    yield run
    if run.result is None:
        run.stop()


@pytest.fixture(scope="session")
def second_run(slurm_run, tmp_path_factory) -> SecondRun:
    """The tiny study once more in a fresh folder, whose bytes tests/test_workflow.py holds to the first
    run's (the tiny_study fixture): through sbatch where SLURM is installed (slurm_run), which
    tests/test_slurm.py checks, else locally. One run serves both questions, since each is a whole study
    (about 80 s locally, 240 s through sbatch on 2 cores)."""
    if isinstance(slurm_run, Exception):
        raise slurm_run
    if slurm_run is not None:
        return slurm_run.finish()
    workdir = tmp_path_factory.mktemp("second-run")
    return SecondRun(workdir, snakemake(workdir), False, [])


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one torch thread is fastest, and two spin against each other on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A function arch -> folder of a materialized tiny random model ('llama' or 'gpt2')."""
    from uph.lm.data.models import materialize

    made = {}

    def make(arch: str) -> Path:
        if arch not in made:
            folder = tmp_path_factory.mktemp(f"tiny-{arch}")
            materialize(f"tiny-{arch}", f"tiny:{arch}", folder)
            made[arch] = folder
        return made[arch]

    return make


def with_random_test_parts(users: dict, vocab_size: int, seed: int) -> dict:
    """The users (uph.lm.data.cache.UserStates) with their train parts as they are and their test parts
    replaced by random states and targets of the same shapes: what a choice made on train tokens must
    not notice."""
    generator = torch.Generator().manual_seed(seed)
    return {
        user: type(states)(
            states.train_hidden,
            states.train_targets,
            torch.randn(states.test_hidden.shape, generator=generator),
            torch.randint(0, vocab_size, states.test_targets.shape, generator=generator),
        )
        for user, states in users.items()
    }


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny random Llama in float64 (tests/tiny_lm.py)."""
    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def lm(model):
    """(h [n, H], targets [n], W, b, svd) of `model` in float64, for the fit engine's tests (test_fit,
    test_gpu); n = 300 is no multiple of the chunks used."""
    ids = torch.randint(0, model.config.vocab_size, (5, 61), generator=torch.Generator().manual_seed(1))
    h = final_hidden(model, ids[:, :-1]).reshape(-1, model.config.hidden_size)
    W = model.get_output_embeddings().weight.detach()
    b = 0.1 * torch.randn(W.shape[0], dtype=W.dtype, generator=torch.Generator().manual_seed(2))
    return h, ids[:, 1:].reshape(-1), W, b, torch.linalg.svd(W, full_matrices=False)


def pytest_collection_modifyitems(items):
    """Mark `numerical` the tests of NUMERICAL's modules that start no workflow (no tiny_study)."""
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in NUMERICAL and "tiny_study" not in item.fixturenames:
            item.add_marker(pytest.mark.numerical)
