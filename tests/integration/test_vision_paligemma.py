"""PaliGemma (1 and 2) trains end to end: the tiny random-init PaliGemma of tests/vlm_families.py (real transformers
model and processor classes) saved to a folder and named by its path (the processor loaded from it), a reference
(beta > 0), 2 steps:
every parameter it uses moves, vision tower and projector included. Its log-probs are the model's own (bidirectional
prompt, causal completion of token_type_ids 1, 1-based positions): tests/unit/test_vision_families.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from grpokit import GRPOConfig, GRPOTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vlm_families import BUILDERS

pytestmark = pytest.mark.usefixtures("one_thread")


def said_red(completions, **kwargs):
    return [float("red" in c[0]["content"].split()) for c in completions]


def rows() -> list[dict]:
    chat = [{"role": "user", "content": "What is this?"}]
    return [{"prompt": chat, "image": Image.new("RGB", (30, 30), rgb)} for rgb in [(255, 0, 0), (0, 0, 255)]]


@pytest.mark.parametrize("family", ["paligemma", "paligemma2"])
def test_paligemma_trains_every_parameter(family, tmp_path):
    torch.manual_seed(0)
    model, processor, _ = BUILDERS[family]()
    model.save_pretrained(tmp_path / family)
    processor.save_pretrained(tmp_path / family)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"), num_generations=4, per_device_train_batch_size=8, max_completion_length=3,
        max_steps=2, learning_rate=1e-2, report_to="none", disable_tqdm=True, beta=0.04,
    )  # fmt: skip
    trainer = GRPOTrainer(model=str(tmp_path / family), reward_funcs=said_red, args=args, train_dataset=rows() * 2)
    trainer.train()
    moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    # SigLIP's pooling head makes a pooled output PaliGemma does not read (it projects every patch): no gradient
    unused = {n for n in before if ".vision_tower.head." in n}
    assert unused and moved == set(before) - unused  # the vision tower and projector too
    assert (tmp_path / "run" / "final" / "preprocessor_config.json").is_file()
