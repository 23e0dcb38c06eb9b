import copy

import pytest
import yaml
from conftest import REPO

from uph.config import validate
from uph.errors import ConfigError


@pytest.fixture(params=["config.yaml", "config/test.yaml"])
def config(request):
    return yaml.safe_load((REPO / request.param).read_text())


def test_shipped_configs_are_valid_and_get_defaults(config):
    validate(config)
    assert config["fit"]["steps"] == 30 and config["fit"]["lr"] == 0.05  # seed 002 defaults


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.update(modle={}), "config key 'modle' is not known"),
        (lambda c: c["extract"].update(shard=2), "config key 'extract.shard' is not known"),
        (lambda c: c["extract"].update(shards=0), "config key 'extract.shards': 0 is less than the minimum of 1"),
        (lambda c: c["extract"].update(dtype="float8"), "config key 'extract.dtype': 'float8' is not one of"),
        (
            lambda c: c["corpus"].update(min_tokens="many"),
            "config key 'corpus.min_tokens': 'many' is not of type 'integer'",
        ),
        (lambda c: c.update(device="tpu"), "config key 'device': 'tpu' is not one of"),
        (lambda c: c["model"].pop("source"), "config key 'model': 'source' is a required property"),
        (lambda c: c["corpus"].update(min_tokens=300), "config key 'corpus.min_tokens': 300 leaves"),
        (
            lambda c: c["corpus"].update(source="/no/users.parquet"),
            "config key 'corpus.source': corpus file '/no/users.parquet' does not exist",
        ),
        (lambda c: c["corpus"].update(source="users.csv"), "config key 'corpus.source': 'users.csv' is neither"),
        (
            lambda c: c["model"].update(source="/no/model"),
            "config key 'model.source': model folder '/no/model' does not exist",
        ),
        (lambda c: c["fit"].update(heads=["cvh", "vera"]), "config key 'fit.heads[1]': 'vera' is not one of"),
        (
            lambda c: c["fit"].update(alphas=[-0.1]),
            "config key 'fit.alphas[0]': -0.1 is less than or equal to the minimum of 0",
        ),
        (lambda c: c["fit"].update(alphas="0.1"), "config key 'fit.alphas': '0.1' is not of type 'array'"),
        (lambda c: c["fit"].update(ds=[]), "config key 'fit.ds': [] should be non-empty"),
        (lambda c: c["fit"].update(steps=-3), "config key 'fit.steps': -3 is less than the minimum of 1"),
        (
            lambda c: c["fit"].update(cross_user=[{"head": "cvh", "alpha": 7.0, "d": 8}]),
            "config key 'fit.cross_user[0]': cvh alpha=7.0 d=8 is not a point",
        ),
        (
            lambda c: c["fit"].update(on_cache=[{"head": "svd_uncond", "alpha": 7.0, "d": 8}]),
            "config key 'fit.on_cache[0]': svd_uncond alpha=7.0 d=8 is not a point",
        ),
        (
            lambda c: c["fit"].update(
                on_cache=[{"head": c["fit"]["heads"][0], "alpha": c["fit"]["alphas"][0], "d": c["fit"]["ds"][0]}],
                baselines=["full_bias"],
            ),
            "config key 'fit.on_cache': the heads fit on the unigram cache; add unigram to fit.baselines",
        ),
    ],
)
def test_bad_values_name_the_key(config, edit, message):
    config = copy.deepcopy(config)
    edit(config)
    with pytest.raises(ConfigError) as error:
        validate(config)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_d_above_the_hidden_size_is_refused(config):
    from uph.config import check_against_model

    validate(config)
    config["fit"]["ds"] = [8, 65]
    with pytest.raises(
        ConfigError, match="config key 'fit.ds': d=65 is larger than the basis rank, the hidden size 64"
    ):
        check_against_model(config, {"name": "tiny", "hidden_size": 64})
    config["fit"]["ds"] = [8]
    config["fit"]["extra_points"] = [{"head": "svd_cvh", "alpha": 1.0, "d": 128}]
    with pytest.raises(ConfigError, match="config key 'fit.extra_points': d=128 is larger than the basis rank"):
        check_against_model(config, {"name": "tiny", "hidden_size": 64})


def test_extra_points_join_the_sweep_once_and_may_be_listed(config):
    """fit.extra_points: a head at a d beyond fit.ds joins the sweep (once, after the product), and a
    list of points (cross_user, dose_response, on_cache) may name it."""
    from uph.config import sweep_points
    from uph.lm.sweep import FitConfig, Point

    config = copy.deepcopy(config)
    fit = config["fit"]
    fit.update(heads=["svd_cvh", "uncond"], alphas=[1.0], ds=[8], solvers=["exact"])
    fit["extra_points"] = [{"head": "svd_uncond", "alpha": 1.0, "d": 32}, {"head": "svd_cvh", "alpha": 1.0, "d": 8}] * 2
    fit["cross_user"] = [{"head": "svd_uncond", "alpha": 1.0, "d": 32, "solver": "exact"}]
    fit["dose_response"]["points"], fit["on_cache"] = [], []
    validated = validate(config)
    assert sweep_points(validated["fit"]) == [("svd_cvh", 1.0, 8), ("uncond", 1.0, 8), ("svd_uncond", 1.0, 32)]
    assert FitConfig.from_config(validated["fit"]).points[-1] == Point.of("svd_uncond", 1.0, 32)
    fit["cross_user"] = [{"head": "svd_uncond", "alpha": 1.0, "d": 8, "solver": "exact"}]
    with pytest.raises(ConfigError, match=r"'fit.cross_user\[0\]': svd_uncond alpha=1.0 d=8 is not a point"):
        validate(config)
