"""torchrun with Ray rollout workers on prompts with images, sampling ahead (``max_staleness`` 1): rank 0 drives two
workers for the global batch (its own prompts, pixel inputs and all) and scatters each rank's share; the two gloo ranks
train with DDP. Against one process with the same two Ray workers sampling ahead over the same prompts (each group
seeded on its own). The one-process sampler without Ray samples ahead on one stream a batch (``seed_per_group`` does not
reach it), so its rollouts are not these."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_distributed import read_metrics, torchrun
from test_vision_torchrun import stored, vlm_dir, write_config  # noqa: F401 (vlm_dir: a module fixture)

from grpokit.cli import main

ray = pytest.importorskip("ray", reason="Ray tests need the ray extra: pip install 'grpokit[ray]'")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

RAY = {"backend": "ray", "num_rollout_workers": 2, "rollout_worker_cpus": 0.5, "ray_num_cpus": 2}


def test_two_ranks_with_ray_workers_sampling_ahead_with_images_match_one_process(vlm_dir, tmp_path):  # noqa: F811
    one = write_config(tmp_path, vlm_dir, "one", per_device_train_batch_size=4, gradient_accumulation_steps=2)
    two = write_config(tmp_path, vlm_dir, "two", per_device_train_batch_size=4, gradient_accumulation_steps=1)
    for path in (one, two):
        config = yaml.safe_load(path.read_text())
        config["distributed"].update(RAY, max_staleness=1)
        path.write_text(yaml.safe_dump(config))
    torchrun(two)  # rank 0 starts its own local cluster and stops it
    try:
        assert main(["train", str(one)]) == 0  # starts a local cluster in this process
    finally:
        ray.shutdown()

    m1, m2 = read_metrics(tmp_path / "one"), [m for m in read_metrics(tmp_path / "two") if "loss" in m]
    assert [m["step"] for m in m2] == [1, 2, 3]
    assert [m["policy_staleness"] for m in m2] == [0, 1, 1]
    for a, b in zip(m1, m2, strict=True):
        assert b["rollout_worker_restarts"] == 0
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)  # identical rollouts
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["kl"] == pytest.approx(b["kl"], abs=1e-5)
    r1, r2 = stored(tmp_path / "one"), stored(tmp_path / "two")
    assert len(r2) == 3 * 8 and r1 == r2  # each completion once, naming its prompt's image
    assert all(len(json.loads(images)) == 1 for _, images in r2.values())
    # test_vision_torchrun.py's tolerance: Adam on the ~1e-7 rounding of the gradient reduction, 2 ranks against 2
    # micro-batches; every weight trained, the vision tower's too
    wa, wb = (load_file(tmp_path / run / "final" / "model.safetensors") for run in ("one", "two"))
    start = load_file(vlm_dir / "model.safetensors")
    assert set(wa) == set(wb) == set(start)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-4, rtol=0)
        assert not torch.equal(wb[name], start[name]), name
