"""The neural cache (uph.lm.engine.neural_cache): its probabilities against the formula written out on tiny
datastores, blocked or not; the per-token floor a head's mixture base is made of, with the window a
user's own train tokens leave out; a planted user whose text repeats its own contexts gaining from its
own cache and not from the others'; the choice of (T, lambda) blind to test tokens; and the choice on
two knobs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import with_random_test_parts

import uph.lm.engine.neural_cache
from uph.config import schema_defaults
from uph.lm.data.cache import UserStates
from uph.lm.data.models import OutputLayer
from uph.lm.engine.capacity import choose
from uph.lm.engine.neural_cache import (
    Datastore,
    NeuralCache,
    cache_floor,
    datastore_table,
    floors,
    log_cache_probabilities,
    others_store,
    pooled_datastore,
)
from uph.lm.engine.tokens import Mixture, prepare
from uph.lm.jobs.fit_job import FitConfig, FitJob
from uph.lm.jobs.global_fit import global_neural_cache

V, H = 11, 4


def random_layer(seed: int = 0) -> OutputLayer:
    return OutputLayer(torch.randn(V, H, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)))


def store_of(keys, values, owners=None, positions=None) -> Datastore:
    keys = torch.as_tensor(keys, dtype=torch.float32)
    values = torch.as_tensor(values, dtype=torch.long)
    owners = torch.zeros(len(values), dtype=torch.long) if owners is None else torch.as_tensor(owners)
    positions = torch.arange(len(values)) if positions is None else torch.as_tensor(positions)
    return Datastore(keys, values, owners, positions)


def p_cache(store: Datastore, h: torch.Tensor, t: float, leave_out=lambda i: False) -> torch.Tensor:
    """p_cache(. | h) [V] written out, in float64: Σ_{i: y_i = w} exp(s_i) / Σ_i exp(s_i), entry by entry,
    without the entries `leave_out(i)`."""
    keys, weights = store.keys.double(), torch.zeros(V, dtype=torch.float64)
    for i in range(len(store)):
        if not leave_out(i):
            weights[int(store.values[i])] += math.exp(-float(((h.double() - keys[i]) ** 2).sum()) / (t * H))
    return weights / weights.sum()


def test_cache_probabilities_match_the_formula_written_out_in_any_blocks(monkeypatch):
    """log p_cache(y | h) of a five-entry datastore at two temperatures, against the formula entry by
    entry; a target no entry holds is -inf; blocks of two queries give the same numbers."""
    generator = torch.Generator().manual_seed(1)
    store = store_of(torch.randn(5, H, generator=generator), [3, 1, 3, 7, 1])
    hidden = torch.randn(7, H, generator=generator)
    targets = torch.tensor([3, 1, 7, 3, 1, 7, 5])  # 5: no entry holds it
    temperatures = [0.3, 2.0]
    whole = log_cache_probabilities(store, hidden, targets, temperatures)
    for t in temperatures:
        expected = torch.stack([p_cache(store, h, t)[y] for h, y in zip(hidden, targets)]).log()
        assert whole[t].dtype == torch.float64 and whole[t][-1] == -math.inf
        torch.testing.assert_close(whole[t][:-1], expected[:-1], rtol=0, atol=1e-6)
    assert not torch.allclose(whole[0.3][:-1], whole[2.0][:-1], atol=1e-3)  # the temperature matters here
    monkeypatch.setattr(uph.lm.engine.neural_cache, "BLOCK_ENTRIES", 2 * len(store))  # 2 queries a block: 4 blocks
    blocked = log_cache_probabilities(store, hidden, targets, temperatures)
    # Not bit for bit: the distances are float32 products, and BLAS picks the kernel (so the summation order)
    # by the block's shape. Each score s = -||h - k||^2 / (t H) carries float32 rounding of its parts,
    # (||h||^2 + ||k||^2) / (t H) eps32 at most a few times, and so does a log-sum-exp of scores.
    norms = hidden.square().sum(1).amax() + store.keys.float().square().sum(1).amax()
    for t in temperatures:
        atol = 4 * float(norms) / (t * H) * torch.finfo(torch.float32).eps
        torch.testing.assert_close(blocked[t], whole[t], rtol=0, atol=atol)


def test_a_mixture_base_on_cache_floors_is_the_mixture_written_out(monkeypatch):
    """Tokens.mixed with floors of two stores: every token's distribution is w p_model + Σ weight p_cache
    (columns sum to 1), and its NLL (Mixture.nll, the mixed tokens' nll0) is -log of that at the target."""
    generator = torch.Generator().manual_seed(2)
    layer = random_layer()
    pool = store_of(torch.randn(9, H, generator=generator), torch.randint(0, 6, (9,), generator=generator))
    own = store_of(torch.randn(4, H, generator=generator), [2, 2, 9, 4])
    hidden, targets = torch.randn(7, H, dtype=torch.float64, generator=generator), torch.tensor([2, 9, 0, 10, 4, 1, 3])
    tokens = prepare(hidden, targets, layer, chunk=3)  # chunks of 3, 3, 1
    parts, w = [(pool, 0.5, 0.25), (own, 2.0, 0.15)], 0.6
    monkeypatch.setattr(uph.lm.engine.neural_cache, "BLOCK_ENTRIES", 10)  # a block per query
    mixed = tokens.mixed(Mixture(w, None), floors(tokens, parts, None, 0))
    p_model = torch.softmax(layer.logits(hidden), dim=-1)
    expected = torch.stack(
        [w * p_model[j] + sum(weight * p_cache(s, hidden[j], t) for s, t, weight in parts) for j in range(len(hidden))]
    ).T  # [V, n]
    got = torch.cat([p.clone() for _, p in mixed.probabilities()], dim=1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.sum(0), torch.ones(len(hidden), dtype=got.dtype), rtol=0, atol=1e-6)
    at_targets = -expected[targets, torch.arange(len(targets))].log()
    nll = torch.cat([chunk.nll0 for chunk in mixed.chunks])
    torch.testing.assert_close(nll.double(), at_targets, rtol=1e-6, atol=0)
    assert mixed.base_nll == pytest.approx(float(at_targets.mean()), rel=1e-6)
    chunk = tokens.chunks[0]
    floor = cache_floor(parts, chunk.hidden, None, 0, 0)
    direct = Mixture(w, None).nll(chunk.nll0, chunk.targets, floor)
    torch.testing.assert_close(direct.double(), at_targets[:3], rtol=1e-6, atol=0)


def test_a_users_own_entries_near_a_query_are_left_out_and_none_left_raises():
    """A user's train tokens querying a store that holds them: its entries within `gap` positions of the
    query weigh nothing (another user's entries at those positions still count), chunk by chunk from
    position 0; a query whose every entry is left out raises."""
    generator = torch.Generator().manual_seed(3)
    layer = random_layer()
    n, gap, owner = 8, 2, 5
    hidden, targets = torch.randn(n, H, generator=generator), torch.tensor([9, 10, 9, 3, 4, 5, 6, 7])
    own = Datastore.of_user(hidden, targets, owner)
    other_keys = torch.randn(3, H, generator=generator)  # another user's entries at positions 0-2
    pool = store_of(
        torch.cat([hidden, other_keys]),
        torch.cat([targets, torch.tensor([0, 1, 2])]),
        owners=[owner] * n + [6] * 3,
        positions=[*range(n), 0, 1, 2],
    )
    tokens = prepare(hidden.double(), targets, layer, chunk=3)
    parts = [(pool, 0.5, 0.3), (own, 1.0, 0.2)]
    cut = floors(tokens, parts, owner, gap)
    got, support = torch.cat([floor.values for floor in cut], dim=1), cut[0].support
    assert all(torch.equal(floor.support, support) for floor in cut)

    def near(store: Datastore, t: int):
        """Whether entry i is the user's own within `gap` positions of query t."""
        return lambda i: int(store.owners[i]) == owner and abs(int(store.positions[i]) - t) <= gap

    for t in range(n):
        expected = sum(weight * p_cache(store, hidden[t], temp, near(store, t)) for store, temp, weight in parts)
        torch.testing.assert_close(got[:, t].double(), expected[support], rtol=0, atol=1e-6)
    # tokens 9 and 10 follow positions 0-2 alone: nothing for query 0 (its own neighbours), some for query 5
    rows = torch.searchsorted(support, torch.tensor([9, 10]))
    assert got[rows, 0].tolist() == [0.0, 0.0] and (got[rows, 5] > 0).all()
    held_out = floors(tokens, parts, None, gap)[0]  # the same queries as held-out text: nothing left out
    assert float(held_out.values[:, 0].sum()) == pytest.approx(0.5, abs=1e-6)
    with pytest.raises(ValueError, match="no datastore entry beyond 3 positions"):
        cache_floor([(Datastore.of_user(hidden[:4], targets[:4], owner), 1.0, 0.5)], hidden[:4], owner, 0, 3)


def planted_users(n_train: int = 60, n_test: int = 30):
    """Users 'a' (whose test text repeats contexts of its train text: its test hidden states near-copies
    of train states, with the same next tokens), 'b' and 'c' (unrelated random states and tokens)."""
    generator = torch.Generator().manual_seed(4)

    def states():
        return torch.randn(n_train, H, generator=generator), torch.randint(0, V, (n_train,), generator=generator)

    users = {}
    h_a, y_a = states()
    picked = torch.randint(0, n_train, (n_test,), generator=generator)
    noise = 0.01 * torch.randn(n_test, H, generator=generator)
    users["a"] = UserStates(h_a, y_a, h_a[picked] + noise, y_a[picked])
    for user in ("b", "c"):
        h, y = states()
        test = torch.randn(n_test, H, generator=generator), torch.randint(0, V, (n_test,), generator=generator)
        users[user] = UserStates(h, y, *test)
    return users


def test_a_user_repeating_its_own_contexts_gains_from_its_own_cache_not_the_others():
    """The planted user 'a' (planted_users): the personal arm is far below the base NLL, and the residual
    arm beats the global one with its own store but not with the others' store of the same size."""
    users = planted_users()
    layer = OutputLayer(0.3 * random_layer().W.float())  # logits of std ~0.6: no confidently wrong base
    ends = {user: len(states.train_targets) for user, states in users.items()}
    pool, fit_pool, owners = pooled_datastore(datastore_table(users, ends, ends), "cpu")
    assert len(pool) == len(fit_pool) == 3 * 60 and owners == {"a": 0, "b": 1, "c": 2}
    cache = NeuralCache(pool, fit_pool, owners, {arm: (0.1, 0.5) for arm in ("global", "personal", "residual")})
    nll = {}
    for user, states in users.items():
        test = prepare(states.test_hidden, states.test_targets, layer)
        own = cache.own(user, states.train_hidden, states.train_targets)
        control = cache.others(user, len(own))
        assert len(control) == len(own) and (control.owners != owners[user]).all()
        assert torch.equal(control.keys, others_store(pool, owners[user], len(own), user).keys)  # seeded by the user
        nll[user] = (test.base_nll, cache.arm_nlls(test, own), cache.arm_nlls(test, control))
    base, mine, theirs = nll["a"]
    assert mine["personal"] < base - 1.0
    assert mine["residual"] < mine["global"] - 0.2  # the own cache beyond the pooled one
    assert theirs["residual"] > theirs["global"] - 0.02  # the others' store of the same size: no gain beyond global
    assert mine["residual"] < theirs["residual"] - 0.2
    for user in ("b", "c"):  # no repeats: the own cache does not help
        base, mine, _ = nll[user]
        assert mine["personal"] > base - 0.05


def test_no_neural_cache_choice_moves_when_the_test_tokens_change():
    """global_neural_cache reads train tokens only: replacing every user's test tokens by other random ones
    leaves the chosen settings, the datastore and every validation row as they were."""
    users = planted_users(n_train=80)
    fit = FitConfig.from_config(
        {
            **schema_defaults("fit"),
            "heads": ["svd_cvh"],
            "ds": [4],
            "baselines": ["neural_cache"],
            "temperatures": [0.01, 0.1, 1.0],
            "lambdas": [0.05, 0.3, 0.6],
            "global_max_tokens": 210,  # a share of 70 per user: below the 80 train tokens, above the 60 of a fit part
        }
    )
    layer = random_layer()

    def study(users: dict):
        return global_neural_cache(FitJob(layer, users, {}, torch.device("cpu"), gap=4), fit)

    replaced = with_random_test_parts(users, V, seed=6)
    (settings, datastore, validation), (again, datastore_again, validation_again) = study(users), study(replaced)
    pd.testing.assert_frame_equal(settings, again)
    pd.testing.assert_frame_equal(validation, validation_again)
    pd.testing.assert_frame_equal(datastore.drop(columns="hidden"), datastore_again.drop(columns="hidden"))
    assert list(settings.columns) == [
        f"{knob}_{arm}" for arm in ("global", "personal", "residual") for knob in ("temperature", "lambda")
    ]
    assert set(validation["arm"]) == {"global", "personal", "residual"} and (validation["head"] == "neural_cache").all()
    assert set(validation["temperature"]) == {0.01, 0.1, 1.0} and set(validation["capacity"]) == {0.05, 0.3, 0.6}
    assert len(validation) == 3 * 3 * 3 * 3  # arms x temperatures x lambdas x users
    by_user = datastore.groupby("user")
    assert (by_user.size() == 70).all() and (by_user["fit_part"].sum() == 60).all()


def two_knob_curve(nll) -> pd.DataFrame:
    """Validation rows on the grid T in (0.1, 1, 10) x lambda in (0.1, 0.3, 0.6), two users, nll(T, lambda)
    their mean (the users differ by ±0.5)."""
    return pd.DataFrame(
        [
            {"head": "neural_cache", "temperature": t, "capacity": lam, "user": u, "validation_nll": nll(t, lam) + s}
            for t in (0.1, 1.0, 10.0)
            for lam in (0.1, 0.3, 0.6)
            for u, s in (("u0", 0.5), ("u1", -0.5))
        ]
    )


@pytest.mark.parametrize(
    "nll, temperature, capacity, edge",
    [
        (lambda t, lam: math.log10(t) ** 2 + (lam - 0.3) ** 2, 1.0, 0.3, ""),
        (lambda t, lam: math.log10(t) + (lam - 0.3) ** 2, 0.1, 0.3, "low temperature"),
        (lambda t, lam: -math.log10(t) + lam, 10.0, 0.1, "high temperature, low"),
        (lambda t, lam: 1.0, 0.1, 0.1, "low temperature, low"),  # all tied: the smallest of both
        # tied at (1, 0.6) and (10, 0.1): the smaller temperature, though its lambda is larger
        (lambda t, lam: 0.0 if (t, lam) in ((1.0, 0.6), (10.0, 0.1)) else 1.0, 1.0, 0.6, "high"),
        # tied at one temperature: the smaller lambda
        (lambda t, lam: 0.0 if t == 1.0 and lam > 0.1 else 1.0, 1.0, 0.3, ""),
    ],
)
def test_two_knobs_are_chosen_on_their_product_grid(nll, temperature, capacity, edge):
    (row,) = choose(two_knob_curve(nll), ["head"], ["temperature", "capacity"]).to_dict("records")
    assert (row["temperature"], row["capacity"], row["at_edge"]) == (temperature, capacity, edge)
    assert row["grid_size"] == 9 and row["n_users"] == 2
    assert row["validation_nll"] == pytest.approx(nll(temperature, capacity))


def test_a_method_without_a_temperature_is_chosen_on_capacity_alone():
    """The unigram's rows have no temperature: NaN, one value, never an edge."""
    rows = two_knob_curve(lambda t, lam: (lam - 0.3) ** 2).query("temperature == 1.0").drop(columns="temperature")
    (row,) = choose(rows, ["head"], ["temperature", "capacity"]).to_dict("records")
    assert np.isnan(row["temperature"]) and row["capacity"] == 0.3 and row["at_edge"] == "" and row["grid_size"] == 3
