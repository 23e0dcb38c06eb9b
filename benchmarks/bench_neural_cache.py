"""The neural cache's distances: blocked matrix products against the straightforward loop.

For n queries against a datastore of m entries of width H, log p_cache(y_t | h_t) at T temperatures
needs every distance ‖h_t - h_i‖², 3 n m H FLOPs as differences, 2 n m H as the product h_t · h_i
(uph.lm.engine.neural_cache: ‖h‖² - 2 h·h_i + ‖h_i‖², a block of queries against the whole datastore at a
time, 64 MB of scores). The reference is what the method's description suggests: per query, the
differences to every entry, their squared norms, and the two log-sum-exps. Both run side by side on the
same random states (float32) at the default study's sizes: a user's held-out tokens against the pooled
datastore (8,192 entries) and against its own train tokens. float32 only: in bfloat16 the expanded
distance ‖h‖² - 2 h·h_i + ‖h_i‖² would lose ~16 of a nearest neighbour's ~360 (‖h‖² ~ 2,000, 8 bits of
mantissa) to cancellation.

    .venv/bin/python benchmarks/bench_neural_cache.py [--queries 281] [--pool 8192] [--own 1637] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from uph.lm.engine.neural_cache import Datastore, log_cache_probabilities

TEMPERATURES = (0.03, 0.1, 0.3, 1.0, 3.0)  # fit.temperatures' default


def reference(store: Datastore, hidden, targets, temperatures) -> dict:
    """One query at a time: its differences to every entry, then the log-sum-exps."""
    out = {t: torch.empty(len(targets), dtype=torch.float64) for t in temperatures}
    for j, (h, y) in enumerate(zip(hidden, targets)):
        squared = (store.keys - h).square().sum(1)
        for t in temperatures:
            s = -squared / (t * store.hidden_size)
            out[t][j] = float(torch.logsumexp(s[store.values == y], 0) - torch.logsumexp(s, 0))
    return out


def timed(function, *arguments, repeats: int = 3) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function(*arguments)
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=281)
    parser.add_argument("--pool", type=int, default=8192)
    parser.add_argument("--own", type=int, default=1637)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--vocab", type=int, default=2000, help="distinct next tokens in the datastore")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(args.queries, args.hidden, generator=generator) * 1.9
    targets = torch.randint(args.vocab, (args.queries,), generator=generator)
    print(f"{args.queries} queries, H {args.hidden}, {len(TEMPERATURES)} temperatures, {args.threads} thread(s)")
    for name, m in (("pooled", args.pool), ("own", args.own)):
        keys = torch.randn(m, args.hidden, generator=generator) * 1.9
        store = Datastore.of_user(keys, torch.randint(args.vocab, (m,), generator=generator), 0)
        blocked, ours = timed(log_cache_probabilities, store, queries, targets, TEMPERATURES)
        loop, theirs = timed(reference, store, queries, targets, TEMPERATURES, repeats=1)
        error = max(float(torch.where(ours[t] == theirs[t], 0, ours[t] - theirs[t]).abs().max()) for t in TEMPERATURES)
        gflop = 2 * args.queries * m * args.hidden / 1e9
        print(
            f"{name:>6} datastore, m = {m}: blocked {blocked * 1e3:.1f} ms ({gflop / blocked:.1f} GFLOP/s on the "
            f"products), per-query loop {loop * 1e3:.0f} ms: {loop / blocked:.0f}x; max |difference| {error:.1e} nats"
        )


if __name__ == "__main__":
    main()
