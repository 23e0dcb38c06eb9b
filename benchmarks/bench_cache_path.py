"""A head's path of radii on a cache's mixture, against the same path on the model alone.

A head on a cache (fit.on_cache) is fitted on the cache's residual-arm mixture: every evaluation mixes
each chunk's p0 as it reads it (uph.lm.engine.tokens.Mixture: p0 times weight / Σ_v p0, computed once per token,
plus the floors), where the model alone reads p0 as it is. Both paths run side by side on the same
users of a finished study (the neural cache's datastore and choices computed here, as its global job
does), with the exact solver at every radius of config.yaml:

    .venv/bin/python benchmarks/bench_cache_path.py --results results [--users 2] [--threads 1]
"""

from __future__ import annotations

import time

from finished_study import arguments, shard_zero

from uph.lm.engine.baselines import hidden_of, targets_of
from uph.lm.engine.fit import fit_path
from uph.lm.engine.neural_cache import NeuralCache
from uph.lm.engine.tokens import prepare, validation_split
from uph.lm.jobs.global_fit import global_neural_cache


def main() -> None:
    args = arguments(__doc__.splitlines()[0], users=2)
    fit, job = shard_zero(args.results)
    settings, datastore, _ = global_neural_cache(job, fit)
    cache = NeuralCache.from_tables(settings, datastore, job.device)
    point = next(point for point, _, name in fit.on_cache if name == "neural_cache")
    head, radii = job.heads[point], fit.capacity.radii
    print(f"{point.label}, exact solver, radii {radii}")
    for user, states in list(job.users.items())[: args.users]:
        train = prepare(states.train_hidden, states.train_targets, job.layer, device=job.device)
        fit_part, _ = validation_split(train, fit.capacity.validation_fraction, job.gap)
        own = cache.own(user, hidden_of(fit_part), targets_of(fit_part))
        start = time.perf_counter()
        mixed = cache.mixed(fit_part, own, True, cache.owners[user], job.gap)
        floors = time.perf_counter() - start
        seconds = {}
        for name, tokens in (("model", fit_part), ("mixture", mixed)):
            start = time.perf_counter()
            path = fit_path(tokens, head, "exact", fit.solver, radii, user=user)
            seconds[name] = time.perf_counter() - start, sum(result.evaluations for _, result in path)
        (model, n_model), (mixture, n_mixture) = seconds["model"], seconds["mixture"]
        print(
            f"{user}: {fit_part.n} fit-part tokens; floors {floors:.2f} s; path on the model {model:.2f} s "
            f"({n_model} evaluations), on the mixture {mixture:.2f} s ({n_mixture}): {mixture / model:.2f}x"
        )


if __name__ == "__main__":
    main()
