"""What a step's aten ops cost, op by op: OpTimes, the training-step profiles of
benchmarks/bench_attention_study.py --profile and benchmarks/bench_copy_task.py.

torch.profiler's own cost per op made its figures several times an unprofiled step's at these sizes (AMD EPYC,
torch 2.13.0+cpu); a TorchDispatchMode timing each op's own call costs nothing inside the timed call.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

KINDS = ("products", "elementwise", "reductions", "copies and views", "other")

PRODUCTS = ("mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "_scaled_dot_product", "addmv", "mv", "dot")
REDUCTIONS = (
    "sum",
    "mean",
    "norm",
    "softmax",
    "amax",
    "max",
    "min",
    "all",
    "any",
    "logsumexp",
    "nll_loss",
    "_log_softmax",
)
COPIES = (
    "copy_",
    "to",
    "_to_copy",
    "cat",
    "stack",
    "index",
    "gather",
    "scatter",
    "embedding",
    "clone",
    "contiguous",
    "masked_fill",
    "where",
    "fill_",
    "zero_",
    "empty",
    "zeros",
    "ones",
    "full",
    "arange",
    "triu",
)


def op_kind(name: str) -> str:
    op = name.removeprefix("aten::")
    if op.startswith(PRODUCTS):
        return "products"
    if op.startswith(REDUCTIONS) or "softmax" in op:
        return "reductions"
    if op.startswith(COPIES) or op in (
        "view",
        "reshape",
        "permute",
        "transpose",
        "expand",
        "select",
        "slice",
        "unsqueeze",
        "squeeze",
        "t",
        "unbind",
        "split",
        "chunk",
        "as_strided",
        "flatten",
        "detach",
        "alias",
        "narrow",
        "view_as",
        "unflatten",
    ):
        return "copies and views"
    if op.endswith("_backward") or "Backward" in op:
        return "other"
    return "elementwise" if op[0].isalpha() else "other"


class OpTimes(TorchDispatchMode):
    """Each aten op a step runs (forward, backward and the optimizer's), timed around its own call below
    autograd: its kernel, its output's allocation and the dispatcher, not Python's or autograd's work around
    it. Seconds and bytes (its tensors' in and out) by kind of op (op_kind), ops, and the products' FLOPs
    (torch.utils.flop_counter's count for the ops it knows: mm, bmm, addmm, baddbmm, ...)."""

    def __init__(self):
        super().__init__()
        self.seconds, self.bytes, self.ops, self.flops = defaultdict(float), defaultdict(float), 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        start = time.perf_counter()
        out = func(*args, **kwargs)
        seconds = time.perf_counter() - start
        kind = op_kind(func.name())
        tensors = [t for t in pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        self.seconds[kind] += seconds
        self.bytes[kind] += sum(t.numel() * t.element_size() for t in tensors)
        self.ops += 1
        if func._overloadpacket in flop_registry:
            self.flops += flop_registry[func._overloadpacket](*args, **kwargs, out_val=out)
        return out
