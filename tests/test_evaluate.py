"""Held-out evaluation and the study's arms on planted users: held-out NLL against explicit computations,
a planted per-user theta on top of a planted global one recovered by the residual fit, the cross-user
matrix of residual thetas, the capacity choices blind to test tokens, and the unigram arms against
straightforward references."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import with_random_test_parts
from tiny_lm import sample_text, tiny_llama, user_split

import uph.lm.engine.lockstep
import uph.lm.jobs.controls
import uph.lm.jobs.fit_job
import uph.lm.jobs.global_fit
import uph.lm.jobs.refit
from uph.config import schema_defaults
from uph.lm.data.cache import UserStates
from uph.lm.data.models import OutputLayer
from uph.lm.engine.baselines import cache_mixture, log_unigram, mixture, unigram_nll
from uph.lm.engine.capacity import chosen
from uph.lm.engine.evaluate import HeldOut
from uph.lm.engine.fit import fit_theta
from uph.lm.engine.heads import HeadSettings, full_bias_head, make_head
from uph.lm.engine.lockstep import run
from uph.lm.engine.solvers import SolverSettings
from uph.lm.engine.tokens import pool, prepare
from uph.lm.jobs.choices import Point, capacity_choices
from uph.lm.jobs.controls import cross_user, others, residual_thetas
from uph.lm.jobs.fit_job import CacheBaselines, FitConfig, FitJob, global_thetas, load_methods
from uph.lm.jobs.global_fit import fit_global, global_unigram
from uph.lm.jobs.refit import fit_user_steps, fit_users
from uph.lm.jobs.validate import validate_user_steps, validate_users, warm_starts

D = 8
NO_CACHES = CacheBaselines(None, None)
SHARED = 2.0 * F.normalize(torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(20)), dim=0)
OWN = 2.5 * F.normalize(torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(21)), dim=0)


@pytest.fixture(scope="session")
def planted(tmp_path_factory):
    """Two users whose text the tiny model wrote with theta* = shared ± own: the global theta should find
    the shared part, each residual theta its user's own part."""
    model = tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    W = model.get_output_embeddings().weight.detach()
    layer = OutputLayer(W)
    head = make_head(
        "svd_cvh", W, d=D, alpha=1.0, settings=HeadSettings.defaults(), svd=torch.linalg.svd(W, full_matrices=False)
    )
    stars, trains, tests = {}, {}, {}
    for i, (user, sign) in enumerate([("romeo", 1.0), ("juliet", -1.0)]):
        stars[user] = SHARED + sign * OWN
        ids = sample_text(model, lambda h, star=stars[user]: head.logits(h, star), batch=24, length=81, seed=10 + i)
        (h_train, y_train), (h_test, y_test) = user_split(model, ids)
        trains[user], tests[user] = prepare(h_train, y_train, layer), prepare(h_test, y_test, layer)
    return head, layer, trains, tests, stars


def columns(tokens):
    """(hidden, targets) of prepared tokens."""
    return torch.cat([c.hidden for c in tokens.chunks]), torch.cat([c.targets for c in tokens.chunks])


def test_held_out_nll_and_kl_match_explicit_computation(planted):
    head, layer, _, tests, stars = planted
    tokens = tests["romeo"]
    h, y = columns(tokens)
    base_logits, logits = F.linear(h, layer.W), head.logits(h, stars["juliet"])
    kl = F.kl_div(F.log_softmax(logits, -1), F.softmax(base_logits, -1), reduction="batchmean")
    held_out = HeldOut(tokens, head)
    assert held_out.base_nll == pytest.approx(float(F.cross_entropy(base_logits, y)), rel=1e-12)
    assert held_out(stars["juliet"]) == pytest.approx({"nll": float(F.cross_entropy(logits, y)), "kl": float(kl)})
    assert held_out(torch.zeros(D)) == {"nll": held_out.base_nll, "kl": 0.0}


def test_residual_fit_recovers_a_planted_personal_theta_on_top_of_a_planted_global_one(planted):
    head, _, trains, tests, stars = planted
    settings = SolverSettings.defaults(tol=1e-7)
    theta_g, _ = fit_theta(pool(list(trains.values())), head, "exact", settings)
    assert float((theta_g - SHARED).norm()) < 0.35 * float(SHARED.norm())  # the shared part
    for user, sign in (("romeo", 1.0), ("juliet", -1.0)):
        theta_r, result = fit_theta(trains[user], head, "exact", settings, offset=theta_g)
        assert result.certificate <= 1e-7
        assert float(F.cosine_similarity(theta_r, sign * OWN, dim=0)) > 0.9  # the user's own part
        assert float((theta_g + theta_r - stars[user]).norm()) < 0.3 * float(stars[user].norm())
        held_out = HeldOut(tests[user], head)
        assert held_out(theta_g + theta_r)["nll"] < held_out(theta_g)["nll"] - 0.05  # gain beyond global


