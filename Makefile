# Two entry points for a fresh machine:  make demo  and  make test.
# The tested versions are pinned in constraints.txt; torch is the CPU build 2.13.0.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= test,math,chem,lora,tensorboard

.PHONY: install demo test test-fast bench clean

$(BIN)/grpokit: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(BIN)/grpokit

install: $(BIN)/grpokit

demo: install
	$(BIN)/grpokit demo

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

bench: install
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[bench]"
	$(BIN)/python bench/vs_trl.py

clean:
	rm -rf $(VENV) runs .pytest_cache
