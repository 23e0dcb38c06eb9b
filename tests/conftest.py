"""Shared fixtures: tiny real models (random weights, real architectures) materialized on disk."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import torch
import yaml
from shared_runs import SharedRun, run_root
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
    """Run `snakemake_command` to its end (`env`: the environment, default this process's): a dry run (-n)
    in this process where it can be (`dry_run_here`), anything else in its own."""
    command = snakemake_command(workdir, *args, config=config)
    if "-n" in args and env is None and threading.current_thread() is threading.main_thread():
        return dry_run_here(command)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def dry_run_here(command: list[str]) -> subprocess.CompletedProcess:
    """`command`, a dry run, through Snakemake's own command line (snakemake.cli.main) in this process: the
    output `snakemake -n` prints, without its second of start-up. In the main thread, since the Snakefile
    sets the Ctrl-C handler (uph.interrupts), which is restored after it, as is the working directory that
    --directory changes. The root logger has no handlers while it runs, as in a process of its own, so a
    uph module's warning goes to stderr (logging's last resort), not to pytest's log capture."""
    from snakemake import cli

    out, err, cwd, handler = io.StringIO(), io.StringIO(), os.getcwd(), signal.getsignal(signal.SIGINT)
    root, returncode = logging.getLogger(), 0
    handlers, root.handlers = root.handlers, []
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main(command[1:])
    except SystemExit as exit:
        returncode = exit.code if isinstance(exit.code, int) else 1
    finally:
        os.chdir(cwd)
        signal.signal(signal.SIGINT, handler)
        root.handlers = handlers
    return subprocess.CompletedProcess(command, returncode, out.getvalue(), err.getvalue())


def without_modules(folder: Path, *names: str, where: str) -> dict:
    """This process's environment with `names` made unimportable: a package of each name in `folder`,
    first on PYTHONPATH, raises ImportError('<where> imported <name>')."""
    for name in names:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f"raise ImportError('{where} imported {name}')")
    return {**os.environ, "PYTHONPATH": str(folder)}


@contextlib.contextmanager
def read_only(folder):
    """`folder` unwritable, also for root (who ignores permission bits: then the immutable attribute)."""
    folder.chmod(0o555)
    as_root = os.geteuid() == 0
    if as_root and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        folder.chmod(0o755)
        pytest.skip("running as root without the right to set the immutable attribute")
    try:
        yield folder
    finally:
        if as_root:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


OUTPUTS = ["results/tables", "results/figures", "results/summary.md"]


def files_under(root, parts=OUTPUTS) -> dict:
    """relative path -> bytes of every file under `parts` of `root`."""
    paths = [p for part in parts for p in ([root / part] if (root / part).is_file() else (root / part).rglob("*"))]
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in paths if p.is_file()}


@dataclass
class Run:
    workdir: Path
    run: subprocess.CompletedProcess  # `rule all`


def in_background(folder: Path, command: list[str], env=None, niceness: int = 0) -> subprocess.Popen:
    """`command` started with its output in `folder`/stdout and stderr, at `niceness`, in a process group of
    its own (which `kill_group` ends), not a session: Linux's autogroups share the CPU between sessions,
    whatever their niceness."""
    with open(folder / "stdout", "w") as out, open(folder / "stderr", "w") as err:
        return subprocess.Popen(
            command, stdout=out, stderr=err, env=env, preexec_fn=lambda: (os.setpgid(0, 0), os.nice(niceness))
        )


