"""A one-node SLURM cluster on localhost for the tests, from Debian's slurm-wlm and munge.

`SlurmCluster(folder)` writes a slurm.conf for one node (this machine's CPUs), starts munged with
a fresh key, slurmctld and slurmd as root, each with its state, logs and socket in `folder` and on
free ports, and waits until `sinfo` shows the node idle. Clients find it through the SLURM_CONF
variable of `env`; nothing under /etc is read. There is no accounting database: `sacct` answers
nothing, so job states come from `squeue` (finished jobs stay listed for MinJobAge seconds).
`stop()` cancels the jobs still there and stops the daemons.

Inside a job the executor plugin runs `srun` without SLURM_* variables, SLURM_CONF included, so
there SLURM finds its config where a configless slurmd leaves it: /run/slurm/conf. The cluster
points that link at its folder while it runs, holding a lock so that two test sessions on one
machine take turns instead of sharing it.

The node declares `memory_mb` with `config_overrides`, so that the profile's memory requests are
checked by sbatch and the scheduler as on a real cluster; memory is not a consumable resource
here (CR_Core), and the jobs of the tiny config use little of it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
MIN_JOB_AGE = 3600  # squeue lists finished jobs this long; the plugin trusts squeue above 3 x its first poll
RUN_CONF = Path("/run/slurm/conf")
# What Snakemake needs on top of profiles/slurm for this cluster: it has no accounting database (sacct
# answers nothing, so job states come from squeue); its jobs take seconds, so polls are quick; and one
# thread a job lets two jobs share its two CPUs (each job is mostly two Snakemake start-ups).
SNAKEMAKE_ARGS = [
    "--slurm-status-command",
    "squeue",
    "--slurm-no-account",
    "--slurm-init-seconds-before-status-checks",
    "2",
    "--seconds-between-status-checks",
    "2",
    "--latency-wait",
    "5",
    "--max-threads",
    "1",
]  # where srun looks when neither SLURM_CONF nor /etc/slurm/slurm.conf is there


def missing_programs() -> list[str]:
    """The SLURM and munge programs this machine lacks (`.ci/run` installs them)."""
    return [name for name in (*DAEMONS, "sbatch", "squeue", "sinfo") if shutil.which(name, path=SBIN) is None]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slurm_conf(folder: Path, cpus: int, memory_mb: int) -> str:
    return f"""\
ClusterName=uph-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge/socket
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
MinJobAge={MIN_JOB_AGE}
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=main Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, folder: Path, memory_mb: int, cpus: int | None = None):
        if Path("/etc/slurm/slurm.conf").exists():
            raise RuntimeError("/etc/slurm/slurm.conf exists: srun inside the test's jobs would use that cluster")
        self.folder = Path(folder)
        self.conf = self.folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": SBIN}
        self.daemons: dict[str, subprocess.Popen] = {}
        munge = self.folder / "munge"
        for sub in ("state", "spool", "munge"):
            (self.folder / sub).mkdir(parents=True, mode=0o711)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(slurm_conf(self.folder, cpus or os.cpu_count(), memory_mb))
        RUN_CONF.parent.mkdir(parents=True, exist_ok=True)
        self.lock = open(RUN_CONF.parent / "conf.lock", "w")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            RUN_CONF.unlink(missing_ok=True)
            RUN_CONF.symlink_to(self.folder)
            self._start(
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={munge}/socket",
                f"--pid-file={munge}/pid",
                f"--log-file={munge}/log",
                f"--seed-file={munge}/seed",
            )
            self._wait(lambda: (munge / "socket").exists(), "munged's socket")
            self._start("slurmctld", "-D", "-f", str(self.conf))
            self._wait(lambda: self.run("sinfo").returncode == 0, "slurmctld to answer")
            self._start("slurmd", "-D", "-f", str(self.conf), "-N", "localhost")
            self._wait(lambda: self.run("sinfo", "-h", "-o", "%t").stdout.strip() == "idle", "the node to be idle")
        except BaseException:
            self.stop()
            raise

    def run(self, *command: str) -> subprocess.CompletedProcess:
        """A SLURM client command (sinfo, squeue, sbatch, ...) on this cluster."""
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=30)

    def _start(self, name: str, *args: str) -> None:
        with open(self.folder / f"{name}.out", "w") as out:
            self.daemons[name] = subprocess.Popen(
                [shutil.which(name, path=SBIN), *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [name for name, daemon in self.daemons.items() if daemon.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = {
                    p.name: p.read_text()[-1500:]
                    for p in sorted(self.folder.glob("*.log")) + sorted(self.folder.glob("*.out"))
                }
                raise RuntimeError(f"SLURM test cluster: gave up waiting for {what} (exited: {dead}): {logs}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel what is left, then stop slurmd, slurmctld and munged (in that order)."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--user", "root")
        for daemon in reversed(self.daemons.values()):
            daemon.terminate()
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        self.daemons = {}
        RUN_CONF.unlink(missing_ok=True)
        self.lock.close()
