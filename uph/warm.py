"""Warm workers: a GPU job runs in a process that has already paid its start-up.

A GPU job pays seconds before its own work: the interpreter, torch's imports, the CUDA context and the
first cuBLAS handle (about 11 s a job on the H100 machine, BENCHMARKS.md). The language-model chain's GPU
stages run one after another, and the training branches on a GPU are some 80 short jobs. Where the run
has warm workers (config `warm_workers`), such a job hands itself over on `import uph`, before any of
that, and exits with the status its worker reports:

- **Slots.** A slot is a lock file: the job takes the first slot no other job holds (flock), so at most
  as many workers are busy as jobs run at once (on one machine, the run's `gpu` slots). A slot without a
  worker gets one, started by the job that took it (`serve`, in a session of its own).
- **A job in a worker** runs its script as Snakemake would (runpy, with the job's `snakemake` object,
  working folder, environment, stdout and stderr, the last two passed over the socket), one at a time.
- **Each job stays Snakemake's:** its outputs, log, benchmark and retry are its own, so a run resumes
  job by job as before. A job whose process is stopped (Ctrl-C, a cancelled run) ends its worker with
  it; a worker that dies fails its job, whose retry starts a fresh one.
- **Idle workers exit** after `IDLE_SECONDS` with no job, unless a job holds their slot.
- **Workers are keyed to this checkout's code** (the uph package's files' sizes and times): after an edit,
  jobs start new workers and the old ones idle out.

Snakemake's benchmark of a warm job measures the job's own process (the hand-over): its wall is right, its
CPU time and memory are not; uph.logs.rule_logging logs the job's CPU seconds in the worker instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import logging
import os
import pickle
import resource
import runpy
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from uph.device import job_device
from uph.errors import workflow_job

IDLE_SECONDS = 60.0  # a worker with no job this long exits (it holds a CUDA context: ~0.5 GB of GPU memory)
START_SECONDS = 120.0  # a worker not listening this long after its start is given up: the job runs itself
SETTINGS = ("auto", True, False)  # config warm_workers (wants_worker)
_LENGTH = struct.Struct("!Q")
_STATUS = struct.Struct("!i")
_TAKEN = b"T"  # the worker has taken the job (before it, a closed connection means: start another)
_serving: dict = {}  # in a worker: its pid, how many jobs it has run, its CPU seconds at the job's start


def wants_worker(job) -> bool:
    """Whether workflow job `job` (Snakemake's `snakemake` object) runs in a warm worker: a job that sets up
    a device (uph.device.job_device: extraction, the fit stage, the training runs), where config `warm_workers`
    is auto (default) and the job holds a GPU slot (resource gpu) outside a SLURM job, whose node is the
    job's alone; or is true (any device); false: none."""
    setting = job.config.get("warm_workers", SETTINGS[0])
    if setting is False or job_device(job.rule, job.config) is None:
        return False
    if setting is True:
        return True
    return int(getattr(job.resources, "gpu", 0) or 0) > 0 and "SLURM_JOB_ID" not in os.environ


def hand_over() -> None:
    """In a workflow job that `wants_worker`, run the job in a warm worker and exit with its status (uph's
    __init__ calls this before anything heavy is imported). Elsewhere, in a worker, or where no worker
    could be started (logged), return: the job runs in this process."""
    job = workflow_job()
    if job is None or _serving or not wants_worker(job):
        return
    status = run_in_worker(sys.modules["__main__"].__file__, job, slots_folder())
    if status is not None:
        sys.exit(status)


def slots_folder() -> Path:
    """Where this checkout's workers listen: a folder in the temporary directory named by the user, the
    interpreter and the uph package's files (path, size, modification time)."""
    package = Path(__file__).resolve().parent
    files = sorted(package.rglob("*.py"))
    key = repr([sys.executable, str(package)] + [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files])
    return Path(tempfile.gettempdir()) / f"uph-warm-{os.getuid()}" / hashlib.sha256(key.encode()).hexdigest()[:16]


def run_in_worker(script: str, job, folder: Path) -> int | None:
    """Run workflow script `script` with `job` as its `snakemake` object in a warm worker of `folder`
    (started if its slot has none): the script's exit status, or None where no worker started."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = pickle.dumps({"script": script, "job": job, "cwd": os.getcwd(), "environ": dict(os.environ)})
    with _free_slot(folder) as slot:
        for _ in range(2):  # a worker that was exiting as we connected: start another, once
            connection = _connect(folder, slot) or _start(folder, slot)
            if connection is None:
                return None
            with connection:
                sys.stdout.flush()
                sys.stderr.flush()
                try:
                    socket.send_fds(
                        connection, [_LENGTH.pack(len(payload))], [sys.stdout.fileno(), sys.stderr.fileno()]
                    )
                    connection.sendall(payload)
                    taken = connection.recv(1) == _TAKEN
                except OSError:  # reset: the worker was exiting as we connected
                    taken = False
                if not taken:
                    continue
                try:
                    reply = _receive(connection, _STATUS.size)
                except OSError:
                    reply = None
                if reply is None:
                    print(f"uph.warm: the worker of slot {slot} ({folder}) died during the job", file=sys.stderr)
                    return 1
                return _STATUS.unpack(reply)[0]
    return None


@contextlib.contextmanager
def _free_slot(folder: Path):
    """The first slot of `folder` no other job holds, held until the block ends."""
    slot = 0
    while True:
        with open(folder / f"slot-{slot}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                slot += 1
                continue
            yield slot
            return


def _connect(folder: Path, slot: int) -> socket.socket | None:
    """A connection to slot `slot`'s worker, None where it has none listening."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(folder / f"slot-{slot}.sock"))
    except OSError:  # no socket, a stale one, or a path too long for one (a worker could not bind it either)
        connection.close()
        return None
    return connection


def _start(folder: Path, slot: int) -> socket.socket | None:
    """Start slot `slot`'s worker and connect to it; None (logged) when it is not listening in time."""
    package_root = str(Path(__file__).resolve().parent.parent)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    with open(folder / f"slot-{slot}.log", "ab") as log:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from uph.warm import serve; serve(*sys.argv[1:])",
                str(folder),
                str(slot),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=environ,
            start_new_session=True,  # a Ctrl-C reaches the job's process, whose end then ends the worker's job
        )
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline and worker.poll() is None:
        if connection := _connect(folder, slot):
            return connection
        time.sleep(0.02)
    print(
        f"uph.warm: slot {slot}'s worker did not start (see {folder}/slot-{slot}.log); the job runs in its own process",
        file=sys.stderr,
    )
    return None


