"""The loss types grpokit took from TRL (cispo, sapo, luspo, vespo) and the two masks (top_entropy_quantile,
off_policy_mask_threshold) in training runs on a tiny model, through the public API, as a TRL script sets them:
the run trains (its weights move), and each logs what shows its loss and mask at work. Their numbers are TRL's
(tests/integration/test_trl_parity.py) and worked by hand (tests/unit/test_algos_loss_types.py)."""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch
from shared_helpers import tiny_args, word_prompts

from grpokit import GRPOTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

G = 4
ROWS = word_prompts(16, target=None)
# one step: G completions of one prompt, in two micro-batches
one_step = functools.partial(
    tiny_args, num_generations=G, prompts_per_step=1, gradient_accumulation_steps=2, max_steps=1
)


def varied(completions, **kwargs):
    """A reward that differs between completions (their text), so every group has advantages of both signs."""
    return [float(sum(map(ord, c)) % 5) for c in completions]


@pytest.mark.parametrize(
    ("settings", "shows"),
    [
        # cispo on the top half of each micro-batch's tokens by entropy; two passes, so ratios leave 1 and the cap
        # (epsilon_high 1.001) lowers some positive-advantage tokens' weights
        (
            {"loss_type": "cispo", "epsilon_high": 1.001, "top_entropy_quantile": 0.5, "algo": {"num_iterations": 2}},
            "cispo_clip_ratio",
        ),
        # sapo with the off-policy mask at 0: on the second pass every negative-advantage completion the policy
        # moved away from is dropped
        (
            {"loss_type": "sapo", "off_policy_mask_threshold": 0.0, "algo": {"num_iterations": 2}},
            "off_policy_mask/dropped_fraction",
        ),
        ({"loss_type": "luspo", "importance_sampling_level": "sequence"}, "clip_ratio/region_mean"),
        ({"loss_type": "vespo", "algo": {"num_iterations": 2}}, "vespo/phi_seq_mean"),
    ],
    ids=["cispo+entropy", "sapo+off_policy", "luspo", "vespo"],
)
def test_loss_type_trains(tiny_model_dir, tmp_path, settings, shows):
    args = one_step(tmp_path / "run", max_completion_length=5, learning_rate=5e-3, beta=0.0, save_steps=0, **settings)
    trainer = GRPOTrainer(str(tiny_model_dir), varied, args=args, train_dataset=ROWS)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    moved = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])]
    assert len(moved) == len(before), sorted(set(before) - set(moved))
    step = next(json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    assert math.isfinite(step["loss"]) and shows in step, step
    if shows == "off_policy_mask/dropped_fraction":
        assert 0 < step[shows] < 1  # the last pass dropped some completions, not all
    if shows == "cispo_clip_ratio":
        assert step[shows] > 0
    if shows == "vespo/phi_seq_mean":
        assert step[shows] != 1.0  # off-policy on the second pass: phi(w) moved from phi(1) = 1
