"""Ray rollout workers sample prompts with images: a tiny Qwen2-VL trained 2 steps with one rollout worker on a local
cluster with a small object store. The worker gets each prompt's token ids and pixel inputs (not its PIL images) and
sends back plain ids; the driver's prompts, images and all, go on to the learner and the store. Its rollouts equal,
completion for completion, what grpokit's own sampler samples in one process for the same prompts, seeds and weights
(``seed_per_group``), as tests/integration/test_distributed_ray.py checks for text."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest
import torch
from PIL import Image

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.store.images import png_bytes

ray = pytest.importorskip("ray", reason="Ray tests need the ray extra: pip install 'grpokit[ray]'")
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

COLOURS = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255)}
WORDS = [*COLOURS, "colour", "?"]
OBJECT_STORE = 100 * 2**20  # bytes: Ray's floor is 75 MiB; the run's objects (weights, prompts) are far below it


@pytest.fixture(scope="module", autouse=True)
def local_cluster():
    """One local cluster for the module, as tests/integration/test_ray.py starts it, with a small object store."""
    ray.init(num_cpus=2, object_store_memory=OBJECT_STORE, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    path = tmp_path_factory.mktemp("tiny-qwen2-vl")
    build_tiny_qwen2_vl(path, words=WORDS, image_side=28)
    return path


def colour_reward(prompts, completions, answer, image, **kwargs):
    """1 when the completion names the image's colour; the driver's PIL images reach the reward."""
    assert all(isinstance(i, Image.Image) for i in image)
    return [float(a in c[0]["content"].split()) for c, a in zip(completions, answer)]


def images():
    return {name: Image.new("RGB", (30, 30), rgb) for name, rgb in COLOURS.items()}


def train(vlm_dir, run, **overrides) -> GRPOTrainer:
    from grpokit.models.vision import load_processor

    chat = [{"role": "user", "content": "colour ?"}]
    rows = [{"prompt": chat, "image": image, "answer": name} for name, image in images().items()]
    args = GRPOConfig(
        output_dir=str(run), num_generations=4, per_device_train_batch_size=8, max_completion_length=3, max_steps=2,
        learning_rate=1e-2, beta=0.04, report_to=["jsonl"], disable_tqdm=True, save_steps=0, **overrides,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=str(vlm_dir), reward_funcs=colour_reward, args=args, train_dataset=rows * 2,
        processing_class=load_processor(str(vlm_dir)),
    )  # fmt: skip
    trainer.train()
    return trainer


def stored(run) -> dict:
    """(step, prompt index, completion index) -> (completion, the prompt's image hashes, the policy version)."""
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        columns = "step, prompt_index, completion_index, completion, images, policy_version"
        rows = db.execute(f"SELECT {columns} FROM rollouts")
        return {(s, p, c): (text, json.loads(hashes), version) for s, p, c, text, hashes, version in rows}


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_a_ray_worker_samples_prompts_with_images_as_one_process_does(vlm_dir, tmp_path):
    from transformers import AutoModelForImageTextToText

    before = dict(AutoModelForImageTextToText.from_pretrained(vlm_dir).named_parameters())
    remote = train(vlm_dir, tmp_path / "ray", backend="ray", num_rollout_workers=1, rollout_worker_cpus=1)
    moved = {n for n, p in remote.model.named_parameters() if not torch.equal(p.detach(), before[n].detach())}
    assert moved == set(before)  # every parameter trained on the worker's rollouts, the vision tower's too

    rows = stored(tmp_path / "ray")
    assert len(rows) == 2 * 8 and {k[0] for k in rows} == {1, 2}
    assert all(version == step - 1 for (step, _, _), (_, _, version) in rows.items())  # step 2: the published update
    hashes = {hashlib.sha256(png_bytes(image)).hexdigest() for image in images().values()}
    named = {h for _, prompt_hashes, _ in rows.values() for h in prompt_hashes}
    assert all(len(prompt_hashes) == 1 for _, prompt_hashes, _ in rows.values())
    assert named <= hashes and named  # each rollout names its prompt's image, kept in the run folder
    files = {p.stem: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "ray" / "images").glob("*.png")}
    assert set(files) == named and all(name == digest for name, digest in files.items())

    train(vlm_dir, tmp_path / "one", seed_per_group=True)  # one process, each group from the same seed
    assert stored(tmp_path / "one") == rows  # the same completions of the same prompts' images, and versions
    for here, there in zip(metrics(tmp_path / "one"), metrics(tmp_path / "ray"), strict=True):
        assert there["rollout_worker_restarts"] == 0 and "rollout_worker_restarts" not in here  # Ray's sampler: there
        assert here["reward"] == pytest.approx(there["reward"], abs=1e-6)
        assert here["loss"] == pytest.approx(there["loss"], abs=1e-5)
        assert here["kl"] == pytest.approx(there["kl"], abs=1e-5)
