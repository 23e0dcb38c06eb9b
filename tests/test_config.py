import contextlib
import copy
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO

from uph.config import key_path, read_command_line, results_folder, schema_defaults, validate
from uph.device import (
    BRANCH_DEFAULTS,
    bfloat16_native,
    branch_device,
    device_record,
    gpu_visible,
    requests_gpu,
    resolve_dtype,
    setup_device,
)
from uph.errors import ConfigError, UphError

SHIPPED = ["config.yaml", *sorted(path.relative_to(REPO).as_posix() for path in (REPO / "config").glob("*.yaml"))]


@pytest.fixture(params=["config.yaml", "config/test.yaml"])
def config(request):
    return yaml.safe_load((REPO / request.param).read_text())


def test_shipped_configs_are_valid_and_get_defaults(config):
    steps = config["fit"].get("steps")  # config/test.yaml's own, config.yaml's from the schema
    validate(config)
    assert config["fit"]["steps"] == (steps or 30) and config["fit"]["lr"] == 0.05  # seed 002 defaults


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.update(modle={}), "config key 'modle' is not known"),
        (lambda c: c["extract"].update(shard=2), "config key 'extract.shard' is not known"),
        (lambda c: c.update(warm_workers="auto"), "config key 'warm_workers' is not known"),
        (lambda c: c["extract"].update(shards=0), "config key 'extract.shards': 0 is less than the minimum of 1"),
        (lambda c: c["extract"].update(dtype="float8"), "config key 'extract.dtype': 'float8' is not one of"),
        (
            lambda c: c["corpus"].update(min_tokens="many"),
            "config key 'corpus.min_tokens': 'many' is not of type 'integer'",
        ),
        (lambda c: c.update(device="tpu"), "config key 'device': 'tpu' is not one of"),
        (lambda c: c["fit"].update(device="gpu"), "config key 'fit.device': 'gpu' is not one of"),
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
                on_cache=[{"head": "cvh", "alpha": c["fit"]["alphas"][0], "d": c["fit"]["ds"][0]}],
                baselines=["full_bias"],
            ),
            "config key 'fit.on_cache[0]': the head fits on the unigram cache; add unigram to fit.baselines",
        ),
        (
            lambda c: c["fit"].update(
                on_cache=[
                    {"head": "cvh", "alpha": c["fit"]["alphas"][0], "d": c["fit"]["ds"][0]},
                    {
                        "head": "cvh",
                        "alpha": c["fit"]["alphas"][0],
                        "d": c["fit"]["ds"][0],
                        "cache": "neural_cache",
                    },
                ],
                baselines=["unigram"],
            ),
            "config key 'fit.on_cache[1]': the head fits on the neural_cache cache; add neural_cache to fit.baselines",
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
    from uph.lm.jobs.choices import Point
    from uph.lm.jobs.fit_job import FitConfig

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


def merged(path: str) -> dict:
    """A shipped config as a run sees it: config.yaml (the Snakefile's configfile) updated by `path`
    (--configfile), nested sections merged key by key."""

    def update(base: dict, extra: dict) -> dict:
        for key, value in extra.items():
            base[key] = update(base.get(key, {}), value) if isinstance(value, dict) else value
        return base

    return update(yaml.safe_load((REPO / "config.yaml").read_text()), yaml.safe_load((REPO / path).read_text()))


def written_keys(config: dict, path=()):
    """The key paths a YAML config writes a value at (into its sections, not the sections themselves)."""
    for key, value in config.items():
        if isinstance(value, dict) and value:
            yield from written_keys(value, (*path, key))
        else:
            yield (*path, key)


def value_at(config: dict, path) -> object:
    for key in path:
        config = config[key]
    return config


@pytest.mark.parametrize("path", SHIPPED)
def test_a_shipped_config_repeats_no_default(path):
    """The schemas hold every default, and no shipped config repeats one: config.yaml writes no key at its
    schema default, a config/*.yaml (merged onto config.yaml) none at the value both the schemas and
    config.yaml give it (it may set back a default config.yaml changes: test.yaml's fit.solvers)."""
    schemas = validate({"model": {"name": "-", "source": "tiny:gpt2"}, "corpus": {}, "extract": {}})
    schemas["model"].update(name=None, source=None)  # required: no default to repeat
    default_study = validate(yaml.safe_load((REPO / "config.yaml").read_text()))
    study = validate(merged(path))
    repeated = [
        key_path(key)
        for key in written_keys(yaml.safe_load((REPO / path).read_text()))
        if value_at(study, key) == value_at(default_study, key) == value_at(schemas, key)
    ]
    assert repeated == []


@pytest.mark.parametrize("path", SHIPPED)
def test_float32_is_the_extraction_dtype_of_the_schema_and_of_every_shipped_config(path):
    """The effects are ~1e-3 nats and bfloat16 states move a base NLL by 3e-3 to 1e-2: float32 wherever
    no one asks otherwise, and in every config the repository ships (config/*.yaml as merged onto
    config.yaml), whatever the machine (no `auto`)."""
    assert schema_defaults("extract")["dtype"] == "float32"
    config = merged(path)
    assert validate(config)["extract"]["dtype"] == "float32"
    for device in (torch.device("cpu"), torch.device("cuda")):
        assert resolve_dtype(config["extract"]["dtype"], device) == torch.float32
    config["extract"].pop("dtype")
    assert validate(config)["extract"]["dtype"] == "float32"


def test_auto_dtype_is_bfloat16_only_where_native_and_never_float16():
    """`extract.dtype: auto`: bfloat16 on a CPU with AVX512-BF16 or AMX (read here from /proc/cpuinfo's
    flags, independently of torch's check) or a GPU with bfloat16 units, float32 elsewhere; a cuda
    device on a machine without one resolves (to float32) rather than failing."""
    for device in (torch.device("cpu"), torch.device("cuda")):
        assert resolve_dtype("auto", device) == (torch.bfloat16 if bfloat16_native(device) else torch.float32)
        assert resolve_dtype("auto", device) != torch.float16
    if not torch.cuda.is_available():
        assert resolve_dtype("auto", torch.device("cuda")) == torch.float32
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file() and os.uname().machine == "x86_64":
        flags = {flag for line in cpuinfo.read_text().splitlines() if line.startswith("flags") for flag in line.split()}
        native = bool({"avx512_bf16", "amx_bf16"} & flags)
        assert resolve_dtype("auto", torch.device("cpu")) == (torch.bfloat16 if native else torch.float32)
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16  # only when asked for by name


def test_each_branch_computes_on_its_own_device_key_else_its_default(config):
    """Extraction and the fit stage follow the top-level device; the small training runs use cpu; a
    `<branch>.device` overrides either. A job asks for a GPU where its device is cuda, or auto on a
    machine that sees one (gpu_visible, without torch)."""
    config = validate(copy.deepcopy(config))
    assert all(config[branch]["device"] is None for branch in BRANCH_DEFAULTS)
    config["device"] = "cuda"
    devices = {branch: branch_device(config, branch) for branch in BRANCH_DEFAULTS}
    assert devices == {"extract": "cuda", "fit": "cuda", "copy_task": "cpu", "attention": "cpu", "feedback": "cpu"}
    config["device"] = "auto"
    config["fit"]["device"], config["feedback"]["device"], config["attention"]["device"] = "cpu", "cuda", "auto"
    devices = {branch: branch_device(config, branch) for branch in BRANCH_DEFAULTS}
    assert devices == {"extract": "auto", "fit": "cpu", "copy_task": "cpu", "attention": "auto", "feedback": "cuda"}
    assert requests_gpu("cuda") and not requests_gpu("cpu")
    assert requests_gpu("auto") == gpu_visible()
    if not torch.cuda.is_available():
        assert not gpu_visible()  # this machine cannot run a CUDA job, so auto must not queue for a GPU


def test_setting_up_a_cpu_job_changes_none_of_its_numerics(monkeypatch):
    """setup_device turns TF32 off and deterministic kernels on for CUDA only: a CPU job (the tables'
    bytes) computes exactly as before, and its record says so. A job that may use CUDA gets cuBLAS's
    deterministic workspace before CUDA starts."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled())
    assert setup_device("cpu") == torch.device("cpu")
    assert (torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled()) == before
    record = device_record(torch.device("cpu"), torch.float32)
    assert record["device"] == "cpu" and record["dtype"] == "float32" and record["device_name"] and record["host"]
    assert "tf32_matmul" not in record and record["float32_matmul_precision"] == "highest"
    if not torch.cuda.is_available():
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        with pytest.raises(ConfigError, match="config key 'device' is 'cuda' but no CUDA device is available"):
            setup_device("cuda")
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_an_integer_written_as_a_float_is_read_as_that_integer_and_a_fraction_is_refused(config):
    """YAML reads 2.0 as a float, which JSON Schema counts as an integer: validate makes it the integer
    (in sections, nested objects and lists), so no integer setting reaches the code as a float
    (range(2.0) was a TypeError at DAG build); 2.5 is one line naming the key."""
    config = copy.deepcopy(config)
    ds = validate(copy.deepcopy(config))["fit"]["ds"]
    config["extract"]["shards"] = 2.0
    config["fit"].update(jobs=1.0, bootstrap=1000.0, ds=[float(d) for d in ds], global_max_tokens=2048.0)
    config["fit"]["dose_response"]["train_tokens"] = [256.0]
    config.setdefault("copy_task", {})["seeds"] = [0.0, 1.0]
    validated = validate(config)
    integers = [
        validated["extract"]["shards"],
        validated["fit"]["jobs"],
        validated["fit"]["bootstrap"],
        *validated["fit"]["ds"],
        validated["fit"]["global_max_tokens"],
        *validated["fit"]["dose_response"]["train_tokens"],
        *validated["copy_task"]["seeds"],
    ]
    assert integers == [2, 1, 1000, *ds, 2048, 256, 0, 1] and {type(value) for value in integers} == {int}
    assert type(validated["fit"]["lr"]) is float  # a number key keeps its float
    for section, key, value, where in [
        ("extract", "shards", 2.5, "extract.shards"),
        ("fit", "ds", [*ds, 16.5], f"fit.ds[{len(ds)}]"),
        ("corpus", "max_tokens", 4000.5, "corpus.max_tokens"),
    ]:
        bad = copy.deepcopy(config)
        bad[section][key] = value
        with pytest.raises(ConfigError) as error:
            validate(bad)
        shown = value[-1] if isinstance(value, list) else value
        assert str(error.value) == f"config key '{where}': {shown} is not a whole number; write an integer"


@pytest.mark.parametrize(("key", "text", "value"), [("bootstrap", "1e3", 1000), ("tol", "1e-5", 1e-5)])
def test_the_advice_for_a_number_read_as_text_followed_literally_gives_the_number(key, text, value):
    """fit.bootstrap: 1e3 is text to YAML; the line says how to write it, and YAML reads that as the number
    (it once advised 1.0e3, text again)."""
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    config["fit"].update(yaml.safe_load(f"{{{key}: {text}}}"))
    assert config["fit"][key] == text  # what PyYAML, and so Snakemake, reads
    with pytest.raises(
        ConfigError, match=rf"^config key 'fit.{key}': '{re.escape(text)}' is text, not a number; "
    ) as error:
        validate(config)
    written = re.search(r"write it as (\S+) ", str(error.value)).group(1)
    config["fit"].update(yaml.safe_load(f"{{{key}: {written}}}"))
    assert validate(config)["fit"][key] == value


@pytest.mark.parametrize(
    "given, written",
    [
        ("runs/x", "runs/x"),
        ("./runs/x", "runs/x"),
        ("runs/x/", "runs/x"),
        ("./runs//x/./", "runs/x"),
        ("runs/../runs/x", "runs/x"),
        ("{cwd}/runs/x/", "runs/x"),  # an absolute path under the working directory
        ("link/", "link"),  # a symlink to a folder: as written, the folder read and written through it
        (".", "."),
        ("{cwd}", "."),
        ("../elsewhere/x/", "../elsewhere/x"),  # outside the working directory: relative as written
        ("{parent}/elsewhere/x/", "{parent}/elsewhere/x"),  # and absolute as written
        ("/srv/runs/x/", "/srv/runs/x"),
    ],
)
def test_the_results_folder_is_written_as_the_rules_spell_their_paths(tmp_path, given, written):
    cwd = tmp_path / "work"
    (cwd / "x").mkdir(parents=True)
    (cwd / "link").symlink_to(cwd / "x")
    spell = {"cwd": str(cwd), "parent": str(tmp_path)}
    assert results_folder(given.format(**spell), cwd) == written.format(**spell)


def test_a_corpus_file_and_a_model_folder_are_named_in_one_spelling(monkeypatch, tmp_path):
    """`./users.jsonl`, `users.jsonl` and its absolute path are one setting (the records hold it): each
    validates to the same spelling, as does a local model folder; a hub id stays as written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "users.jsonl").write_text('{"user_id": "a", "text": "hello"}\n')
    (tmp_path / "models/x").mkdir(parents=True)
    spellings = set()
    for corpus, model in [
        ("./users.jsonl", "./models/x/"),
        ("users.jsonl", "models/x"),
        (f"{tmp_path}/users.jsonl", f"{tmp_path}/models/x"),
    ]:
        config = yaml.safe_load((REPO / "config/test.yaml").read_text())
        config["corpus"]["source"], config["model"]["source"] = corpus, model
        config["model"]["gguf_file"] = None
        with contextlib.suppress(UphError):  # an empty model folder: refused after the spelling is fixed
            validate(config)
        spellings.add((config["corpus"]["source"], config["model"]["source"]))
    assert spellings == {("users.jsonl", "models/x")}


