"""The pieces of vLLM's scale-out that need no vLLM: the meter of streamed weights (FSDP2 into a colocated engine),
a Ray vLLM worker's sync check against its own copy, and the settings refused with one line."""

from __future__ import annotations

import pytest
import torch

from grpokit.config import ConfigError, GRPOConfig
from grpokit.distributed.ray_vllm import sync_gap
from grpokit.rollout.types import Rollouts
from grpokit.rollout.vllm.colocate import StreamMeter


def test_stream_meter_counts_copies_alive_at_once_not_the_policys_own_tensors():
    own = torch.zeros(10)  # a parameter's own storage (DDP): sent as a view, never counted
    sizes = [4, 6, 2]  # float32 copies: 16, 24 and 8 bytes, each gathered when asked for

    def items():
        yield "own", own
        for i, n in enumerate(sizes):
            yield f"copy{i}", torch.ones(n)

    meter = StreamMeter(items(), {own.data_ptr()})
    held = []
    for name, tensor in meter:  # a consumer that lets each tensor go at once: at most one copy alive
        held.append(name)
        del tensor
    assert held == ["own", "copy0", "copy1", "copy2"]
    assert meter.total == 16 + 24 + 8
    assert meter.peak == 24  # the largest single copy, never two at once
    assert meter.live == 0  # all freed

    kept = []
    meter = StreamMeter(items(), {own.data_ptr()})
    for _, tensor in meter:  # a consumer that buffers everything (the whole model): the peak is the sum
        kept.append(tensor)
    assert meter.peak == 16 + 24 + 8


class Fixed(torch.nn.Module):
    """A 'model' whose next-token logits are fixed: log_softmax([0, ln 3]) = [ln 1/4, ln 3/4] at every position."""

    def forward(self, input_ids):
        n = input_ids.size(1)
        logits = torch.tensor([[0.0, torch.log(torch.tensor(3.0)).item()]]).repeat(n, 1)  # [n, 2]
        return type("Out", (), {"logits": logits[None]})


def test_sync_gap_by_hand():
    # two completions of one prompt [0]: tokens [1, 0] and [1] (padded); the copy gives log 3/4 to token 1 and
    # log 1/4 to token 0; the sampler reported log 3/4 + 0.01, log 1/4 and (second row) log 3/4 - 0.002
    q1, q0 = torch.log(torch.tensor(0.75)).item(), torch.log(torch.tensor(0.25)).item()
    rollouts = Rollouts(
        prompt_ids=[[0]],
        completion_ids=torch.tensor([[1, 0], [1, 0]]),
        completion_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        logprobs=torch.tensor([[q1 + 0.01, q0], [q1 - 0.002, 5.0]]),  # 5.0 sits on padding: not read
        finish_reasons=["length", "stop"],
        num_generations=2,
    )
    assert sync_gap(Fixed(), rollouts, temperature=1.0) == pytest.approx(0.01, abs=1e-6)
    # temperature 2: logits [0, ln 3] / 2 -> probabilities 1/(1+sqrt 3), sqrt 3/(1+sqrt 3); token 1: -0.3119...
    t2 = torch.log(torch.tensor(3.0**0.5 / (1 + 3.0**0.5))).item()
    rollouts.logprobs = torch.tensor([[t2, torch.log(torch.tensor(1 / (1 + 3.0**0.5))).item()], [t2, 0.0]])
    assert sync_gap(Fixed(), rollouts, temperature=2.0) == pytest.approx(0.0, abs=1e-6)


def test_tensor_parallel_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"vllm_tensor_parallel_size=2: .* set vllm_tensor_parallel_size: 1"):
        GRPOConfig(engine="vllm", vllm_tensor_parallel_size=2)
    assert GRPOConfig(use_vllm=True, vllm_mode="colocate", vllm_tensor_parallel_size=1).engine == "vllm"


def test_vllm_with_ray_and_staleness_is_a_valid_config():
    args = GRPOConfig(engine="vllm", backend="ray", max_staleness=2, off_policy_correction="decoupled_ppo")
    assert args.engine == "vllm" and args.max_staleness == 2


def test_sleep_mode_with_fsdp_is_refused_in_one_line():
    GRPOConfig(engine="vllm", strategy="fsdp")  # null: off under torchrun unless asked for (ColocatedVLLMEngine)
    GRPOConfig(engine="vllm", strategy="ddp", vllm_enable_sleep_mode=True)
    with pytest.raises(ConfigError, match="vllm_enable_sleep_mode: true with strategy: fsdp"):
        GRPOConfig(engine="vllm", strategy="fsdp", vllm_enable_sleep_mode=True)
