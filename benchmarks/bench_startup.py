"""Start-up: what a workflow job pays before its own work: its imports, and on a GPU the CUDA set-up.

Imports. Every job runs its script under Snakemake's script wrapper: a fresh interpreter whose preamble
unpickles the `snakemake` object (snakemake.iocontainers) and imports snakemake.logging, then runs the
script, whose module-level import lines come first. For each workflow_scripts/*.py this runs

    python -X importtime -c "<the wrapper's imports>; <the script's module-level import lines>"

--runs times (from the repository root, fresh processes) and reports the median wall time of the process
(start to exit) and the median import time by top-level package (the `self` times of -X importtime summed
over each package's modules: torch, transformers, pandas, pyarrow, snakemake, uph, ...; the standard
library and small packages are `other`). Imports inside functions are paid only by the jobs that call them,
and are not counted here.

CUDA set-up (skipped, with a message, where torch sees no GPU). Paid once per process, before the first
forward; timed piece by piece in a fresh process per run, in the order a job meets them (uph.device.
setup_device, then the work): import torch, torch.cuda.is_available (resolve_device), torch.cuda.init,
the first context (a 1-element tensor on the device), use_deterministic_algorithms, the first cuBLAS handle
(an 8x8 matmul, with CUBLAS_WORKSPACE_CONFIG set as setup_device sets it), the first large allocation
(1 GiB) and a second one.

`--repos A B` measures the scripts and uph of several checkouts (e.g. an older commit's, unpacked with
`git archive <commit> uph workflow_scripts schemas | tar -x -C /tmp/before`), run by run in turn so that machine
noise hits them alike, and prints each one's table and the differences (B - A).

    .venv/bin/python benchmarks/bench_startup.py [--runs 5] [--scripts extract fit ...] [--repos . /tmp/before]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "workflow_scripts"
# What the wrapper's preamble imports before the script (snakemake.script.PythonScript.generate_preamble).
WRAPPER = "import pickle; from snakemake.logging import logger; from snakemake.iocontainers import Snakemake"
PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "numpy",
    "pandas",
    "pyarrow",
    "scipy",
    "matplotlib",
    "jsonschema",
    "yaml",
    "snakemake",
    "uph",
)


def script_imports(path: Path) -> str:
    """The module-level import lines of a workflow script, as one line of Python."""
    tree = ast.parse(path.read_text())
    lines = [
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom) and getattr(node, "module", None) != "__future__"
    ]
    return "; ".join(lines)


def group(module: str) -> str:
    top = module.strip().split(".")[0]
    if top in ("referencing", "jsonschema_specifications", "rpds"):
        return "jsonschema"
    return top if top in PACKAGES else "other"


def import_times(code: str, repo: Path = REPO) -> tuple[float, dict[str, float]]:
    """(wall seconds of `python -X importtime -c code` run in `repo`, {package: seconds of its modules'
    own import time})."""
    env = {**os.environ, "PYTHONPATH": str(repo)}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], cwd=repo, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{code!r} failed:\n{done.stderr[-2000:]}")
    by_package: dict[str, float] = defaultdict(float)
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, module = line.removeprefix("import time:").split("|")
        by_package[group(module)] += int(self_us) / 1e6
    return wall, dict(by_package)


def bench_imports(names: list[str], runs: int, repos: list[Path]) -> dict[str, dict[str, dict]]:
    """{repo: {script: medians}}, the repos' runs of each script interleaved."""
    results: dict[str, dict[str, dict]] = {str(repo): {} for repo in repos}
    for name in names:
        codes = {repo: f"{WRAPPER}; {script_imports(repo / 'workflow_scripts' / f'{name}.py')}" for repo in repos}
        samples: dict[Path, list] = {repo: [] for repo in repos}
        for _ in range(runs):
            for repo in repos:
                samples[repo].append(import_times(codes[repo], repo))
        for repo in repos:
            packages = sorted({p for _, by in samples[repo] for p in by})
            results[str(repo)][name] = {
                "wall_s": statistics.median(w for w, _ in samples[repo]),
                "imports_s": statistics.median(sum(by.values()) for _, by in samples[repo]),
                "by_package_s": {p: statistics.median(by.get(p, 0.0) for _, by in samples[repo]) for p in packages},
            }
    return results