@pytest.mark.parametrize(
    "given, read",
    [
        ({"fit": {"radii": ["0.5", "5.0"]}}, {"radii": [0.5, 5.0]}),  # --config 'fit={radii: [0.5, 5.0]}'
        ({"fit": {"jobs": "2", "device": "null"}}, {"jobs": 2, "device": None}),
        (  # a list of points, each a mapping
            {"fit": {"cross_user": [{"head": "svd_cvh", "alpha": "1.0", "d": "8"}]}},
            {"cross_user": [{"head": "svd_cvh", "alpha": 1.0, "d": 8}]},
        ),
    ],
)
def test_nested_command_line_settings_are_read_as_yaml(given, read):
    """Snakemake reads a nested --config value with YAML's base loader, every leaf text: read as a config
    file's YAML, the nested form validates; the other keys of the section stay as the config file has them."""
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    before = dict(config["fit"])
    config["fit"].update(given["fit"])  # as Snakemake merged it
    read_command_line(config, given)
    assert {key: config["fit"][key] for key in read} == read
    assert {k: v for k, v in config["fit"].items() if k not in given["fit"]} == {
        k: v for k, v in before.items() if k not in given["fit"]
    }
    assert validate(config)["fit"]["jobs"] >= 1
    top = {"device": "cpu", "seed": 3}  # top-level values: Snakemake parsed them; left alone
    assert read_command_line({"device": "cpu", "seed": 3}, top) == top


