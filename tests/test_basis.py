import torch

from uph.lm.data.basis import load_basis, save_basis, top_singular_triplets


def test_top_singular_triplets_match_torch_svd(tmp_path):
    torch.manual_seed(0)
    W = torch.randn(3000, 48) @ torch.diag(torch.linspace(3, 0.1, 48)) @ torch.linalg.qr(torch.randn(48, 48))[0]
    U, S, Vh = top_singular_triplets(W, 10)
    U_ref, S_ref, Vh_ref = torch.linalg.svd(W.double(), full_matrices=False)
    torch.testing.assert_close(S.double(), S_ref[:10], rtol=1e-5, atol=0)
    signs = torch.sign((Vh.double() * Vh_ref[:10]).sum(dim=1, keepdim=True))  # SVD fixes no sign
    torch.testing.assert_close(Vh.double(), signs * Vh_ref[:10], rtol=0, atol=1e-5)
    torch.testing.assert_close(U.double(), U_ref[:, :10] * signs.T, rtol=0, atol=1e-5)
    assert torch.all(Vh.gather(1, Vh.abs().argmax(dim=1, keepdim=True)) > 0)  # our sign convention
    save_basis(tmp_path / "b.safetensors", U, S, Vh, weights_sha256="abc")
    assert all(torch.equal(a, b) for a, b in zip(load_basis(tmp_path / "b.safetensors", "abc"), (U, S, Vh)))
