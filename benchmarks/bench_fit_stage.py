"""The fit stage's layout: p0 once per user for every sweep point, against p0 once per (user, point).

Before (the layout of one job per sweep point): every job prepared each user's tokens again, so a
user's base distribution p0 (the V×H products, 2 n V H FLOPs) was computed once per point, and the
global control's jobs computed every user's p0 once more per point. Now (uph.lm.jobs.refit.fit_users):
each fit job prepares each of its users once and fits every point on it. Both variants below run the
same fits (each point's personal theta with the exact solver) on the same cached users of a study,
side by side in one process; only where p0 is computed differs.

    .venv/bin/python benchmarks/bench_fit_stage.py --results results [--users 4] [--threads 1]
"""

from __future__ import annotations

import time

from finished_study import arguments, shard_zero

from uph.lm.engine.fit import fit_theta
from uph.lm.jobs.fit_job import prepared


def main() -> None:
    args = arguments(__doc__.splitlines()[0], users=4)
    fit, job = shard_zero(args.results)
    layer, device = job.layer, job.device
    heads = {point: head for point, head in job.heads.items() if point in fit.points}  # the heads, not the full bias
    users = dict(list(job.users.items())[: args.users])
    settings = fit.solver

    def per_point():
        for head in heads.values():
            for states in users.values():
                train, _ = prepared(states, layer, device)
                fit_theta(train, head, "exact", settings)

    def once():
        for states in users.values():
            train, _ = prepared(states, layer, device)
            for head in heads.values():
                fit_theta(train, head, "exact", settings)

    timings = {}
    for name, run in (("p0 per (user, point)", per_point), ("p0 once per user", once)):
        start = time.perf_counter()
        run()
        timings[name] = time.perf_counter() - start
    tokens = sum(len(s.train_targets) + len(s.test_targets) for s in users.values())
    print(f"{len(users)} users ({tokens} tokens), {len(heads)} points, exact solver, threads {args.threads}")
    base = timings["p0 per (user, point)"]
    for name, seconds in timings.items():
        print(f"{name:<24}{seconds:>8.1f} s{base / seconds:>8.2f} x")


if __name__ == "__main__":
    main()
