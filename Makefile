# Two entry points for a fresh machine:  make demo  and  make test.
# The tested versions are pinned in constraints.txt; torch is the CPU build 2.13.0, installed first
# so that no dependency pulls a CUDA build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q -c constraints.txt

.PHONY: demo test test-fast bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0

$(VENV)/.demo: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) -e .
	touch $@

$(VENV)/.test: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) -e ".[test,math,chem,lora,qlora,tensorboard,wandb,ray,bench]"  # bench: TRL, for the parity test
	touch $@

demo: $(VENV)/.demo
	$(BIN)/grpokit demo

test: $(VENV)/.test
	$(BIN)/python -m pytest -q

test-fast: $(VENV)/.test
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(VENV)/.test
	$(BIN)/python bench/vs_trl.py

clean:
	rm -rf $(VENV) runs .pytest_cache
