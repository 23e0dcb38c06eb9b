"""uph.optim against torch.optim.Adam and torch.nn.utils.clip_grad_norm_: the same operations in the same
order, so equal bit for bit on the same machine, in float32 and float64, clipped or not."""

import pytest
import torch

from uph.optim import Adam, clip_grad_norm_


def draws(shapes, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=dtype) for shape in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])  # every step clipped; never clipped
def test_adam_with_clipping_is_torchs_bit_for_bit(dtype, max_norm):
    shapes = [(5, 3), (4,), (1,)]
    ours = draws(shapes, 0, dtype)
    theirs = [p.clone().requires_grad_(True) for p in ours]
    adam, reference = Adam(ours, lr=0.01), torch.optim.Adam(theirs, lr=0.01)
    for step in range(30):
        grads = draws(shapes, 100 + step, dtype)
        for p, grad in zip(theirs, grads):
            p.grad = grad.clone()
        norm = clip_grad_norm_(grads, max_norm)
        assert torch.equal(norm, torch.nn.utils.clip_grad_norm_(theirs, max_norm))
        assert all(torch.equal(g, p.grad) for g, p in zip(grads, theirs))
        adam.step(grads)
        reference.step()
        assert all(torch.equal(a, b.detach()) for a, b in zip(ours, theirs)), step
