"""Ray rollout workers sampling prompts with images ahead (``max_staleness`` 1), two workers, the tiny Qwen2-VL on one
local cluster for the module: the run trains every parameter on rollouts one version behind, names its images; stopped
with a batch queued, it resumes to the straight run's rows, numbers and weights; and a worker killed in the middle of
its chunk is replaced, its chunk re-run, the run's rows equal to the unkilled run's."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from shared_helpers import logged_steps, signal_after_step

from grpokit import GRPOConfig, GRPOTrainer

ray = pytest.importorskip("ray", reason="Ray tests need the ray extra: pip install 'grpokit[ray]'")
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

COLOURS = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255)}
STEPS = 4
COMPARED = ("loss", "kl", "grad_norm", "reward", "policy_staleness")


class DiesOnce:
    """A forward pre-hook that kills the Ray worker process running the model (never the learner) once ``flag``
    exists; only the process that deletes the flag dies, so exactly one worker is lost (tests/integration/test_ray.py's
    DiesOnce, as a hook on the VLM)."""

    def __init__(self, flag: Path):
        self.flag, self.learner_pid = str(flag), os.getpid()

    def __call__(self, module, args):
        if os.getpid() != self.learner_pid and os.path.exists(self.flag):
            try:
                os.unlink(self.flag)
            except FileNotFoundError:
                return
            os._exit(1)


@pytest.fixture(scope="module", autouse=True)
def local_cluster():
    """One local cluster for the module (each start costs seconds on the shared CPU)."""
    from grpokit.distributed.ray_rollout import connect

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers unpickle DiesOnce by value
    connect(None, num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    path = tmp_path_factory.mktemp("tiny-qwen2-vl")
    build_tiny_qwen2_vl(path, words=[*COLOURS, "colour", "?"], image_side=28)
    return path


def colour_reward(completions, answer, image, **kwargs):
    assert all(isinstance(i, Image.Image) for i in image)  # the driver's PIL images, put back after the workers
    return [float(a in c[0]["content"].split()) for c, a in zip(completions, answer)]


def trainer(vlm_dir, run: Path, flag: Path | None = None, **overrides) -> GRPOTrainer:
    """Two workers of half a CPU, sampling one step ahead; ``flag``: the model carries :class:`DiesOnce`."""
    from transformers import AutoModelForImageTextToText

    from grpokit.models.vision import load_processor

    model = AutoModelForImageTextToText.from_pretrained(vlm_dir)
    if flag is not None:
        model.register_forward_pre_hook(DiesOnce(flag))
    chat = [{"role": "user", "content": "colour ?"}]
    rows = [{"prompt": chat, "image": Image.new("RGB", (30, 30), rgb), "answer": n} for n, rgb in COLOURS.items()]
    values = dict(
        output_dir=str(run), num_generations=4, per_device_train_batch_size=8, max_completion_length=3,
        max_steps=STEPS, learning_rate=1e-2, report_to=["jsonl"], disable_tqdm=True, beta=0.04, max_staleness=1,
        save_steps=0, lr_scheduler_type="constant", backend="ray", num_rollout_workers=2, rollout_worker_cpus=0.5,
    )  # fmt: skip
    return GRPOTrainer(
        model=model,
        reward_funcs=colour_reward,
        args=GRPOConfig(**{**values, **overrides}),
        train_dataset=rows * 2,
        processing_class=load_processor(str(vlm_dir)),
    )


def stored(run: Path) -> tuple[list[tuple], set[str]]:
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        rows = db.execute(
            "SELECT step, prompt_index, completion_index, completion, policy_version, advantage, images FROM rollouts "
            "ORDER BY step, prompt_index, completion_index"
        ).fetchall()
        images = {h for (h,) in db.execute("SELECT sha256 FROM images")}
    return rows, images


def assert_same_run(straight: Path, run: Path) -> None:
    assert stored(run) == stored(straight)
    for a, b in zip(logged_steps(straight), logged_steps(run), strict=True):
        for key in COMPARED:
            assert a.get(key) == pytest.approx(b.get(key), abs=1e-6), (a.get("step"), key)
    wa, wb = load_file(straight / "final" / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    assert set(wa) == set(wb)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def straight(vlm_dir, tmp_path_factory):
    """The straight run, unkilled and unstopped: (its folder, its trainer, the weights it started from)."""
    run = tmp_path_factory.mktemp("straight") / "run"
    t = trainer(vlm_dir, run)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    t.train()
    return run, t, before


def test_ray_workers_sample_prompts_with_images_one_step_ahead(straight):
    run, t, before = straight
    moved = {n for n, p in t.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved == set(before)  # the vision tower and projector too
    rows, images = stored(run)
    assert len(rows) == STEPS * 2 * 4
    # step 1 synchronously (version 0), step s > 1 sampled while step s - 1 trains: by version s - 2
    assert {(r[0], r[4]) for r in rows} == {(s, max(0, s - 2)) for s in range(1, STEPS + 1)}
    named = [json.loads(r[6]) for r in rows]
    assert all(len(n) == 1 for n in named) and {n[0] for n in named} == images and len(images) == 3
    steps = logged_steps(run)
    assert [m["policy_staleness"] for m in steps] == [0, 1, 1, 1]
    assert [m["rollout_worker_restarts"] for m in steps] == [0] * STEPS


def test_stopped_with_a_batch_queued_it_resumes_to_the_straight_run(vlm_dir, straight, tmp_path):
    run = tmp_path / "run"
    first = trainer(vlm_dir, run)
    signal_after_step(first, 2, signal.SIGTERM)
    first.train()
    assert first.interrupted_by == signal.SIGTERM and first.step == 2
    queue = torch.load(run / "checkpoints" / "step-2" / "states.pt", weights_only=True)["pending_rollouts"]["queue"]
    assert [(e["step"], e["rollouts"]["policy_version"]) for e in queue] == [(3, 1)]  # step 3, sampled by version 1
    assert {r[0] for r in stored(run)[0]} == {1, 2}  # step 3 is not in the store yet
    trainer(vlm_dir, run, resume_from="latest").train()
    assert_same_run(straight[0], run)


def test_a_worker_killed_mid_chunk_is_replaced_and_its_chunk_rerun(vlm_dir, straight, tmp_path):
    run, flag = tmp_path / "run", tmp_path / "kill-a-worker"
    t = trainer(vlm_dir, run, flag=flag)
    score_values, armed = t.rewards.score_values, []

    def score_then_arm(*args, **kwargs):
        if t.step == 1 and not armed:
            armed.append(True)
            flag.touch()  # the next forward of a worker (step 2's or 3's chunk) kills it, mid-chunk
        return score_values(*args, **kwargs)

    t.rewards.score_values = score_then_arm
    t.train()
    assert armed and not flag.exists()  # set, and a worker ran into it and died
    restarts = [m["rollout_worker_restarts"] for m in logged_steps(run)]
    assert restarts[0] == 0 and restarts[-1] == 1 and restarts == sorted(restarts), restarts  # each death once
    assert_same_run(straight[0], run)  # the re-run chunk: the same completions by the same version


class Exits:
    def exit(self):
        os._exit(1)


def test_a_dead_workers_error_names_it_and_not_its_replacement():
    """Sampling ahead, a dead worker's chunks of two steps both fail: only the error of the slot's current worker
    replaces it (died_here), so the replacement is not killed in turn (restarts count each death once)."""
    from ray.exceptions import RayActorError

    from grpokit.distributed.ray_rollout import died_here

    actor = ray.remote(num_cpus=0)(Exits)
    dead, replacement = actor.remote(), actor.remote()
    with pytest.raises(RayActorError) as caught:
        ray.get(dead.exit.remote())
    assert died_here(caught.value, dead) and not died_here(caught.value, replacement)
    assert died_here(RayActorError(), replacement)  # an error naming no actor: its slot's worker is replaced
    ray.kill(replacement)