def print_table(imports: dict[str, dict], shown: list[str]) -> None:
    print(f"{'script':<26}{'process':>8}{'imports':>8}" + "".join(f"{p[:11]:>12}" for p in shown) + f"{'other':>8}")
    for name, r in imports.items():
        by = r["by_package_s"]
        cells = "".join(f"{by.get(p, 0) * 1e3:>12.0f}" for p in shown)
        print(f"{name:<26}{r['wall_s'] * 1e3:>8.0f}{r['imports_s'] * 1e3:>8.0f}{cells}{by.get('other', 0) * 1e3:>8.0f}")


CUDA_PIECES = r"""
import json, os, time
t = {}
def step(name, fn):
    start = time.perf_counter(); fn(); t[name] = time.perf_counter() - start
step("import torch", lambda: __import__("torch"))
import torch
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
if not torch.cuda.is_available():
    print(json.dumps(None)); raise SystemExit
step("torch.cuda.is_available", torch.cuda.is_available)
step("torch.cuda.init", torch.cuda.init)
step("first context (1-element tensor)", lambda: (torch.zeros(1, device="cuda"), torch.cuda.synchronize()))
def numerics():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True, warn_only=True)
step("use_deterministic_algorithms (+ TF32 off)", numerics)
a = torch.ones(8, 8, device="cuda")
step("first cuBLAS handle (8x8 matmul)", lambda: (a @ a, torch.cuda.synchronize()))
step("first large allocation (1 GiB)", lambda: (torch.empty(1 << 30, dtype=torch.uint8, device="cuda"), torch.cuda.synchronize()))
step("second large allocation (1 GiB)", lambda: (torch.empty(1 << 30, dtype=torch.uint8, device="cuda"), torch.cuda.synchronize()))
t["device"] = torch.cuda.get_device_name()
print(json.dumps(t))
"""


def bench_cuda(runs: int) -> dict | None:
    samples = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", CUDA_PIECES], capture_output=True, text=True, check=True)
        sample = json.loads(done.stdout.strip().splitlines()[-1])
        if sample is None:
            return None
        samples.append(sample)
    device = samples[0].pop("device")
    for sample in samples[1:]:
        sample.pop("device")
    return {"device": device, **{k: statistics.median(s[k] for s in samples) for k in samples[0]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--scripts", nargs="*", help="workflow script names (default: every workflow_scripts/*.py)")
    parser.add_argument("--repos", nargs="*", type=Path, help="checkouts to measure (default: this one)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--no-cuda", action="store_true", help="skip the CUDA set-up")
    args = parser.parse_args()
    repos = [repo.resolve() for repo in args.repos or [REPO]]
    names = args.scripts or sorted(p.stem for p in SCRIPTS.glob("*.py"))

    baseline = {"python (nothing)": import_times("pass"), "wrapper only": import_times(WRAPPER)}
    imports = bench_imports(names, args.runs, repos)
    every = [r for table in imports.values() for r in table.values()]
    shown = [p for p in PACKAGES if any(r["by_package_s"].get(p, 0) >= 0.005 for r in every)]
    print(f"python {sys.version.split()[0]}, {args.runs} runs each, medians in ms")
    for what, (wall, _) in baseline.items():
        print(f"{what}: process {wall * 1e3:.0f} ms")
    for repo, table in imports.items():
        print(f"\n{repo}:")
        print_table(table, shown)
    if len(repos) == 2:
        a, b = (imports[str(repo)] for repo in repos)
        print(f"\ndifferences, {repos[1]} - {repos[0]} (ms; negative: {repos[1]} is faster):")
        print(f"{'script':<26}{'process':>8}{'imports':>8}" + "".join(f"{p[:11]:>12}" for p in shown))
        for name in names:
            da, db = a[name]["by_package_s"], b[name]["by_package_s"]
            cells = "".join(f"{(db.get(p, 0) - da.get(p, 0)) * 1e3:>12.0f}" for p in shown)
            wall, total = (b[name][k] - a[name][k] for k in ("wall_s", "imports_s"))
            print(f"{name:<26}{wall * 1e3:>8.0f}{total * 1e3:>8.0f}{cells}")

    cuda = None
    if not args.no_cuda:
        cuda = bench_cuda(args.runs)
        if cuda is None:
            print("CUDA set-up: skipped (torch sees no CUDA device here)")
        else:
            print(f"CUDA set-up on {cuda['device']} (fresh process, median of {args.runs}):")
            for step, seconds in cuda.items():
                if step != "device":
                    print(f"  {step:<44}{seconds * 1e3:>8.0f} ms")
    if args.json:
        figures = {"runs": args.runs, "baseline": baseline, "imports": imports, "cuda": cuda}
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