def planted_fit_config(**changes) -> FitConfig:
    """The fit section at the planted fixture's svd_cvh point, exact solver, no baselines."""
    point = Point.of("svd_cvh", 1.0, D)
    return FitConfig.from_config(
        {
            **schema_defaults("fit"),
            "heads": [point.head],
            "alphas": [point.alpha],
            "ds": [point.d],
            "solvers": ["exact"],
            "radii": [0.5, 5.0, 50.0],
            "dose_response": {"points": [{**point.columns, "solver": "exact"}], "train_tokens": [160, 320]},
            "baselines": [],
            **changes,
        }
    )


def test_study_rows_and_cross_user_matrix_on_planted_users(planted):
    """Validation paths, the choices, the refits at them and the cross-user matrix, on planted users."""
    head, layer, trains, tests, _ = planted
    point, fit = Point.of("svd_cvh", 1.0, D), planted_fit_config()
    theta_g, _ = fit_theta(pool(list(trains.values())), head, "exact", SolverSettings.defaults())
    thetas_g = {(point, "exact"): theta_g.double()}
    validated = {
        user: run(validate_user_steps(user, trains[user], {point: head}, thetas_g, NO_CACHES, fit, 0))
        for user in trains
    }
    validation = pd.DataFrame([row for rows, _ in validated.values() for row in rows])
    assert set(validation["capacity"]) == {0.5, 5.0, 50.0} and set(validation["arm"]) == {"personal", "residual"}
    choices = capacity_choices(validation)
    assert sorted(choices["train_tokens"].fillna(-1)) == [-1, -1, 160, 320]
    starts = warm_starts(pd.DataFrame([row for _, warm in validated.values() for row in warm]))
    assert len(starts) == len(validation)  # every ball of every path hands on its theta and BFGS model
    rows = {
        user: run(
            fit_user_steps(user, trains[user], tests[user], {point: head}, thetas_g, choices, NO_CACHES, fit, 0, starts)
        )
        for user in trains
    }
    residuals = {}
    for user, (fits, dose) in rows.items():
        (row,) = fits
        held_out = HeldOut(tests[user], head)
        assert row["residual_radius"] == chosen(
            choices, "capacity", **point.columns, solver="exact", arm="residual", train_tokens=math.nan
        )
        assert row["global_nll"] == pytest.approx(held_out(theta_g)["nll"])
        assert row["residual_nll"] == pytest.approx(held_out(theta_g + torch.tensor(row["theta_residual"]))["nll"])
        assert row["residual_nll"] < row["global_nll"] < row["base_nll"] and row["personal_nll"] < row["base_nll"]
        assert [d["train_tokens"] for d in dose] == [160, 320, trains[user].n]
        assert dose[-1]["residual_nll"] == row["residual_nll"] and dose[-1]["radius"] == row["residual_radius"]
        residuals[user] = torch.tensor(row["theta_residual"], dtype=torch.float64)
    users = {user: UserStates(*columns(trains[user]), *columns(tests[user])) for user in tests}
    job = FitJob(layer, users, {point: head}, torch.device("cpu"), gap=0)
    matrix = cross_user(job, point, theta_g.double(), residuals)
    assert len(matrix) == 4
    delta = matrix.pivot(index="theta_user", columns="text_user", values="delta_nll")
    for user in residuals:  # a user's own residual helps its text, the other user's hurts it
        assert delta.loc[user, user] < -0.05 < 0 < delta.drop(index=user)[user].max()
        assert delta.loc[user, user] == pytest.approx(rows[user][0][0]["residual_nll"] - rows[user][0][0]["global_nll"])


def fit_stage(job: FitJob, fit: FitConfig) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The fit stage's jobs in one process, the unigram its cache baseline: (fit_global's thetas, the
    capacity choices, the fit jobs' rows)."""
    thetas, validation = fit_global(job, fit)
    unigram, unigram_validation = global_unigram(job, fit)
    caches = CacheBaselines(unigram, None)
    per_user, warm = validate_users(job, global_thetas(thetas, "theta_fit"), caches, fit)
    choices = capacity_choices(pd.concat([validation, unigram_validation, per_user]))
    fits, _ = fit_users(job, global_thetas(thetas), choices, caches, fit, warm_starts(warm))
    return thetas, choices, fits


