"""Top-k singular triplets of the lm_head weight W [V, H], the basis of the SVD heads.

With V >> H, the right singular vectors are the eigenvectors of the H×H Gram matrix W^T W
(computed in float64, so squaring the condition number costs nothing at these sizes):
W^T W = V S^2 V^T, then U = W V S^-1. That is one V×H×H product instead of a full SVD of W.
Signs are fixed so that each right singular vector's largest-magnitude entry is positive.
The file records the weights hash of the model it was computed from (uph.artifacts): a reader
refuses a basis of another model, or a damaged one, in one line naming it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from uph.artifacts import READ_ERRORS, Artifact, first_line
from uph.io import atomic_path

BASIS = Artifact("SVD basis", "svd_basis")


def top_singular_triplets(W: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U [V, k], S [k], Vh [k, H]) with W ≈ U diag(S) Vh, in decreasing S, float32."""
    W64 = W.double()
    eigenvalues, vectors = torch.linalg.eigh(W64.T @ W64)
    top = torch.argsort(eigenvalues, descending=True)[:k]
    V = vectors[:, top]
    signs = torch.sign(V.gather(0, V.abs().argmax(dim=0, keepdim=True)))
    V = V * signs
    S = eigenvalues[top].clamp_min(0).sqrt()
    U = (W64 @ V) / S
    return U.float(), S.float(), V.T.contiguous().float()


def save_basis(path: str | Path, U, S, Vh, weights_sha256: str) -> None:
    with atomic_path(path) as tmp:
        save_file(
            {"U": U.contiguous(), "S": S.contiguous(), "Vh": Vh.contiguous()},
            tmp,
            metadata={"weights_sha256": weights_sha256},
        )


def load_basis(path: str | Path, weights_sha256: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U, S, Vh) of the basis file `path`, refused unless computed from the weights `weights_sha256`."""
    BASIS.check(path, {"weights_sha256": weights_sha256})
    try:
        tensors = load_file(path)
        return tensors["U"], tensors["S"], tensors["Vh"]
    except READ_ERRORS as error:
        raise BASIS.unusable(path, f"is damaged ({first_line(error)})") from None
