"""The CI-sized soak (bench/soak.py run short): a tiny model trained a few hundred steps with evaluation, checkpoints,
the store and a reward served by `grpokit serve-rewards` beside a local one, sampled every 20 steps. After warm-up
(the first two samples), open file descriptors, OS threads and child processes are the same count at every
sample: nothing leaks per step, per evaluation, per checkpoint or per remote request. Counts only, never times;
memory and step time are bench/soak.py's figures (docs/reliability.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).parents[2] / "bench" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("grpokit_bench_soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # ~1 min on two shared cores
def test_descriptors_threads_and_children_do_not_grow(tmp_path):
    """Synchronous, so each sample is taken between steps with nothing in flight: the counts are exact. (With
    max_staleness the producer may be mid-request at a sample; bench/soak.py checks those runs by floor and ceiling.)
    """
    soak = load_soak()
    samples = soak.soak(tmp_path, steps=200, every=20, eval_steps=50, save_steps=50)
    assert [s.step for s in samples] == list(range(20, 201, 20))
    after = samples[2:]
    for name in ("fds", "threads", "children"):
        counts = [getattr(s, name) for s in after]
        assert len(set(counts)) == 1, f"{name} changed after warm-up: {counts} (steps {[s.step for s in after]})"
    assert after[0].children >= 2  # the counting works: serve-rewards and its reward worker are children here
    assert after[-1].store_mb > after[0].store_mb  # the store was written all along
