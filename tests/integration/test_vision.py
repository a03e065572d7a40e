"""Vision-language models end to end on a tiny Qwen2-VL saved to a folder and loaded with from_pretrained (its
processor built without torchvision): TRL's GRPOTrainer with processing_class=processor, full fine-tuning (every
parameter moves), freeze_vision_tower / freeze_projector, LoRA on the language model, and `grpokit train` on a YAML
config whose dataset names image files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from PIL import Image

from grpokit import GRPOConfig, GRPOTrainer

pytestmark = pytest.mark.usefixtures("one_thread")
COLOURS = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255)}
WORDS = [*COLOURS, "colour", "?"]


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    path = tmp_path_factory.mktemp("tiny-qwen2-vl")
    build_tiny_qwen2_vl(path, words=WORDS, image_side=28)
    return path


def colour_reward(prompts, completions, answer, image, **kwargs):
    """1 when the completion names the image's colour; the images arrive as PIL images, as TRL passes them."""
    assert all(isinstance(i, Image.Image) for i in image)
    return [float(a in c[0]["content"].split()) for c, a in zip(completions, answer)]


def rows():
    chat = [{"role": "user", "content": "colour ?"}]
    return [{"prompt": chat, "image": Image.new("RGB", (30, 30), rgb), "answer": name} for name, rgb in COLOURS.items()]


def train(vlm_dir, tmp_path, _spy=None, **overrides):
    """(trainer, names of the parameters that moved); ``_spy``: a list that gets the keyword arguments of every
    ``model.generate`` call (the policy's generate wrapped on the instance)."""
    from grpokit.models.vision import load_processor

    values = dict(
        output_dir=str(tmp_path / "run"), num_generations=4, per_device_train_batch_size=8, max_completion_length=3,
        max_steps=2, learning_rate=1e-2, report_to="none", disable_tqdm=True, beta=0.04,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=str(vlm_dir),
        reward_funcs=colour_reward,
        args=GRPOConfig(**{**values, **overrides}),
        train_dataset=rows() * 2,
        processing_class=load_processor(str(vlm_dir)),
    )
    from transformers import AutoModelForImageTextToText

    before = dict(AutoModelForImageTextToText.from_pretrained(vlm_dir).named_parameters())
    if _spy is not None:
        real = trainer.model.generate

        def spy(**kwargs):
            _spy.append(kwargs)
            return real(**kwargs)

        trainer.model.generate = spy
    trainer.train()
    moved = set()
    for name, p in trainer.model.named_parameters():
        base = name.replace("base_model.model.", "").replace(".base_layer", "")
        if base not in before:  # a LoRA adapter: lora_B starts at zero
            moved |= {name} if "lora_B" in name and bool(p.detach().abs().sum() > 0) else set()
        elif not torch.equal(p.detach(), before[base].detach()):
            moved.add(name)
    return trainer, moved


def test_trainer_fine_tunes_every_parameter_of_a_vlm(vlm_dir, tmp_path):
    trainer, moved = train(vlm_dir, tmp_path)
    assert moved == {n for n, _ in trainer.model.named_parameters()}  # the vision tower and projector too
    assert (tmp_path / "run" / "final" / "preprocessor_config.json").is_file()  # final/ loads as a VLM folder


def test_freeze_vision_tower_and_projector(vlm_dir, tmp_path):
    trainer, moved = train(vlm_dir, tmp_path, freeze_vision_tower=True)
    names = {n for n, _ in trainer.model.named_parameters()}
    tower = {n for n in names if n.startswith("model.visual.") and not n.startswith("model.visual.merger.")}
    assert tower and moved == names - tower  # the merger (Qwen2-VL's projector) and the language model train
    trainer, moved = train(vlm_dir, tmp_path / "both", freeze_vision_tower=True, freeze_projector=True)
    assert moved == {n for n in names if not n.startswith("model.visual.")}


def test_lora_adapts_the_language_model_only(vlm_dir, tmp_path):
    trainer, moved = train(vlm_dir, tmp_path, **{"lora.r": 4})
    adapters = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n and ".language_model." in n for n in adapters)
    assert moved and moved <= adapters  # the base weights, the vision tower's included, stay as loaded


