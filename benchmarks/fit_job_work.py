"""The work of one fit-stage job: the FLOPs of its matrix products and the bytes of p0 its passes read.

A fit-stage job (validate, fit) spends its time in uph.lm.engine.objective's evaluations. This runs one job's
script as Snakemake kept it and counts, as it runs:

- products: torch.mm and Tensor.addmm_, 2 m k n FLOPs each (a conditional head's two products a
  vocabulary block: P_v u^T and P_v^T e);
- p0 passes: an unconditional head's two passes over each chunk of p0 [V, c] an evaluation, the products
  p_v e_v into the work block (torch.mul with `out`) and the gradient's p0 @ (1 / Z) (Tensor.__matmul__ of a
  [V, c] matrix and a vector), the bytes of p0 each reads.

Its floor at a core's rates is then products / (the core's float32 product rate) plus one pass over p0
/ (its memory bandwidth). Keep the script of a job, then count it (the job's outputs are written again):

    snakemake --cores 1 --configfile config.yaml --skip-script-cleanup -f 'results/fit/job~0/validation.parquet' \
        --allowed-rules validate
    .venv/bin/python benchmarks/fit_job_work.py .snakemake/scripts/tmp*.fit_validate.py
"""

from __future__ import annotations

import atexit
import sys
from collections import Counter

import torch

VOCAB_ROWS = 10_000  # a p0 chunk has V rows (49,152 for SmolLM2); the job's other operands have far fewer

counts = Counter()
mm, addmm_, matmul, mul = torch.mm, torch.Tensor.addmm_, torch.Tensor.__matmul__, torch.mul


def count_product(a, b) -> None:
    """2 m k n FLOPs of a [m, k] x [k, n] product."""
    counts["product FLOPs"] += 2 * a.shape[0] * a.shape[1] * b.shape[1]


def counted_mm(a, b, **options):
    count_product(a, b)
    return mm(a, b, **options)


def counted_addmm_(self, a, b, **options):
    count_product(a, b)
    return addmm_(self, a, b, **options)


def counted_matmul(a, b):
    if a.dim() == 2 and b.dim() == 1 and a.shape[0] > VOCAB_ROWS:
        counts["p0 bytes, gradient pass"] += a.numel() * a.element_size()
    return matmul(a, b)


def counted_mul(a, b, **options):
    if "out" in options and a.dim() == 2:
        counts["p0 bytes, partition pass"] += a.numel() * a.element_size()
    return mul(a, b, **options)


def report() -> None:
    print(f"products: {counts['product FLOPs'] / 1e12:.3f} TFLOP", file=sys.stderr)
    for name in ("p0 bytes, partition pass", "p0 bytes, gradient pass"):
        print(f"{name}: {counts[name] / 1e9:.1f} GB", file=sys.stderr)


if __name__ == "__main__":
    torch.mm, torch.Tensor.addmm_, torch.Tensor.__matmul__, torch.mul = (
        counted_mm,
        counted_addmm_,
        counted_matmul,
        counted_mul,
    )
    atexit.register(report)
    script = sys.argv[1]
    exec(compile(open(script).read(), script, "exec"), {"__name__": "__main__", "__file__": script})
