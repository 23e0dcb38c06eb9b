"""The attention study's training step as a GPU captures it (uph.attention.steps): its device part reads
no value on the host, which a CPU checks on fake tensors (torch's FakeTensorMode refuses a read of a
value it does not hold); tests/test_gpu.py replays it from a CUDA graph against the eager steps."""

from __future__ import annotations

import pytest
import torch
from test_attention_runs import TINY
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

from uph.attention.model import build_model
from uph.attention.runs import RunAdamW, RunLinear
from uph.attention.self_attention import ATTENTIONS
from uph.attention.steps import update
from uph.attention.tasks import Batch

R, B, T = 2, 4, 12


def fake_batch() -> Batch:
    return Batch(
        torch.zeros(R, B, T, dtype=torch.long),
        torch.zeros(R, B, T, dtype=torch.long),
        torch.ones(R, B, T),
        torch.ones(R, B),
    )


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_the_device_part_of_a_step_reads_no_value_on_the_host(attention):
    with FakeTensorMode():
        model = build_model("residual", attention, TINY, [0, 1])
        losses, _ = update(model, RunAdamW(model, [0.01, 0.003], 0.1), fake_batch(), 1.0)
    assert losses.shape == (R,)


class ReadsAValue(torch.nn.Module):
    """A model whose forward branches on a value: a CUDA graph could not hold it."""

    def __init__(self):
        super().__init__()
        self.head = RunLinear(R, 1, TINY.vocab)

    def forward(self, tokens, loud):
        x = loud[..., None]
        return self.head(x if x.sum().item() > 0 else -x)


def test_a_step_that_reads_a_value_on_the_host_is_caught():
    with FakeTensorMode(), pytest.raises(DataDependentOutputException):
        model = ReadsAValue()
        update(model, RunAdamW(model, [0.01, 0.003], 0.1), fake_batch(), 1.0)