def test_a_second_run_on_a_results_folder_is_refused_naming_the_first(tmp_path):
    """The lock a run holds on its results folder (uph.config.hold_results_folder, onstart): another process
    is refused in one line naming the folder, the first run's host and process; once it ends, the folder
    is free."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from uph.config import hold_results_folder; "
         "hold_results_folder(sys.argv[1]); print('held', flush=True); time.sleep(60)", str(tmp_path / "results")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        script = "import sys; from uph.config import hold_results_folder; hold_results_folder(sys.argv[1])"
        second = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "results")], capture_output=True, text=True
        )
        assert second.returncode == 1
        assert second.stderr.splitlines()[-1] == (
            f"uph.errors.ConfigError: results folder '{tmp_path}/results' is in use by another run (host "
            f"{socket.gethostname()}, process {holder.pid}); wait for it to end, or give this run another folder "
            "(config key 'results')"
        )
    finally:
        holder.kill()
        holder.wait()
    freed = subprocess.run([sys.executable, "-c", script, str(tmp_path / "results")], capture_output=True, text=True)
    assert freed.returncode == 0, freed.stderr


def test_validation_writes_the_results_folder_normalized(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    config["results"] = "./runs/x/"
    assert validate(config)["results"] == "runs/x"
    assert validate(config)["results"] == "runs/x"  # once normalized, the same