def _receive(connection: socket.socket, size: int) -> bytes | None:
    """Exactly `size` bytes from `connection`, or None where it closes first."""
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def serve(folder: str | Path, slot: int | str, idle: float = IDLE_SECONDS) -> None:
    """Slot `slot`'s worker: run the jobs that connect, one at a time, until `idle` seconds pass without
    one while no job holds the slot."""
    import torch  # the start-up every job would pay: torch's imports ...

    if torch.cuda.is_available():
        torch.cuda.init()  # ... and the CUDA context
    _serving.update(pid=os.getpid(), jobs=0)
    folder, slot = Path(folder), int(slot)
    path = folder / f"slot-{slot}.sock"
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(idle)
    while True:
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            with open(folder / f"slot-{slot}.lock", "a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a job holds the slot: it is connecting
                path.unlink(missing_ok=True)
                listener.close()
                return
        connection.settimeout(None)
        with connection:
            _serve_job(connection)


def _serve_job(connection: socket.socket) -> None:
    """Take one job from `connection` (its script, `snakemake` object, folder and environment, its stdout
    and stderr as file descriptors), run it, and send back its status."""
    header, fds, _, _ = socket.recv_fds(connection, _LENGTH.size, 2)
    payload = _receive(connection, _LENGTH.unpack(header)[0]) if len(header) == _LENGTH.size else None
    if payload is None or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return
    request = pickle.loads(payload)
    connection.sendall(_TAKEN)
    done = threading.Event()

    def end_with_the_job() -> None:  # the job's process closed the connection before its status: stopped
        connection.recv(1)
        if not done.is_set():
            os._exit(1)

    threading.Thread(target=end_with_the_job, daemon=True).start()
    _serving["jobs"] += 1
    _serving["cpu"] = _cpu_seconds()
    status = _run(request, fds)
    done.set()
    connection.sendall(_STATUS.pack(status))


def _run(request: dict, fds: list[int]) -> int:
    """Run the request's script with its job, folder, environment and stdout/stderr; restore this
    process's after it. The script's exit status."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = [os.dup(1), os.dup(2)]
    saved_environ, saved_cwd = dict(os.environ), os.getcwd()
    for fd, target in zip(fds, (1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["environ"])
    os.chdir(request["cwd"])
    try:
        runpy.run_path(request["script"], init_globals={"snakemake": request["job"]}, run_name="__main__")
        status = 0
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        _tidy()
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, target in zip(saved_fds, (1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(saved_environ)
        os.chdir(saved_cwd)
    return status


def _exit_status(code) -> int:
    """The status `sys.exit(code)` gives a process (a message is printed, and is status 1)."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _tidy() -> None:
    """What one job leaves that the next must not inherit: the logging handlers (its log file), its
    tensors, the GPU memory the allocator keeps cached, the peak-memory counters."""
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
        handler.close()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def worker_job() -> dict | None:
    """In a worker: its pid, how many jobs it has taken (this one included) and this job's CPU seconds so
    far; None elsewhere."""
    if not _serving:
        return None
    return {"pid": _serving["pid"], "jobs": _serving["jobs"], "cpu_seconds": _cpu_seconds() - _serving["cpu"]}
