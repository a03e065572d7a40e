"""A user's own loss, end to end: a module that registers it, named in the config's algo.imports, trained with
`grpokit train` in a fresh process (as a user runs it), on a tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import yaml
from shared_helpers import tiny_run_config

# REINFORCE with a baseline-free advantage and the token mean of the micro-batch: l = -A logp. Its metric shows
# in metrics.jsonl that the run trained with it; `calls` counts its micro-batches.
MY_LOSS = textwrap.dedent(
    """
    from grpokit.algos import register_loss


    @register_loss("reinforce", aggregation="bnpo")
    def reinforce(terms, spec):
        per_token = -terms.advantages * terms.logprobs  # [N, 1] x [N, T] -> [N, T]
        return per_token, {"reinforce/logprob_mean": terms.batch_mean(terms.logprobs.detach())}
    """
)


@pytest.mark.slow
def test_a_registered_loss_trains_through_the_cli(tmp_path, tiny_model_dir, word_prompts):
    (tmp_path / "my_loss.py").write_text(MY_LOSS)
    path = tiny_run_config(
        tmp_path,
        tiny_model_dir,
        max_steps=2,  # given again on the command line below
        prompts_per_step=1,
        prompts=word_prompts,
        algo={"beta": 0.0, "loss_type": "reinforce", "imports": ["my_loss.py"]},
        generation={"max_completion_length": 5},
        optim={"gradient_accumulation_steps": 2},
        run={"save_steps": 0},
    ).rename(tmp_path / "config.yaml")
    done = subprocess.run(
        [sys.executable, "-m", "grpokit", "train", "config.yaml", "max_steps=2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "loss" in m]
    assert len(steps) == 2
    for m in steps:  # the run used the registered loss: its metric, a mean log-prob, is there and negative
        assert m["reinforce/logprob_mean"] < 0
        assert "clip_ratio/region_mean" not in m  # the clipped surrogate's metric: not this loss
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["algo"]["loss_type"] == "reinforce"
    # the same config without the module: one line naming the unknown loss and where a loss is registered
    config = yaml.safe_load(path.read_text())
    config["algo"]["imports"] = []
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    bad = subprocess.run(
        [sys.executable, "-m", "grpokit", "train", "bad.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "loss_type='reinforce' is not valid" in bad.stderr and "algo.imports" in bad.stderr