def test_cli_trains_a_vlm_from_a_yaml_config_with_image_files(vlm_dir, tmp_path):
    lines = []
    for name, rgb in COLOURS.items():
        Image.new("RGB", (20, 20), rgb).save(tmp_path / f"{name}.png")
        lines.append({"prompt": "colour ?", "images": [str(tmp_path / f"{name}.png")], "answer": name})
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines * 2))
    (tmp_path / "rewards.py").write_text(
        "def colour(prompts, completions, answer, images, **kw):\n"
        "    assert all(type(i[0]).__name__.endswith('ImageFile') or hasattr(i[0], 'getpixel') for i in images)\n"
        "    return [float(a in c.split()) for c, a in zip(completions, answer)]\n"
    )
    config = {
        "model": {"model_name_or_path": str(vlm_dir), "freeze_vision_tower": True},
        "data": {"train_dataset": str(tmp_path / "train.jsonl")},
        "algo": {"num_generations": 4},
        "generation": {"max_completion_length": 3},
        "optim": {"per_device_train_batch_size": 8, "max_steps": 2, "learning_rate": 1e-2},
        "run": {"output_dir": str(tmp_path / "run"), "report_to": ["jsonl"], "progress_bar": False},
        "rewards": [f"{tmp_path / 'rewards.py'}:colour"],
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "grpokit", "train", "config.yaml"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len([s for s in steps if "loss" in s or "train_loss" in s or "reward" in s]) >= 2, steps


def test_the_transformers_engine_trains_a_vlm_with_generate(vlm_dir, tmp_path):
    """generation.engine: transformers samples the image prompts with model.generate (TRL's batch: each prompt G
    times with its pixel inputs) and every parameter still moves."""
    calls = []
    trainer, moved = train(vlm_dir, tmp_path, _spy=calls, **{"generation.engine": "transformers"})
    assert len(calls) == 2  # one generate per step: 2 prompts x 4 generations, with every row's pixel inputs
    assert all(c["input_ids"].size(0) == 8 and c["image_grid_thw"].size(0) == 8 for c in calls)
    assert moved == {n for n, _ in trainer.model.named_parameters()}


def test_a_rollout_func_is_refused_with_images(vlm_dir, tmp_path):
    from grpokit.errors import ConfigError
    from grpokit.models.vision import load_processor

    args = GRPOConfig(output_dir=str(tmp_path / "run"), num_generations=4, per_device_train_batch_size=8, max_steps=1)
    with pytest.raises(ConfigError, match="a rollout_func samples outside grpokit and would not get the images"):
        GRPOTrainer(
            model=str(vlm_dir), reward_funcs=colour_reward, args=args, train_dataset=rows() * 2,
            processing_class=load_processor(str(vlm_dir)), rollout_func=lambda prompts, trainer: {},
        )  # fmt: skip


def test_vllm_is_refused_with_images():
    """A path that cannot be started here (vLLM is not installed): the check itself. torchrun, Ray workers and
    sampling ahead pass it (test_vision_torchrun.py, test_vision_ray.py and test_vision_ahead.py train with images)."""
    from types import SimpleNamespace

    from grpokit.compose.vision_paths import check_image_paths
    from grpokit.errors import ConfigError
    from grpokit.models.vision_inputs import VisionPrompt

    prompts = SimpleNamespace(ids=[VisionPrompt([1, 2], {}, {}, ["h"])])
    text = SimpleNamespace(ids=[[1, 2]])

    def args(backend="none", ahead=0):
        return SimpleNamespace(backend=backend, distributed=SimpleNamespace(staleness_bound=lambda: ahead))

    one = SimpleNamespace(world_size=1)
    cases = [
        (args(), "vllm", one, "generation.engine: vllm does not take images (vLLM: not passed to its multi_modal_data"),
    ]
    for a, engine, procs, reason in cases:
        with pytest.raises(ConfigError, match=reason.replace("(", r"\(").replace(")", r"\)")):
            check_image_paths(a, engine, prompts, procs, None, None)
        check_image_paths(a, engine, text, procs, None, None)  # text prompts: every path as before
    check_image_paths(args(), "hf", prompts, one, None, None)  # the supported paths: one process,
    check_image_paths(args(backend="ray"), "hf", prompts, one, None, None)  # Ray workers (test_vision_ray.py)
    two = SimpleNamespace(world_size=2)
    check_image_paths(args(ahead=1), "hf", prompts, two, None, None)
    mixed = SimpleNamespace(ids=[*prompts.ids, [3, 4]])  # DDP's gradient reduction failed on it (docs/vision.md)
    check_image_paths(args(), "hf", mixed, one, None, None)
    with pytest.raises(ConfigError, match=r"torchrun \(2 processes\) needs an image in every training prompt"):
        check_image_paths(args(), "hf", mixed, two, None, None)
