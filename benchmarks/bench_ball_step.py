"""The exact solver's host work per step: the BFGS model minimized over the ball (uph.lm.engine.solvers), on the CPU.

On a GPU an evaluation's kernels take well under a millisecond, so the solver's step on the host (an
eigendecomposition of the d x d model and a search for the ball's multiplier) is what a fit in lockstep
waits on. This times it at d = 32 on steps that leave the ball (the multiplier's search runs), for the checkouts
named (each imported from its own folder, in fresh processes, interleaved): one model at a time, and,
where the checkout batches a round's models (uph.lm.engine.solvers.ball_model_minimizers), `--users`
models at once against the same models one at a time, side by side in the same process:

    .venv/bin/python benchmarks/bench_ball_step.py [--checkouts . /tmp/f5a67cd] [--repeats 5] [--users 6 12]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, sys, time, torch
torch.set_num_threads(1)
try:
    from uph.lm.engine.solvers import BallModel, ball_model_minimizers
except ImportError:  # a checkout from before the batched step
    from uph.lm.engine.solvers import _ball_model_minimizer
    BallModel = None
generator = torch.Generator().manual_seed(0)
d, users = 32, json.loads(sys.argv[1])
models = []
for _ in range(max(users, default=1)):
    A = torch.randn(d, d, dtype=torch.float64, generator=generator)
    B = A @ A.T + torch.eye(d, dtype=torch.float64)
    theta = torch.randn(d, dtype=torch.float64, generator=generator)
    grad = 10 * torch.randn(d, dtype=torch.float64, generator=generator)
    models.append((theta, grad, B, 0.5))

def alone(model):
    if BallModel is None:
        return _ball_model_minimizer(*model)
    return ball_model_minimizers([BallModel(*model)])[0]

def timed(step, n):
    for _ in range(20):
        step()
    start = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - start) / n * 1e6

found = {"alone": timed(lambda: alone(models[0]), 500), "x": alone(models[0]).tolist(), "batched": {}}
for u in users if BallModel is not None else []:
    batch = [BallModel(*model) for model in models[:u]]
    ys = ball_model_minimizers(batch)
    assert all(torch.equal(y, alone(model)) for y, model in zip(ys, models)), "a batched step differs from its own"
    found["batched"][u] = (timed(lambda: ball_model_minimizers(batch), 100), timed(lambda: [alone(m) for m in models[:u]], 100))
import uph
found["uph"] = uph.__file__
print(json.dumps(found))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkouts", nargs="+", default=["."])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--users", type=int, nargs="*", default=[6, 12])
    args = parser.parse_args()
    runs = {checkout: [] for checkout in args.checkouts}
    for _ in range(args.repeats):
        for checkout in args.checkouts:
            folder = str(Path(checkout).resolve())  # `-c` puts the working folder first on sys.path
            env = {**os.environ, "PYTHONPATH": folder, "OMP_NUM_THREADS": "1"}
            run = [sys.executable, "-c", CHILD, json.dumps(args.users)]
            out = subprocess.run(run, env=env, cwd=folder, capture_output=True, text=True, check=True)
            found = json.loads(out.stdout)
            assert found["uph"].startswith(folder), (found["uph"], folder)
            runs[checkout].append(found)
    first = runs[args.checkouts[0]][0]["x"]
    for checkout, found in runs.items():
        x = found[0]["x"]
        apart = math.dist(x, first) / math.hypot(*first)
        same = "bit-identical step" if x == first else f"the step {apart:.1e} (relative) from the first checkout's"
        alone = statistics.median(f["alone"] for f in found)
        print(f"{checkout:<24} {alone:8.1f} us a step alone (median of {args.repeats}), {same}")
        for u in found[0]["batched"]:
            batched = statistics.median(f["batched"][u][0] for f in found)
            one_by_one = statistics.median(f["batched"][u][1] for f in found)
            print(
                f"{'':<24} {u} models: batched {batched:8.1f} us ({batched / int(u):6.1f} a model), "
                f"one at a time {one_by_one:8.1f} us: {one_by_one / batched:4.2f}x, each the same bit for bit"
            )


if __name__ == "__main__":
    main()
