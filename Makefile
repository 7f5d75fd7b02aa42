# Two commands on a fresh machine:  `make demo` (the main job) and `make test` (lint + the whole test suite).
# Each creates .venv and installs what it needs; torch is pinned to the CPU wheel this platform ships locally.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.base: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.dev: $(VENV)/.base
	$(BIN)/pip install -q -e ".[dev,eval,train,plot,triton,serve]"
	touch $@

.PHONY: install install-dev demo test lint
install: $(VENV)/.base
install-dev: $(VENV)/.dev

demo: $(VENV)/.base
	$(BIN)/dlm-decode demo
	$(BIN)/dlm-decode demo --model demo-llada2 --quick   # block-causal: exact cache

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q -m "not gpu"   # slow tests included (about 10 min on 2 cores); a bare pytest skips them (about 3.5 min)