def test_no_choice_moves_when_the_test_tokens_change(planted):
    """fit_global, the validating jobs and the choices read train tokens only: scrambling every user's
    test tokens changes the scores on test and not one choice."""
    head, layer, trains, tests, _ = planted
    point = Point.of("svd_cvh", 1.0, D)
    fit = planted_fit_config(baselines=["unigram", "full_bias"], global_max_tokens=None)
    heads = {point: head, Point.of("full_bias", 1.0, layer.W.shape[0]): full_bias_head(layer.W)}

    def study(users: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
        return fit_stage(FitJob(layer, users, heads, torch.device("cpu"), gap=4), fit)[1:]

    users = {user: UserStates(*columns(trains[user]), *columns(tests[user])) for user in tests}
    scrambled = with_random_test_parts(users, layer.W.shape[0], seed=5)
    (choices, fits), (again, scrambled_fits) = study(users), study(scrambled)
    pd.testing.assert_frame_equal(choices, again)
    assert len(choices) == 2 * 3 + 2 + 3  # svd_cvh, full bias: 3 arms each, dose k = 160, 320, unigram 3 arms
    assert (fits["residual_nll"] != scrambled_fits["residual_nll"]).all()


def test_users_fitted_in_lockstep_get_the_rows_they_get_one_at_a_time(planted, monkeypatch):
    """The validate and fit jobs with their users in lockstep write every row they write with one user at a
    time, bit for bit (the heads, the full bias, the dose-response, a head on the unigram cache's mixture),
    and their rounds did hold both users. With the users' tokens stacked too (as on a GPU: one batched
    pass a round, uph.lm.engine.round) they choose the same and write the same rows, each number within
    the fits' tolerance: a fit stops at a certificate of fit.tol (1e-5), so where it lands, what it scores
    there and its certificate may move by that much (the rounding of the planted model's float64 sums is
    far below); the two users, each in its half's stack, alternate rounds, most of them batched."""
    head, layer, trains, tests, _ = planted
    point = Point.of("svd_cvh", 1.0, D)
    on_cache = [{**point.columns, "solver": "exact", "cache": "unigram"}]
    fit = planted_fit_config(baselines=["unigram", "full_bias"], global_max_tokens=None, on_cache=on_cache)
    heads = {point: head, Point.of("full_bias", 1.0, layer.W.shape[0]): full_bias_head(layer.W)}
    users = {user: UserStates(*columns(trains[user]), *columns(tests[user])) for user in tests}
    job = FitJob(layer, users, heads, torch.device("cpu"), gap=4)
    thetas, validation = fit_global(job, fit)
    unigram, unigram_validation = global_unigram(job, fit)
    caches = CacheBaselines(unigram, None)
    rounds, queue_round = [], uph.lm.engine.lockstep.queue_round
    monkeypatch.setattr(
        uph.lm.engine.lockstep, "queue_round", lambda requests: rounds.append(requests) or queue_round(requests)
    )
    tables = {}
    for layout in ("alone", "lockstep", "stacked"):
        rounds.clear()
        lockstep, stacked = layout != "alone", layout == "stacked"
        per_user, warm = validate_users(job, global_thetas(thetas, "theta_fit"), caches, fit, lockstep, stacked)
        choices = capacity_choices(pd.concat([validation, unigram_validation, per_user]))
        fits, dose = fit_users(job, global_thetas(thetas), choices, caches, fit, warm_starts(warm), lockstep, stacked)
        tables[layout] = [
            table.drop(columns=table.filter(like="seconds").columns) for table in (choices, per_user, warm, fits, dose)
        ]
        assert max(len(requests) for requests in rounds) == (2 if layout == "lockstep" else 1)
        if stacked:  # each user its half's stack: the two users' rounds alternate, each one batched pass
            stacks = [{objective.tokens.stack for objective, _ in r if objective.base_sum is not None} for r in rounds]
            assert len(set().union(*stacks)) == 4 and all(len(each) <= 1 for each in stacks)  # validate's 2, fit's 2
            assert sum(len(each) == 1 for each in stacks) > len(rounds) / 2
    for alone, together in zip(tables["alone"], tables["lockstep"]):
        pd.testing.assert_frame_equal(alone, together, check_exact=True)
    for together, stacked in zip(tables["lockstep"], tables["stacked"]):
        numbers = [
            c for c in together.columns if together[c].dtype.kind == "f" or c.startswith("theta") or c == "model"
        ]
        pd.testing.assert_frame_equal(together.drop(columns=numbers), stacked.drop(columns=numbers), check_exact=True)
        for column in numbers:
            for expected, found in zip(together[column], stacked[column]):
                np.testing.assert_allclose(found, expected, rtol=fit.solver.tol, atol=fit.solver.tol, err_msg=column)


def test_unigram_arms_against_explicit_mixtures(planted):
    """The three unigram arms token by token: the pooled cache, the user's, the user's on the pooled mixture."""
    _, layer, trains, tests, _ = planted
    V = layer.W.shape[0]
    train, test = trains["romeo"], tests["romeo"]
    pooled_counts = sum(torch.bincount(columns(t)[1], minlength=V).double() for t in trains.values())
    own_counts = torch.bincount(columns(train)[1], minlength=V).double()
    y = columns(test)[1]
    p_model = torch.cat([c.nll0 for c in test.chunks]).neg().exp().double()
    pooled, own = pooled_counts / pooled_counts.sum(), own_counts / own_counts.sum()
    lam, lam_g = 0.3, 0.1
    expected = {
        "global": (1 - lam) * p_model + lam * pooled[y],
        "personal": (1 - lam) * p_model + lam * own[y],
        "residual": (1 - lam) * ((1 - lam_g) * p_model + lam_g * pooled[y]) + lam * own[y],
    }
    for arm, p in expected.items():
        nll = unigram_nll(arm, lam, test, log_unigram(pooled_counts), log_unigram(own_counts), lam_g)
        assert nll == pytest.approx(float(-p.log().mean()), rel=1e-12), arm


def test_mixture_is_finite_where_the_model_probability_underflows():
    log_p_model = torch.tensor([-800.0, -1.0], dtype=torch.float64)  # exp(-800) is 0 in float64
    log_q = torch.tensor([math.log(0.5), -math.inf], dtype=torch.float64)  # a token the cache never saw
    value = mixture(0.1, log_p_model, log_q)
    assert torch.isfinite(value).all()
    torch.testing.assert_close(value, torch.tensor([math.log(0.1 * 0.5), math.log(0.9) - 1.0], dtype=torch.float64))


def residual_study(model_dir, stars: dict, max_norm: float):
    """Users whose text the tiny model wrote with their theta*: the global theta on them pooled, each
    user's residual on top, and the 'others' control, at radius `max_norm`. Returns per user (global,
    own residual, others) held-out NLL."""
    model = tiny_llama(model_dir)
    W = model.get_output_embeddings().weight.detach()
    layer = OutputLayer(W)
    settings = HeadSettings.defaults()
    head = make_head("svd_cvh", W, d=D, alpha=1.0, settings=settings, svd=torch.linalg.svd(W, full_matrices=False))
    point, solver = Point.of("svd_cvh", 1.0, D), SolverSettings.defaults()
    users, trains, tests = {}, {}, {}
    for i, (user, star) in enumerate(stars.items()):
        ids = sample_text(model, lambda h, star=star: head.logits(h, star), batch=24, length=81, seed=30 + i)
        (h_train, y_train), (h_test, y_test) = user_split(model, ids)
        users[user] = UserStates(h_train, y_train, h_test, y_test)
        trains[user], tests[user] = prepare(h_train, y_train, layer), prepare(h_test, y_test, layer)
    theta_g, _ = fit_theta(pool(list(trains.values())), head, "exact", solver, max_norm)
    residuals = {user: fit_theta(trains[user], head, "exact", solver, max_norm, theta_g)[0] for user in users}
    job = FitJob(layer, users, {point: head}, torch.device("cpu"), gap=0)
    table = others(job, {(point, "exact"): theta_g}, {(point, "exact"): residuals}).set_index("user")
    nll = {}
    for user in users:
        held_out = HeldOut(tests[user], head)
        nll[user] = (
            held_out(theta_g)["nll"],
            held_out(theta_g + residuals[user])["nll"],
            table.loc[user, "others_nll"],
        )
    return nll


def test_own_residual_beats_others_only_where_the_signal_is_personal(tmp_path):
    """Planted personal signal (theta* = shared ± own): every user's own residual beats the others' mean.
    Planted shared signal beyond the ball (every theta* the same, 3x the radius): the global theta is
    capped, each residual extends the shared direction and helps beyond global, but the others' mean
    residual helps as much: no personal gain, which own-against-global alone would claim."""
    personal = residual_study(
        tmp_path / "a", {"romeo": SHARED + OWN, "juliet": SHARED - OWN, "nurse": SHARED + OWN}, 5.0
    )
    for user, (global_nll, own, others_nll) in personal.items():
        assert own < others_nll - 0.02 and own < global_nll, user
    star = 3.0 * F.normalize(SHARED, dim=0)
    shared = residual_study(tmp_path / "b", {"a": star, "b": star, "c": star, "d": star}, 1.0)
    beyond_global = [own - global_nll for global_nll, own, _ in shared.values()]
    beyond_others = [own - others_nll for _, own, others_nll in shared.values()]
    assert max(beyond_global) < -0.02  # the residual 'helps beyond global' on every user
    assert abs(sum(beyond_others)) / len(shared) < 0.2 * abs(sum(beyond_global)) / len(shared)


@pytest.mark.parametrize("name", ["svd_cvh", "svd_uncond", "full_bias"])
def test_many_thetas_in_one_pass_score_as_one_at_a_time(planted, name):
    """HeldOut.many against HeldOut per theta: a conditional head (one at a time), unconditional and
    P = I heads (one pass for all), large and zero thetas among them."""
    _, layer, _, tests, _ = planted
    W = layer.W
    if name == "full_bias":
        head = full_bias_head(W)
    else:
        svd = torch.linalg.svd(W, full_matrices=False)
        head = make_head(name, W, d=D, alpha=1.0, settings=HeadSettings.defaults(), svd=svd)
    thetas = torch.randn(7, head.d, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    thetas[3] *= 400.0
    thetas[5] = 0.0
    held_out = HeldOut(tests["romeo"], head)
    many, one = held_out.many(thetas), [held_out(theta) for theta in thetas]
    for batched, alone in zip(many, one):
        assert batched["nll"] == pytest.approx(alone["nll"], rel=1e-6, abs=1e-9)
        assert batched["kl"] == pytest.approx(alone["kl"], rel=1e-5, abs=1e-7)


def test_a_head_on_the_unigram_cache_scores_against_the_mixture_written_out(planted):
    """Tokens.mixed: the base is the unigram residual arm's mixture; its NLL is the unigram arm's, a
    theta's held-out NLL is the CE of log(mixture) + P theta, and the logits of the exact (underflow)
    path are the mixture's log."""
    head, layer, trains, tests, _ = planted
    V = layer.W.shape[0]
    pooled = sum(torch.bincount(columns(t)[1], minlength=V).double() for t in trains.values())
    own = torch.bincount(columns(trains["romeo"])[1], minlength=V).double()
    lam_g, lam_r = 0.1, 0.3
    test = tests["romeo"].mixed(cache_mixture(pooled, own, lam_g, lam_r))
    expected = unigram_nll("residual", lam_r, tests["romeo"], log_unigram(pooled), log_unigram(own), lam_g)
    assert test.base_nll == pytest.approx(expected, rel=1e-6)
    h, y = columns(tests["romeo"])
    p_model = F.softmax(F.linear(h, layer.W).double(), dim=-1)
    log_mixture = (
        (1 - lam_r) * ((1 - lam_g) * p_model + lam_g * pooled / pooled.sum()) + lam_r * own / own.sum()
    ).log()
    uncond = make_head("uncond", layer.W, d=D, alpha=1.0, settings=HeadSettings.defaults())
    for scale in (1.0, 30.0):
        theta = scale * F.normalize(
            torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(7)), dim=0
        )
        for tilted in (uncond, head):  # one tilt for every token, and one per token
            logits = log_mixture + tilted.correction(h, theta).double()
            assert HeldOut(test, tilted)(theta)["nll"] == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-5)
    assert all(mixed.p0 is model.p0 for mixed, model in zip(test.chunks, tests["romeo"].chunks))  # no second p0
    # the logits the exact path recomputes where a cached partition sum underflows: the mixture's log
    logits = torch.cat([test.base_logits(chunk, torch.arange(len(chunk.targets))) for chunk in test.chunks], 1)
    torch.testing.assert_close(logits.T.double(), log_mixture, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="already have a mixture base"):
        test.mixed(cache_mixture(pooled, own, lam_g, lam_r))


