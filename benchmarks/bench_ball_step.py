"""The exact solver's host work per step: the BFGS model minimized over the ball (uph.lm.engine.solvers), on the CPU.

On a GPU an evaluation's kernels take well under a millisecond, so the solver's step on the host (an
eigendecomposition of the d x d model and a bisection for the ball's multiplier) is what a fit in lockstep
waits on. This times it at d = 32 on a step that leaves the ball (the bisection runs), for the checkouts
named (each imported from its own folder, in fresh processes, interleaved):

    .venv/bin/python benchmarks/bench_ball_step.py [--checkouts . /tmp/f5a67cd] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, time, torch
from uph.lm.engine.solvers import _ball_model_minimizer
torch.set_num_threads(1)
generator = torch.Generator().manual_seed(0)
d = 32
A = torch.randn(d, d, dtype=torch.float64, generator=generator)
B = A @ A.T + torch.eye(d, dtype=torch.float64)
theta = torch.randn(d, dtype=torch.float64, generator=generator)
grad = 10 * torch.randn(d, dtype=torch.float64, generator=generator)
for _ in range(50):
    x = _ball_model_minimizer(theta, grad, B, 0.5)
n, start = 500, time.perf_counter()
for _ in range(n):
    x = _ball_model_minimizer(theta, grad, B, 0.5)
import uph
print(json.dumps({"us": (time.perf_counter() - start) / n * 1e6, "x": x.tolist(), "uph": uph.__file__}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkouts", nargs="+", default=["."])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    times = {checkout: [] for checkout in args.checkouts}
    steps = {}
    for _ in range(args.repeats):
        for checkout in args.checkouts:
            folder = str(Path(checkout).resolve())  # `-c` puts the working folder first on sys.path
            env = {**os.environ, "PYTHONPATH": folder, "OMP_NUM_THREADS": "1"}
            run = [sys.executable, "-c", CHILD]
            out = subprocess.run(run, env=env, cwd=folder, capture_output=True, text=True, check=True)
            found = json.loads(out.stdout)
            times[checkout].append(found["us"])
            steps[checkout] = found["x"]
            assert found["uph"].startswith(folder), (found["uph"], folder)
    first = args.checkouts[0]
    for checkout in args.checkouts:
        same = "bit-identical step" if steps[checkout] == steps[first] else "a different step"
        print(f"{checkout:<24} {statistics.median(times[checkout]):8.1f} us a step (median of {args.repeats}), {same}")


if __name__ == "__main__":
    main()
