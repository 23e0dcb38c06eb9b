"""The neural cache (Grave et al. 2017; its nearest-neighbour form is kNN-LM, Khandelwal et al. 2020):
the next token predicted from stored final hidden states of text seen before.

A datastore holds pairs (h_i, y_i), a final hidden state and the token that followed it. For a position
with final hidden state h:

    s_i = -‖h - h_i‖² / (T H)                          (H the hidden size: T is per dimension, so
                                                         one grid serves models of any width)
    p_cache(w | h) = Σ_{i: y_i = w} exp(s_i) / Σ_i exp(s_i)
    p(w | h)       = (1 - lam) p_model(w | h) + lam p_cache(w | h)

Every entry counts (the exact sum; kNN-LM's k nearest approximate it where a datastore is too large to
scan). Both are computed in log space: log p_cache(y) = LSE_{i: y_i = y} s_i - LSE_i s_i, and the
mixture's log is logaddexp(log(1 - lam) + log p_model, log lam + log p_cache) (uph.lm.engine.baselines.
mixture), so a token the cache never saw (log p_cache = -inf) keeps its model share. The distances
‖h‖² - 2 h·h_i + ‖h_i‖² are one matrix product per block of queries against the whole datastore, in
float32, BLOCK_ENTRIES scores at a time (64 MB), whatever the number of queries.

A datastore entry is never read for a query of the same user whose position lies within `gap`
tokens of it (extract.context): the entry's target would be in the query's context window or be the
query's own target. Held-out queries stand past that gap by construction (uph.splits); the gap
matters where a user's train tokens query a store that holds them (the base of a head fitted on the
cache: `CacheFloor`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd
import torch

from uph.lm.engine.baselines import arm_nll, hidden_of, model_log_probs, targets_of
from uph.lm.engine.tokens import CacheFloor, Mixture, Tokens

BLOCK_ENTRIES = 2**24  # scores [queries x entries] computed at a time: 64 MB of float32


@dataclass(frozen=True)
class Datastore:
    """Entries (h_i, y_i) with their owner (a user's code) and position (index in its train tokens)."""

    keys: torch.Tensor  # [m, H] float32
    values: torch.Tensor  # [m] token ids
    owners: torch.Tensor  # [m] user codes
    positions: torch.Tensor  # [m] positions in the owner's train tokens

    @classmethod
    def of_user(cls, hidden: torch.Tensor, targets: torch.Tensor, owner: int, device="cpu") -> Datastore:
        """One user's tokens (hidden [n, H], targets [n]) in order, positions 0..n-1."""
        n = len(targets)
        return cls(
            hidden.to(device, torch.float32),
            targets.to(device).long(),
            torch.full((n,), owner, dtype=torch.long, device=device),
            torch.arange(n, device=device),
        )

    def __len__(self) -> int:
        return len(self.values)

    @property
    def hidden_size(self) -> int:
        return self.keys.shape[1]

    @cached_property
    def key_norms(self) -> torch.Tensor:
        """‖h_i‖² [m], once per datastore."""
        return (self.keys * self.keys).sum(1)

    def subset(self, mask: torch.Tensor) -> Datastore:
        return Datastore(self.keys[mask], self.values[mask], self.owners[mask], self.positions[mask])


def others_store(pool: Datastore, owner: int, size: int, user: str) -> Datastore:
    """The control store of the same size as a user's own: `size` entries drawn without replacement from
    the other users' entries of the pooled datastore (all of them if fewer), seeded by the user id so
    the draw does not depend on which job holds the user."""
    others = (pool.owners != owner).nonzero().squeeze(1)
    generator = torch.Generator().manual_seed(zlib.crc32(user.encode("utf-8")))
    picked = others[torch.randperm(len(others), generator=generator)[:size].to(others.device)]
    return pool.subset(picked.sort().values)


def _query_blocks(store: Datastore, n: int):
    step = max(1, BLOCK_ENTRIES // max(len(store), 1))
    return ((start, min(start + step, n)) for start in range(0, n, step))


def _neg_distances(store: Datastore, hidden: torch.Tensor) -> torch.Tensor:
    """-‖h - h_i‖² [b, m] of queries `hidden` [b, H], as one matrix product (float32)."""
    h = hidden.to(store.keys)
    distances = torch.addmm(store.key_norms[None, :], h, store.keys.T, alpha=-2.0).add_((h * h).sum(1, keepdim=True))
    return distances.clamp_(min=0).neg_()


def log_cache_probabilities(
    store: Datastore, hidden: torch.Tensor, targets: torch.Tensor, temperatures
) -> dict[float, torch.Tensor]:
    """T -> log p_cache(y_t | h_t) [n] (float64, -inf where no entry holds y_t) for every temperature,
    of held-out queries (hidden [n, H], targets [n]) that the datastore does not hold."""
    targets = targets.to(store.values.device)
    out = {t: torch.empty(len(targets), dtype=torch.float64, device=store.values.device) for t in temperatures}
    for start, stop in _query_blocks(store, len(targets)):
        negative = _neg_distances(store, hidden[start:stop])
        other = store.values[None, :] != targets[start:stop, None]
        for t in temperatures:
            s = negative / (t * store.hidden_size)
            out[t][start:stop] = (torch.logsumexp(s.masked_fill(other, -torch.inf), 1) - torch.logsumexp(s, 1)).double()
    return {t: values.cpu() for t, values in out.items()}


def cache_floor(parts, hidden: torch.Tensor, owner: int | None, start: int, gap: int) -> CacheFloor:
    """Σ weight p_cache(· | h_t) over `parts` [(datastore, T, weight)] for queries `hidden` [c, H], a
    user's tokens start..start+c-1; with `owner` (its code), the entries of that user within `gap`
    positions of a query are left out of the query's cache (module docstring)."""
    support = torch.unique(torch.cat([store.values for store, _, _ in parts]))
    values = torch.zeros(len(support), len(hidden), dtype=torch.float32, device=support.device)
    positions = torch.arange(start, start + len(hidden), device=support.device)
    for store, t, weight in parts:
        rows = torch.searchsorted(support, store.values)
        for a, b in _query_blocks(store, len(hidden)):
            s = _neg_distances(store, hidden[a:b]).div_(t * store.hidden_size)
            if owner is not None:
                near = (store.positions[None, :] - positions[a:b, None]).abs() <= gap
                s.masked_fill_(near & (store.owners == owner)[None, :], -torch.inf)
            if torch.isinf(s.amax(1)).any():
                raise ValueError(f"a query has no datastore entry beyond {gap} positions of it")
            weights = torch.softmax(s, dim=1).mul_(weight)
            values[:, a:b].index_add_(0, rows, weights.T)  # adds into the view: the parts accumulate
    return CacheFloor(support, values)


def floors(tokens: Tokens, parts, owner: int | None, gap: int) -> list[CacheFloor]:
    """Each chunk's cache_floor of `tokens`: a user's train tokens from position 0 (with its `owner` code,
    so that each query leaves its own neighbourhood out), or held-out tokens (owner None)."""
    out, start = [], 0
    for chunk in tokens.chunks:
        out.append(cache_floor(parts, chunk.hidden, owner, start, gap))
        start += len(chunk.targets)
    return out


ARMS = ("global", "personal", "residual")


@dataclass(frozen=True)
class NeuralCache:
    """What rule fit_global_neural_cache hands the per-user jobs: the pooled datastore (every user's
    first train tokens up to the global cap, `pool`; `fit_pool` the part of it in the users' fit parts),
    the users' owner codes, and each arm's chosen (T, lam) (uph.lm.engine.capacity):

        global     (1 - lam_g) p_model + lam_g p_pool
        personal   (1 - lam_p) p_model + lam_p p_own           (the user's own train tokens)
        residual   (1 - lam_r) [global mixture] + lam_r p_own  (the own cache beyond the pooled one)
        others     the residual arm with p_own's store replaced by others_store: the same size, drawn
                   from the other users' pooled entries (the control for 'personal')
    """

    pool: Datastore
    fit_pool: Datastore
    owners: dict[str, int]
    settings: dict[str, tuple[float, float]]  # arm -> (temperature, lam)

    def own(self, user: str, hidden: torch.Tensor, targets: torch.Tensor) -> Datastore:
        return Datastore.of_user(hidden, targets, self.owners[user], self.pool.keys.device)

    def others(self, user: str, size: int) -> Datastore:
        return others_store(self.pool, self.owners[user], size, user)

    def arm_nlls(self, tokens: Tokens, own: Datastore) -> dict[str, float]:
        """Mean NLL of held-out `tokens` under each arm's mixture at its choice, with the user's store
        `own` (others_store for the control) and the pooled one of all train tokens."""
        hidden, y = hidden_of(tokens), targets_of(tokens)
        (t_g, lam_g), (t_p, lam_p), (t_r, lam_r) = (self.settings[arm] for arm in ARMS)
        pooled = log_cache_probabilities(self.pool, hidden, y, [t_g])[t_g]
        users = log_cache_probabilities(own, hidden, y, sorted({t_p, t_r}))
        model = model_log_probs(tokens)
        return {
            "global": arm_nll("global", lam_g, model, pooled, None),
            "personal": arm_nll("personal", lam_p, model, None, users[t_p]),
            "residual": arm_nll("residual", lam_r, model, pooled, users[t_r], lam_g),
        }

    def mixed(self, tokens: Tokens, own: Datastore, fit_part: bool, owner: int | None, gap: int) -> Tokens:
        """`tokens` on the residual arm's mixture (the base of a head on the neural cache), with the user's
        store `own` and the pooled one (`fit_part`: the fit parts' pool, for validation); `owner`: the
        user's code where `tokens` are the user's train tokens the stores hold (see floors)."""
        (t_g, lam_g), (t_r, lam_r) = self.settings["global"], self.settings["residual"]
        parts = [(self.fit_pool if fit_part else self.pool, t_g, (1 - lam_r) * lam_g), (own, t_r, lam_r)]
        return tokens.mixed(Mixture((1 - lam_r) * (1 - lam_g), None), floors(tokens, parts, owner, gap))

    @classmethod
    def from_tables(cls, settings: pd.DataFrame, datastore: pd.DataFrame, device) -> NeuralCache:
        """From fit_global_neural_cache's tables: its chosen settings and its datastore (datastore_table)."""
        row = settings.iloc[0]
        chosen = {arm: (float(row[f"temperature_{arm}"]), float(row[f"lambda_{arm}"])) for arm in ARMS}
        return cls(*pooled_datastore(datastore, device), chosen)


def pooled_datastore(datastore: pd.DataFrame, device) -> tuple[Datastore, Datastore, dict[str, int]]:
    """(pool, its fit parts' part, user -> owner code) of a datastore_table."""
    owners = {user: i for i, user in enumerate(sorted(datastore["user"].unique()))}
    pool = Datastore(
        torch.from_numpy(np.stack(datastore["hidden"].to_numpy()).astype(np.float32)).to(device),
        torch.tensor(datastore["target"].to_numpy(), dtype=torch.long, device=device),
        torch.tensor([owners[user] for user in datastore["user"]], dtype=torch.long, device=device),
        torch.tensor(datastore["position"].to_numpy(), dtype=torch.long, device=device),
    )
    return pool, pool.subset(torch.tensor(datastore["fit_part"].to_numpy(), device=device)), owners


def datastore_table(users: dict, ends: dict[str, int], fit_ends: dict[str, int]) -> pd.DataFrame:
    """The pooled datastore as rows (user, position, target, fit_part, hidden): each user's first
    ends[user] train tokens, those before fit_ends[user] in the fit parts' pool."""
    frames = []
    for user, states in users.items():
        n = ends[user]
        frames.append(
            pd.DataFrame(
                {
                    "user": user,
                    "position": np.arange(n),
                    "target": states.train_targets[:n].numpy(),
                    "fit_part": np.arange(n) < fit_ends[user],
                    "hidden": list(states.train_hidden[:n].float().numpy()),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)
