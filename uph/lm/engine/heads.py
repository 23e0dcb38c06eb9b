"""User prior heads (seeds 000-002): each one a rank-d change of the logits.

With h the final hidden state (the lm_head input, after the final norm) and W [V, H], b the
lm_head, every head changes the logits z = W h + b by a term of rank at most d:

    conditional heads     z(theta) = W h + b + P (theta ⊙ A h)     P [V, d], A [d, H]
    unconditional heads   z(theta) = W h + b + P theta

| head           | seed | what the seed does                   | A       | P            |
| -------------- | ---- | ------------------------------------ | ------- | ------------ |
| cvh            | 000  | h' = h + alpha B (theta ⊙ A h)       | A       | alpha W B    |
| uncond         | 000  | h' = h + alpha U theta               | -       | alpha W U    |
| svd_cvh        | 001  | h' = h + alpha V_d (theta ⊙ V_d^T h) | V_d^T   | alpha W V_d  |
| svd_uncond     | 001  | h' = h + alpha V_d theta             | -       | alpha W V_d  |
| lm_head_update | 002  | W'_u = W + gamma alpha C diag(theta) A | A     | gamma alpha C |

Seed 000's random bases: one generator seeded `basis_seed` draws A ~ N(0, 1/H) [d, H] and then
B ~ N(0, 1/d) [H, d]; the unconditional U ~ N(0, 1/d) [H, d] comes from `basis_seed + 1000`.
Seed 001's V_d holds the top-d right singular vectors of W (W V_d = U_d S_d: SVD-CVH rescales the
top-d singular values by 1 + alpha theta). For `lm_head_update` the basis is configurable:
"svd" takes A = V_d^T and C = U_d S_d (so it equals svd_cvh with alpha -> gamma alpha); "random"
draws A ~ N(0, 1/H) [d, H] and then C ~ N(0, 1/d) [V, d] from one generator seeded `basis_seed`
(seed 000's fan-in scaling, which gives C the scale of U_d S_d).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F

from uph.config import schema_defaults
from uph.errors import ConfigError

BASES = ("svd", "random")


@dataclass(frozen=True)
class HeadSettings:
    """What building a head reads besides its point (head, alpha, d): the fit section's basis_seed and
    lm_head_update keys (schemas/fit.schema.yaml documents each and holds the defaults)."""

    basis_seed: int
    gamma: float
    basis: str

    @classmethod
    def from_config(cls, fit: dict) -> HeadSettings:
        return cls(fit["basis_seed"], fit["lm_head_update"]["gamma"], fit["lm_head_update"]["basis"])

    @classmethod
    def defaults(cls, **changes) -> HeadSettings:
        """The schema's defaults, with `changes`."""
        return replace(cls.from_config(schema_defaults("fit")), **changes)


