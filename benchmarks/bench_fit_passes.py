"""The fit engine's passes over p0 (uph.lm.engine.objective), each against the code it replaced, side by side.

On one user's fit part of a finished study (the default's shapes: V = 49,152, about 1,300 tokens, d = 32),
one thread, each pair timed alternately in the same process (the minimum of `--repeats`):

- an unconditional head's gradient pass, Σ_t p0_t / Z_t: MKL's matrix-vector product `p0 @ w` (before)
  against Objective._row_sums, each vocabulary block multiplied and summed; then one evaluation of J with its
  gradient (svd_uncond, the full bias) each way, and how far apart their values are;
- the full bias's curvature (Objective._bias_variance) against the expression it replaced, bit for bit;
- the evaluations of a head on a cache's mixture (Tokens.mixed), its probabilities mixed as each pass reads
  them (before: budget 0) against kept once, bit for bit.

    .venv/bin/python benchmarks/bench_fit_passes.py --results <study>/results [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import torch
from finished_study import shard_zero

from uph.lm.engine.objective import Objective
from uph.lm.engine.tokens import Mixture, prepare, validation_split


def timed(pairs: dict, repeats: int) -> dict:
    """name -> the least seconds of `repeats` calls of each function of `pairs`, alternating; and its result."""
    seconds, results = {name: [] for name in pairs}, {}
    for _ in range(repeats):
        for name, run in pairs.items():
            start = time.perf_counter()
            results[name] = run()
            seconds[name].append(time.perf_counter() - start)
    return {name: (min(times), results[name]) for name, times in seconds.items()}


def product(self, p0, weights):
    """The gradient pass as it was: one matrix-vector product."""
    return p0 @ weights


def bias_variance_before(self) -> torch.Tensor:
    """Objective._variance for P = I as it was: a fresh [c, V] tensor per operation."""
    total = torch.zeros(self.d, dtype=torch.float64, device=self.device)
    for i, (_, p0) in enumerate(self.tokens.probabilities()):
        probabilities = (p0 / p0.sum(dim=0)).T
        variance = probabilities - probabilities.square()
        total += (self._a(i).square() * variance).sum(0, dtype=torch.float64)
    return total / self.tokens.n


def report(name: str, found: dict, before: str, after: str, note: str) -> None:
    ratio = found[before][0] / found[after][0]
    print(f"{name:<44}{found[before][0] * 1e3:9.1f} ms {found[after][0] * 1e3:9.1f} ms {ratio:6.2f}x  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="results", help="a finished study's results folder (read only)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    fit, job = shard_zero(args.results)
    user, states = next(iter(job.users.items()))
    train = prepare(states.train_hidden, states.train_targets, job.layer, device=job.device)
    fit_part, _ = validation_split(train, fit.capacity.validation_fraction, job.gap)
    heads = {point.head: head for point, head in job.heads.items()}
    settings = fit.solver
    V, n = job.layer.W.shape[0], fit_part.n
    print(f"{user}'s fit part: {n} tokens, V = {V}, one thread; before, after (least of {args.repeats})")

    objective = Objective(fit_part, heads["svd_uncond"], settings.beta, settings.lam)
    p0 = fit_part.chunks[0].p0
    weights = torch.rand(p0.shape[1], generator=torch.Generator().manual_seed(0)) + 0.5
    found = timed({"before": lambda: p0 @ weights, "after": lambda: objective._row_sums(p0, weights)}, args.repeats)
    apart = float(((found["before"][1] - found["after"][1]).abs() / found["before"][1].abs()).max())
    report(f"gradient pass, one chunk [V, {p0.shape[1]}]", found, "before", "after", f"rows {apart:.1e} apart")
    for name in ("svd_uncond", "full_bias"):
        objective = Objective(fit_part, heads[name], settings.beta, settings.lam)
        theta = torch.randn(objective.d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        theta *= 0.5 / theta.norm()

        def before(objective=objective, theta=theta):
            with mock.patch.object(Objective, "_row_sums", product):
                return objective(theta)

        found = timed({"before": before, "after": lambda objective=objective, theta=theta: objective(theta)}, 3)
        old, new = found["before"][1], found["after"][1]
        grad = float((old.grad - new.grad).norm() / old.grad.norm())
        note = f"J {abs(old.objective - new.objective) / abs(old.objective):.1e}, gradient {grad:.1e} apart"
        report(f"{name}: J and its gradient", found, "before", "after", note)

    objective = Objective(fit_part, heads["full_bias"], settings.beta, settings.lam)
    found = timed({"before": lambda: bias_variance_before(objective), "after": objective._bias_variance}, 3)
    same = torch.equal(found["before"][1], found["after"][1])
    report("full bias: curvature at the base", found, "before", "after", "bit for bit" if same else "DIFFERENT")

    mixture = Mixture(0.7, torch.full((V,), 0.3 / V, dtype=job.layer.W.dtype))
    as_read, kept = fit_part.mixed(mixture, budget=0), fit_part.mixed(mixture)
    for name in ("svd_uncond", "svd_cvh"):
        pair = [Objective(tokens, heads[name], settings.beta, settings.lam) for tokens in (as_read, kept)]
        theta = torch.full((pair[0].d,), 0.1, dtype=torch.float64)
        runs = {when: lambda one=one, theta=theta: one(theta) for when, one in zip(("before", "after"), pair)}
        found = timed(runs, 3)
        old, new = found["before"][1], found["after"][1]
        same = old.objective == new.objective and torch.equal(old.grad, new.grad)
        note = "bit for bit" if same else "DIFFERENT"
        report(f"{name} on a mixture: J and its gradient", found, "before", "after", note)


if __name__ == "__main__":
    main()
