"""Shared fixtures: tiny models and tokenizers built locally and saved, so from_pretrained runs for real."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import shared_helpers
from shared_helpers import CHAT_TEMPLATE, WORDS


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random-init 2-layer Llama with a word-level tokenizer (with a chat template), saved to a folder."""
    from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = build_word_tokenizer([*WORDS, "user", "assistant", "system", ":"])
    tokenizer.chat_template = CHAT_TEMPLATE
    build_tiny_causal_lm(path, tokenizer, arch="llama", hidden_size=32, num_layers=2, num_heads=2)
    return path


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory):
    """A copy of the grpokit package to extend (``package_copy.PackageCopy``), one per test module: its module-scoped
    fixture makes the edits, its tests check the files changed and run the copy."""
    from package_copy import PackageCopy

    return PackageCopy(tmp_path_factory.mktemp("src"))


@pytest.fixture()
def word_prompts():
    """30 prompts of five words each; the `target` column names the word the reward asks for (a fresh list)."""
    return shared_helpers.word_prompts()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads: splitting their matmuls costs more than it saves, badly
    so on busy cores. Modules that use it: ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def sigint_handler_unchanged():
    """Fails the test that leaves a SIGINT handler other than the one it found: a later test that sends
    Ctrl-C (or a user's program after ``train()``) would otherwise not get its KeyboardInterrupt."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"the test left SIGINT handled by {after!r} (found {before!r}); it must restore the handler")


@pytest.fixture(autouse=True)
def ray_left_down():
    """Shuts down a Ray cluster a test started and left up (``train()`` with ``backend: ray`` keeps the one it
    started, for the next ``train()`` in the process): the next test on this worker would join it instead of
    starting its own with the resources it asks for. A module's shared cluster, up before the test, stays."""
    import sys

    def up() -> bool:
        ray = sys.modules.get("ray")
        return ray is not None and ray.is_initialized()

    was_up = up()
    yield
    if up() and not was_up:
        sys.modules["ray"].shutdown()