def test_others_on_the_cache_score_the_other_users_mean_cache_theta_on_the_users_own_mixture(planted):
    """The cache arm's others control: for each user, the mean of the other users' cache thetas, scored on
    the user's held-out tokens over the user's own mixture (pooled counts, the user's train counts and the
    chosen lambdas), as written out with cache_mixture and HeldOut."""
    head, layer, trains, tests, _ = planted
    V, point = layer.W.shape[0], Point.of("svd_cvh", 1.0, D)
    users = {u: UserStates(*columns(trains[u]), *columns(tests[u])) for u in trains}
    users["nurse"] = UserStates(*columns(trains["romeo"].prefix(200)), *columns(tests["juliet"]))
    pooled = sum(torch.bincount(s.train_targets, minlength=V).double() for s in users.values())
    unigram = pd.DataFrame([{"counts": pooled.tolist(), "lambda_global": 0.1, "lambda_residual": 0.3}])
    generator = torch.Generator().manual_seed(5)
    caches = {u: torch.randn(D, dtype=torch.float64, generator=generator) for u in users}
    residuals = {u: torch.zeros(D, dtype=torch.float64) for u in users}
    job = FitJob(layer, users, {point: head}, torch.device("cpu"), gap=0)
    thetas_g = {(point, "exact"): torch.zeros(D, dtype=torch.float64)}
    cache_thetas = {"unigram": {(point, "exact"): caches}}
    table = others(job, thetas_g, {(point, "exact"): residuals}, cache_thetas, CacheBaselines(unigram, None))
    for user, states in users.items():
        own = torch.bincount(states.train_targets, minlength=V).double()
        test = prepare(states.test_hidden, states.test_targets, layer).mixed(cache_mixture(pooled, own, 0.1, 0.3))
        mean_of_others = sum(theta for other, theta in caches.items() if other != user) / 2
        expected = HeldOut(test, head)(mean_of_others)["nll"]
        assert table.set_index("user").loc[user, "cache_others_nll"] == pytest.approx(expected, rel=1e-12), user
    plain = others(job, thetas_g, {(point, "exact"): residuals})
    assert plain["cache_others_nll"].isna().all() and plain["others_nll"].notna().all()


