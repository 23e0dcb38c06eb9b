"""Attention-study training steps with glibc's default heap thresholds against uph.heap.keep_freed_memory.

    .venv/bin/python benchmarks/bench_heap.py [--attentions triple_capped standard] [--runs 20] [--steps 20]
        [--repeats 3]

Each (kind, mode) trains `runs` runs of the default's residual model `steps` steps (benchmarks/
bench_attention_study.py's Runs: uph.attention.steps.TrainSteps on fresh loud_copy batches) in a fresh
process of one thread, after three unmeasured steps; repeats interleave the kinds and modes. Printed per kind
and mode, the median over repeats: page faults a step, user and system CPU ms a step, and kept / default.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, resource, sys
mode, kind, runs, steps, benchmarks = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if mode == "kept":
    from uph.heap import keep_freed_memory
    assert keep_freed_memory()
import torch
torch.set_num_threads(1)
sys.path.insert(0, benchmarks)
from bench_attention_study import Runs, config_section
from uph.attention.study_config import AttentionStudyConfig
cfg = AttentionStudyConfig.from_config(config_section(["config.yaml"]))
group = Runs(cfg, "residual", kind, range(runs), torch.device("cpu"))
for _ in range(3):
    group.step()
before = resource.getrusage(resource.RUSAGE_SELF)
for _ in range(steps):
    group.step()
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "faults": (after.ru_minflt - before.ru_minflt) / steps,
    "user_ms": 1e3 * (after.ru_utime - before.ru_utime) / steps,
    "system_ms": 1e3 * (after.ru_stime - before.ru_stime) / steps,
}))
"""
MODES = ("default", "kept")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attentions", nargs="+", default=["triple_capped", "standard"])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    benchmarks = str(Path(__file__).resolve().parent)
    measured = {(kind, mode): [] for kind in args.attentions for mode in MODES}
    for _ in range(args.repeats):
        for kind in args.attentions:
            for mode in MODES:
                command = [sys.executable, "-c", CHILD, mode, kind, str(args.runs), str(args.steps), benchmarks]
                out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                measured[kind, mode].append(json.loads(out.splitlines()[-1]))
    print(f"{args.runs} runs, {args.steps} steps, median of {args.repeats}: per step")
    for kind in args.attentions:
        median = {
            mode: {key: statistics.median(row[key] for row in measured[kind, mode]) for key in measured[kind, mode][0]}
            for mode in MODES
        }
        for mode in MODES:
            m = median[mode]
            print(
                f"{kind:15s} {mode:8s} faults {m['faults']:8.0f}  user {m['user_ms']:7.1f} ms  "
                f"system {m['system_ms']:5.1f} ms"
            )
        cpu = {mode: median[mode]["user_ms"] + median[mode]["system_ms"] for mode in MODES}
        print(f"{kind:15s} kept / default CPU: {cpu['kept'] / cpu['default']:.3f}")


if __name__ == "__main__":
    main()
