# Quick start: `make demo` builds the demo corpus and trains a tiny model on it;
# `make test` runs the test suite. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_OUT ?= out/demo

.PHONY: demo test test-pod lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[dev]'
	# fasttext-predict and the training wheel both install the module `fasttext`: put the
	# one that also trains last (both predict alike; see pyproject's `classifier` extra).
	$(BIN)/pip install -q --force-reinstall --no-deps 'fasttext-numpy2-wheel==0.9.2'
	# The interop extra's two loaders whose declared requirements (numpy<2.2, transformers<5,
	# torchvision) this environment cannot meet; their token readers need none of them.
	$(BIN)/pip install -q --no-deps 'litdata==0.2.76' 'mosaicml-streaming==0.13.0'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/lemur-data build --set output=$(DEMO_OUT)
	$(BIN)/lemur-data stats $(DEMO_OUT)
	$(BIN)/lemur-data verify $(DEMO_OUT)
	$(BIN)/lemur-data inspect $(DEMO_OUT)
	rm -rf $(DEMO_OUT)-train
	$(BIN)/lemur-train demo --set data.dirs=$(DEMO_OUT) --set run_dir=$(DEMO_OUT)-train
	$(BIN)/lemur-train plot $(DEMO_OUT)-train

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=15 -m "not pod"

# The shipped configs compiled for their TPU pods (about 75 s each on 2 cores): their own
# step, run by CI after `make test` and wanted after a change to the model, its sharding or
# a shipped config.
test-pod: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n 2 --durations=5 -m pod

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check lemur tests tools
	$(BIN)/ruff format --check lemur tests tools

clean:
	rm -rf $(VENV) out