@dataclass(frozen=True, eq=False)
class Head:
    """A head's seed semantics (`apply_hidden`) and its low-rank logit description (P, A)."""

    name: str
    d: int
    P: torch.Tensor | None  # [V, d] logit directions, scalings included; None: the identity (full_bias)
    A: torch.Tensor | None  # [d, H] conditional heads' projection; None: unconditional
    up: torch.Tensor | None  # [H, d] alpha B (hidden-space heads); None for lm_head_update
    W: torch.Tensor  # the lm_head, for `logits`
    b: torch.Tensor | None

    @property
    def conditional(self) -> bool:
        return self.A is not None

    def _gated(self, h: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """theta ⊙ A h per row [n, d], or theta itself for unconditional heads [1, d]."""
        return theta * (h @ self.A.T) if self.conditional else theta.unsqueeze(0)

    def apply_hidden(self, h: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """What the seed computes: h' [n, H], or for lm_head_update the logits W'_u h + b [n, V]."""
        if self.up is None:
            W_user = self.W + self.P @ torch.diag(theta) @ self.A
            return F.linear(h, W_user, self.b)
        return h + self._gated(h, theta) @ self.up.T

    def logits(self, h: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """Personalized logits the seed's way: the head first, then the lm_head."""
        out = self.apply_hidden(h, theta)
        return out if self.up is None else F.linear(out, self.W, self.b)

    def correction(self, h: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """The rank-d logit change P (theta ⊙ A h) (or P theta, or theta itself for full_bias), [n, V]."""
        change = self._gated(h, theta)
        return (change if self.P is None else change @ self.P.T).expand(h.shape[0], -1)


def full_bias_head(W: torch.Tensor, bias: torch.Tensor | None = None) -> Head:
    """The per-user full-vocabulary logit bias z = W h + b + theta, theta in R^V: the unconditional
    heads' limit d = V (P = I), a baseline rather than a prior head. Its logits are the base's plus
    `correction` (it has no hidden-space form)."""
    return Head("full_bias", W.shape[0], P=None, A=None, up=None, W=W, b=bias)


def _random(shape: tuple[int, int], fan_in: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=generator) / fan_in**0.5


def _cvh(W, d, alpha, basis_seed, **_):
    generator = torch.Generator().manual_seed(basis_seed)
    A = _random((d, W.shape[1]), W.shape[1], generator)
    return A, alpha * _random((W.shape[1], d), d, generator)


def _uncond(W, d, alpha, basis_seed, **_):
    return None, alpha * _random((W.shape[1], d), d, torch.Generator().manual_seed(basis_seed + 1000))


def _svd_cvh(W, d, alpha, svd, **_):
    Vh = _top_singular(W, d, svd)[2]
    return Vh, alpha * Vh.T


def _svd_uncond(W, d, alpha, svd, **_):
    return None, alpha * _top_singular(W, d, svd)[2].T


def _lm_head_update(W, d, alpha, svd, basis_seed, gamma, basis, **_):
    """(A, P) of seed 002's W'_u = W + gamma alpha C diag(theta) A: no hidden-space form."""
    if basis not in BASES:
        raise ConfigError(f"config key 'fit.lm_head_update.basis': unknown basis '{basis}' (known: {', '.join(BASES)})")
    if basis == "svd":
        U, S, Vh = _top_singular(W, d, svd)
        A, C = Vh, U * S
    else:
        generator = torch.Generator().manual_seed(basis_seed)
        A = _random((d, W.shape[1]), W.shape[1], generator).to(W.dtype)
        C = _random((W.shape[0], d), d, generator).to(W.dtype)
    return A, gamma * alpha * C


# head name -> builder (W, d, alpha, svd, basis_seed, gamma, basis) -> (A or None, up [H, d]); lm_head_update's
# builder gives (A, P) instead, as its correction acts on the lm_head. Adding a head: a builder here and its
# name in schemas/fit.schema.yaml (tests/test_registries.py checks the two agree).
BUILDERS = {
    "cvh": _cvh,
    "uncond": _uncond,
    "svd_cvh": _svd_cvh,
    "svd_uncond": _svd_uncond,
    "lm_head_update": _lm_head_update,
}
HEADS = tuple(BUILDERS)
ACTS_ON_LM_HEAD = ("lm_head_update",)


def _top_singular(W: torch.Tensor, d: int, svd: tuple | None):
    """(U_d, S_d, Vh_d) of W from the precomputed basis `svd`, refusing one with fewer than d triplets."""
    if svd is None or svd[2].shape[0] < d:
        have = "no SVD basis" if svd is None else f"an SVD basis of {svd[2].shape[0]} triplets"
        raise ConfigError(f"config key 'fit.ds': d={d} needs the top {d} singular triplets of the lm_head, got {have}")
    U, S, Vh = svd
    return U[:, :d].to(W.dtype), S[:d].to(W.dtype), Vh[:d].to(W.dtype)


def make_head(
    name: str,
    W: torch.Tensor,
    *,
    d: int,
    alpha: float,
    settings: HeadSettings,
    svd: tuple | None = None,
    bias: torch.Tensor | None = None,
) -> Head:
    """Build head `name` at (alpha, d) on the lm_head (W [V, H], `bias`), with svd = (U, S, Vh) of W when needed."""
    if name not in BUILDERS:
        raise ConfigError(f"config key 'fit.heads': unknown head '{name}' (known: {', '.join(HEADS)})")
    if not 1 <= d <= W.shape[1]:
        raise ConfigError(f"config key 'fit.ds': d={d} must be between 1 and the hidden size {W.shape[1]}")
    A, up = BUILDERS[name](W, d=d, alpha=alpha, svd=svd, **asdict(settings))
    A = None if A is None else A.to(W.dtype)
    if name in ACTS_ON_LM_HEAD:
        return Head(name, d, P=up.to(W.dtype), A=A, up=None, W=W, b=bias)
    up = up.to(W.dtype)
    return Head(name, d, P=W @ up, A=A, up=up, W=W, b=bias)