def test_every_tokens_of_a_fit_job_shares_its_one_output_layer(planted, monkeypatch):
    """load_fit_job moves the model's output layer to the job's device and compute dtype once: every Tokens
    of fit_global's pooled fit, the validating and fitting jobs and the controls computes with that one W,
    so the pooled fit holds one W however many users it pools. The layer is stored in bfloat16 here,
    where a copy to float32 per Tokens would show."""
    _, layer, trains, tests, _ = planted
    point, fit = Point.of("svd_cvh", 1.0, D), planted_fit_config(baselines=["unigram"])
    stored = OutputLayer(layer.W.bfloat16())
    users = {user: UserStates(*columns(trains[user]), *columns(tests[user])) for user in tests}
    reads = {
        "read_output_layer": stored,
        "load_basis": torch.linalg.svd(stored.W.float(), full_matrices=False),
        "read_users": users,
        "read_model_identity": {"weights_sha256": "-"},
    }
    for name, value in reads.items():
        monkeypatch.setattr(uph.lm.jobs.fit_job, name, lambda *_, value=value: value)
    made, prepare_tokens = [], uph.lm.jobs.fit_job.prepare
    for module in (uph.lm.jobs.fit_job, uph.lm.jobs.global_fit, uph.lm.jobs.refit, uph.lm.jobs.controls):
        monkeypatch.setattr(
            module, "prepare", lambda *args, **kwargs: made.append(prepare_tokens(*args, **kwargs)) or made[-1]
        )
    job = load_methods(
        SimpleNamespace(model="model/identity.json", basis=None, users=None, shards=[]), fit, {"context": 4}, "cpu"
    )
    assert job.layer.W.dtype == torch.float32 and torch.equal(job.layer.W, stored.W.float())
    thetas, _, fits = fit_stage(job, fit)
    residuals = residual_thetas(fits)
    cross_user(job, point, global_thetas(thetas)[point, "exact"], residuals[point, "exact"])
    others(job, global_thetas(thetas), residuals)
    assert len(made) > 6 * len(users)  # fit_global's pooled parts and validation parts, the fit jobs', the controls'
    assert all(tokens.layer.W is job.layer.W for tokens in made)
