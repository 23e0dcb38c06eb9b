"""The capacity path's cost against the landed single fit, side by side on the same users.

Reference (the fit stage before the capacity path): each arm fitted once, cold, at seed 002's radius 5 on all of
the user's train tokens. Now (uph.lm.jobs.validate, uph.lm.jobs.refit): each arm's path over fit.radii on the user's fit part
(warm, uph.lm.engine.fit.fit_path; the validate job), then one refit on all train tokens (the fit job) at the
grid's middle radius (a stand-in: the choice needs every user). Both run here on the same cached users of a finished study, one thread, the personal and
residual arms of every method (heads and the full bias), the exact solver; the residuals sit on the
study's global thetas.

    .venv/bin/python benchmarks/bench_capacity.py --results results [--users 2] [--threads 1]
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
from finished_study import arguments, shard_zero

from uph.lm.engine.fit import SEED_RADIUS, fit_path, fit_theta
from uph.lm.engine.tokens import validation_split
from uph.lm.jobs.fit_job import global_thetas, prepared


def main() -> None:
    args = arguments(__doc__.splitlines()[0], users=2)
    fit, job = shard_zero(args.results)
    table = pd.concat(
        map(pd.read_parquet, sorted((Path(args.results) / "fit" / "global").glob("method~*/thetas.parquet")))
    )
    thetas_g, thetas_g_fit = global_thetas(table), global_thetas(table, "theta_fit")
    radii, settings = fit.capacity.radii, fit.solver
    rows = []
    for states in list(job.users.values())[: args.users]:
        train, _ = prepared(states, job.layer, job.device)
        fit_part, _ = validation_split(train, fit.capacity.validation_fraction, job.gap)
        for point, head in job.heads.items():
            for arm in ("personal", "residual"):
                offset, offset_fit = (
                    (None, None) if arm == "personal" else (thetas_g[point, "exact"], thetas_g_fit[point, "exact"])
                )
                start = time.perf_counter()
                fit_theta(train, head, "exact", settings, SEED_RADIUS, offset)
                single = time.perf_counter() - start
                start = time.perf_counter()
                path = fit_path(fit_part, head, "exact", settings, radii, offset_fit)
                walked = time.perf_counter() - start
                start = time.perf_counter()
                fit_theta(train, head, "exact", settings, path[len(path) // 2][1].radius, offset)
                refit = time.perf_counter() - start
                rows.append({"method": point.head, "arm": arm, "single": single, "path": walked, "refit": refit})
    times = pd.DataFrame(rows).groupby("method")[["single", "path", "refit"]].sum()
    times.loc["all"] = times.sum()
    times["ratio"] = (times["path"] + times["refit"]) / times["single"]
    print(f"{args.users} users, radii {radii}, exact solver, threads {args.threads}; seconds, personal + residual arms")
    print(times.round(2).to_string())


if __name__ == "__main__":
    main()