def kill_group(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def local_study(folder: Path, niceness: int = 0):
    """A SharedRun launch: the tiny study in `folder`/study, at `niceness` (19: it takes the CPU only where
    nothing else wants it)."""
    process = in_background(folder, snakemake_command(folder / "study"), niceness=niceness)

    def finish() -> dict:
        return {"args": process.args, "returncode": process.wait(timeout=1200), "through_slurm": False, "jobs": []}

    return finish, lambda: kill_group(process)


def slurm_study(folder: Path):
    """A SharedRun launch: the tiny study through sbatch on a one-node SLURM cluster on localhost
    (tests/slurm_cluster.py), by `make slurm`, gram_resilience's first attempt failing on purpose
    (UPH_FAIL_ONCE). It waits on SLURM's polls and start-ups more than it computes."""
    profile = slurm_profile()
    requests = [profile["default-resources"], *profile["set-resources"].values()]
    # twice the CPUs it has: a tiny job waits on sbatch, polls and start-ups as much as it computes
    memory_mb, cpus = max(r.get("mem_mb", 0) for r in requests), 2 * os.cpu_count()
    (folder / "cluster").mkdir()
    cluster = SlurmCluster(folder / "cluster", memory_mb=memory_mb, cpus=cpus)
    env = {**os.environ, "SLURM_CONF": cluster.env["SLURM_CONF"], "UPH_FAIL_ONCE": "gram_resilience"}
    command = make_slurm_command(folder / "study", *SNAKEMAKE_ARGS)
    try:
        process = in_background(folder, command, env=env)
    except BaseException:
        cluster.stop()
        raise

    def finish() -> dict:
        try:
            returncode = process.wait(timeout=1200)
            listed = cluster.run("squeue", "--states=all", "--noheader", "--format=%T|%k").stdout
        finally:
            stop()
        jobs = [line.split("|") for line in listed.splitlines()]
        return {"args": command, "returncode": returncode, "through_slurm": True, "jobs": jobs}

    def stop() -> None:
        kill_group(process)
        cluster.stop()

    return finish, stop


# The whole-study runs tests share (tests/shared_runs.py): the tiny study, and the second run that
# tests/test_workflow.py holds to it byte for byte, through sbatch where SLURM is installed (which
# tests/test_slurm.py checks), else locally. Each is started once, in the background, when the session starts.
# A local second run yields the CPU to everything else: most tests wait for the tiny study, and one for it.
SHARED_RUNS = {
    "tiny_study": ("tiny-study", lambda: local_study),
    "second_run": ("second-run", lambda: partial(local_study, niceness=19) if missing_programs() else slurm_study),
}
INTERRUPTED = []  # a Ctrl-C ended the session (pytest_keyboard_interrupt)


def pytest_keyboard_interrupt():
    INTERRUPTED.append(True)


@pytest.fixture(scope="session", autouse=True)
def shared_runs(request, tmp_path_factory) -> dict[str, SharedRun]:
    """fixture name -> its SharedRun; those a collected test asks for start with the session's first test,
    so the tests that need neither run beside them (pytest_collection_modifyitems puts those first). At the
    end, a run this process started is waited for (another worker may read it) or, in a session that stops
    early or alone, stopped."""
    root = run_root(tmp_path_factory.getbasetemp())
    runs = {fixture: SharedRun(root, name) for fixture, (name, _) in SHARED_RUNS.items()}
    wanted = {fixture for item in request.session.items for fixture in SHARED_RUNS if fixture in item.fixturenames}
    for fixture, (_, launch) in SHARED_RUNS.items():
        if fixture in wanted:
            runs[fixture].start(launch())
    if "tiny_study" in wanted:
        os.nice(5)  # this process, and what it starts, yield to the tiny study: most of what is left waits for it
    yield runs
    alone = not os.environ.get("PYTEST_XDIST_WORKER")
    for run in runs.values():
        run.end(stop=alone or bool(INTERRUPTED) or bool(request.session.shouldstop or request.session.shouldfail))


def shared_study(run: SharedRun) -> tuple[Path, subprocess.CompletedProcess, dict]:
    result = run.result()
    out, err = ((run.folder / name).read_text() for name in ("stdout", "stderr"))
    return run.folder / "study", subprocess.CompletedProcess(result["args"], result["returncode"], out, err), result


@pytest.fixture(scope="session")
def tiny_study(shared_runs) -> Run:
    """One clean run of the whole DAG on config/test.yaml, shared by every test that reads its outputs.
    Read it, never write to it: tests that perturb a run make their own."""
    workdir, run, _ = shared_study(shared_runs["tiny_study"])
    return Run(workdir, run)


@dataclass
class SecondRun:
    workdir: Path
    run: subprocess.CompletedProcess
    through_slurm: bool
    slurm_jobs: list[tuple[str, str]]  # (state, comment) of each job SLURM listed after the run


@pytest.fixture(scope="session")
def second_run(shared_runs) -> SecondRun:
    """The tiny study once more in a fresh folder (SHARED_RUNS): about 80 s locally, 240 s through sbatch
    on 2 cores, since each is a whole study."""
    workdir, run, result = shared_study(shared_runs["second_run"])
    return SecondRun(workdir, run, result["through_slurm"], [tuple(job) for job in result["jobs"]])


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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(items):
    """Mark `numerical` the tests of NUMERICAL's modules that start no workflow (no tiny_study). Put the
    tests that wait for a shared run (SHARED_RUNS) last, the slow ones first among them, so the others run
    while the runs do and the longest are not left to the end. Under pytest-xdist (`-n`, with
    --dist loadgroup), the tests that read a test module's session-scoped fixture (a dry run of each case,
    say) share a worker, which builds it once: session-scoped, since a worker runs other modules' tests
    between them, and a module's fixture would be built again after each."""
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in NUMERICAL and "tiny_study" not in item.fixturenames:
            item.add_marker(pytest.mark.numerical)
        built_once = [  # a test module's session-scoped fixtures: what several of its tests read
            f"{defs[-1].baseid}::{name}"
            for name, defs in item._fixtureinfo.name2fixturedefs.items()
            if defs[-1].scope == "session" and defs[-1].baseid.endswith(".py")
        ]
        if built_once:
            item.add_marker(pytest.mark.xdist_group(built_once[0]))

    def waits(item) -> tuple[bool, bool]:
        return any(name in item.fixturenames for name in SHARED_RUNS), item.get_closest_marker("slow") is None

    items.sort(key=waits)
