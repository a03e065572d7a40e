"""grpokit.memory (the estimate, grpokit/memory/estimate.py) and grpokit.compose.memory (its inputs from a config):
the estimate's parts by hand, and its exact parts against a real trainer's tensors."""

from __future__ import annotations

import functools
import sys

import pytest
import torch
from shared_helpers import tiny_args
from transformers import LlamaConfig

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.compose import memory
from grpokit.compose.memory import estimate_memory
from grpokit.kernels.cpu_precision import RunCompute
from grpokit.memory.estimate import adamw_bytes, nf4_bytes
from grpokit.memory.shape import build_meta_model

CPU = torch.device("cpu")

# A Llama with vocabulary 100, hidden 16, MLP 32, 2 layers, 2 heads (head_dim 8), 1 KV head, tied embeddings:
#   embedding 100 x 16 = 1600; per layer q 256 + k 128 + v 128 + o 256 + gate 512 + up 512 + down 512 = 2304 Linear
#   weights + 2 norms x 16 = 2336; 2 layers 4672; final norm 16: 6288 parameters, 4608 in untied Linears.


@pytest.fixture()
def config_dir(tmp_path):
    LlamaConfig(
        vocab_size=100,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    ).save_pretrained(tmp_path)
    return tmp_path


# the trainers whose tensors the estimate is checked against: one step of the tiny run, no checkpoint
one_step = functools.partial(tiny_args, max_steps=1, beta=0.04, save_steps=0)


def _cfg(path, **overrides) -> GRPOConfig:
    values = {
        "model_name_or_path": str(path),
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "max_completion_length": 6,
        "max_prompt_length": 10,
        "beta": 0.04,
    }
    return GRPOConfig(**(values | overrides))


def test_parts_by_hand_float32(config_dir):
    m = estimate_memory(_cfg(config_dir), build_meta_model(str(config_dir)), CPU)  # < 10M parameters: no autocast
    assert m.weights == 6288 * 4 == 25152
    assert m.reference == 25152  # a float32 copy
    assert m.gradients == 25152 and m.adamw == 2 * 25152
    # micro-batch of 8 rows x T = 6 and their 2 groups' prompts once: 8 * 6 + 2 * 10 = 68 tokens, context 10 + 6 = 16;
    # per token and layer, through the lean MLP (a Llama in float32), 39 * 16 + 6 * 32 + 4 * 2 heads * 16 = 624 + 192
    # + 128 = 944 B: 68 * 2 layers * 944 = 128384;
    # logits 8 * 6 * 100 * 4 B = 19200 kept; head chunks 2 x min(2**22, 4800) x 4 B = 38400
    assert m.micro_batch == 128384 + 19200 + 38400 == 185984
    # generation: 16 rows x 16 positions x 2 layers x (K, V) x 1 KV head x 8 x 4 B = 32768; fused-decoder copies of all
    # Linear weights, the tied head included: (4608 + 1600) x 4 B = 24832
    assert m.generation == 32768 + 24832 == 57600
    assert m.peak == 25152 + 25152 + 50304 + max(25152 + 185984, 57600) == 311744
    # LoRA on the MLP (all-linear, the default) keeps the module's MLP: 14 * 32 = 448 B per token and layer, 8 * 32 more
    with_lora = estimate_memory(_cfg(config_dir, lora={"r": 2}), build_meta_model(str(config_dir)), CPU)
    assert with_lora.parts["activations"] - m.parts["activations"] == 68 * 2 * 8 * 32
    attention_lora = _cfg(config_dir, lora={"r": 2, "target_modules": ["q_proj", "v_proj"]})
    assert estimate_memory(attention_lora, build_meta_model(str(config_dir)), CPU).parts["activations"] == 128384


def test_parts_by_hand_bf16_autocast(config_dir, monkeypatch):
    # what a >= 10M-parameter model gets on a CPU where bf16 measured faster
    monkeypatch.setattr(memory, "run_compute", lambda *a, **k: RunCompute(torch.bfloat16, torch.bfloat16))
    m = estimate_memory(_cfg(config_dir), build_meta_model(str(config_dir)), CPU)
    assert m.weights == 25152 and m.gradients == 25152  # float32 master weights
    assert m.reference == 4608 * 2 + (6288 - 4608) * 4 == 15936  # untied Linears stored in bf16, the rest float32
    # per token and layer 33 * 16 + 7 * 32 + 6 * 2 * 16 = 528 + 224 + 192 = 944 B, less the lean norms' 8 * 16 = 128
    # and the lean MLP's 2 * 16 + 4 * 32 = 160: 656 B, 68 * 2 * 656 = 89216; logits in bf16 8 * 6 * 100 * 2 = 9600;
    # head chunks 38400; casts of every trainable Linear weight: (4608 + 1600) * 2 = 12416
    assert m.micro_batch == 89216 + 9600 + 38400 + 12416
    # the KV cache stays float32 under autocast; the fused copies are bf16
    assert m.generation == 32768 + 6208 * 2
    ref_sync = estimate_memory(_cfg(config_dir, ref_model_sync_steps=10), build_meta_model(str(config_dir)), CPU)
    assert ref_sync.reference == 25152  # mixed with the policy: kept float32
    lora = estimate_memory(_cfg(config_dir, lora={"r": 2}), build_meta_model(str(config_dir)), CPU)
    # frozen Linear weights are cast too (saved for the input's gradient), plus the 1024 adapter weights (next test);
    # LoRA on the MLPs keeps the module's MLP: 944 - 128 = 816 B per token and layer, 68 * 2 * 816 = 110976
    assert lora.micro_batch == 110976 + 9600 + 38400 + (6208 + 1024) * 2
    # learning in float32, sampling in bf16 (measured apart): the float32 micro-batch, bf16 fused copies
    monkeypatch.setattr(memory, "run_compute", lambda *a, **k: RunCompute(None, torch.bfloat16))
    split = estimate_memory(_cfg(config_dir), build_meta_model(str(config_dir)), CPU)
    assert split.micro_batch == 185984 and split.reference == 25152  # as test_parts_by_hand_float32's
    assert split.generation == 32768 + 6208 * 2


def test_lora_and_checkpointing_by_hand(config_dir):
    lora = _cfg(config_dir, lora={"r": 2}, beta=0.04)
    model = build_meta_model(lora.model_name_or_path)
    m = estimate_memory(lora, model, CPU)
    assert m.parameters == 6288 and m.trainable == 1024
    assert not hasattr(model, "peft_config")  # counted on a copy: the caller's model is left alone
    # all-linear adapters, r x (in + out) each: q 2*32 + k 2*24 + v 2*24 + o 2*32 + gate 2*48 + up 2*48 + down 2*48 =
    # 512 per
    # layer, 1024 in all; the reference is the base with adapters off: no copy
    assert m.reference == 0 and m.gradients == 1024 * 4 and m.adamw == 2 * 1024 * 4
    assert m.weights == 25152
    ckpt = _cfg(config_dir, gradient_checkpointing=True)
    c = estimate_memory(ckpt, build_meta_model(ckpt.model_name_or_path), CPU)
    # full rows: 8 * 16 = 128 tokens; each layer's input (16 x 4 B per token and layer) plus one layer's activations
    # (39 * 16 + 14 * 32 = 1072 B; no attention probabilities: checkpointed layers run on SDPA)
    assert c.micro_batch == 128 * (2 * 16 * 4 + 1072) + 19200 + 38400


def test_qlora_weights_by_hand(config_dir, monkeypatch):
    # one NF4 weight of n values: n / 2 B of codes, an 8-bit absmax per 64 values, a float32 absmax per 256 blocks, and
    # per weight 256 + 16 float32 code-book entries and a float32 offset (1092 B). q_proj 16 x 16 = 256 values:
    # 128 + 4 + 4 + 1092 = 1228; k and v (8 x 16 = 128): 64 + 2 + 4 + 1092 = 1162; o 1228; gate, up, down (512):
    # 256 + 8 + 4 + 1092 = 1360.
    # Per layer 2 x 1228 + 2 x 1162 + 3 x 1360 = 8860, two layers 17720; the rest (embedding = tied head 1600, norms 80)
    # float32: 1680 x 4 = 6720.
    assert nf4_bytes(256) == 1228 and nf4_bytes(128) == 1162 and nf4_bytes(512) == 1360
    # a 4096 x 4096 weight: 8388608 + 262144 + 4 x 1024 + 1092 = 8655940 B, 4.127 bits per value
    assert nf4_bytes(4096 * 4096) == 8655940
    qlora = _cfg(config_dir, lora={"r": 2}, load_in_4bit=True)
    m = estimate_memory(qlora, build_meta_model(str(config_dir)), CPU)
    assert m.weights == 17720 + 6720 == 24440
    assert m.reference == 0 and m.gradients == 1024 * 4 and m.adamw == 2 * 1024 * 4  # float32 adapters, no copy
    assert m.generation == 32768  # the KV cache only: 4-bit layers decode through the HF forward, no fused copies
    monkeypatch.setattr(memory, "run_compute", lambda *a, **k: RunCompute(torch.bfloat16, torch.bfloat16))
    mixed = estimate_memory(qlora, build_meta_model(str(config_dir)), CPU)
    # bf16 casts saved for the backward: the tied head (1600) and the adapters (1024); 4-bit layers save 4-bit weights;
    # the module's MLP (4-bit), the lean norms: 816 B per token and layer (test_parts_by_hand_bf16_autocast)
    assert mixed.micro_batch == 110976 + 9600 + 38400 + (1600 + 1024) * 2


def test_qlora_weights_match_a_trainers_tensors(word_prompts, tmp_path):
    pytest.importorskip("bitsandbytes")
    from bitsandbytes.nn import Params4bit

    from grpokit.testing import build_tiny_causal_lm

    model_dir = tmp_path / "model"
    build_tiny_causal_lm(model_dir, hidden_size=64, num_layers=2, num_heads=2, tie_word_embeddings=False)
    args = one_step(tmp_path / "run", model_name_or_path=str(model_dir), lora={"r": 4}, load_in_4bit=True)
    estimate = estimate_memory(args, build_meta_model(str(model_dir)))
    reward = lambda prompts, completions, **k: [float(len(c)) for c in completions]
    trainer = GRPOTrainer(reward_funcs=reward, args=args, train_dataset=word_prompts)
    trainer.train()

    def nbytes(p):
        if not isinstance(p, Params4bit):
            return p.numel() * p.element_size()
        q = p.quant_state
        constants = (q.absmax, q.code, q.offset, q.state2.absmax, q.state2.code)
        return p.numel() * p.element_size() + sum(t.numel() * t.element_size() for t in constants)

    base = [p for n, p in trainer.model.named_parameters() if not p.requires_grad]
    assert sum(isinstance(p, Params4bit) for p in base) == 14
    assert estimate.weights == sum(map(nbytes, base))
    assert estimate.gradients == sum(map(nbytes, (p for p in trainer.model.parameters() if p.requires_grad)))


def trained_one_step(args: GRPOConfig, prompts: list[dict]) -> GRPOTrainer:
    """A trainer after its run of ``args`` (one step) on ``prompts``, rewarded by completion length."""
    trainer = GRPOTrainer(
        reward_funcs=lambda prompts, completions, **k: [float(len(c)) for c in completions],
        args=args,
        train_dataset=prompts,
    )
    trainer.train()
    return trainer


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_exact_parts_match_a_trainers_tensors(tiny_model_dir, word_prompts, tmp_path):
    # weights, reference, gradients and AdamW state are exactly what a trainer holds after a step
    args = one_step(
        tmp_path / "run", model_name_or_path=str(tiny_model_dir), gradient_accumulation_steps=1, max_prompt_length=8
    )
    estimate = estimate_memory(args, build_meta_model(args.model_name_or_path))
    trainer = trained_one_step(args, word_prompts)
    assert estimate.weights == nbytes(trainer.model.parameters())
    assert estimate.reference == nbytes(trainer.reference.model.parameters())
    assert estimate.gradients == nbytes(p for p in trainer.model.parameters() if p.requires_grad)
    state = trainer.optimizer.state.values()
    assert estimate.adamw == nbytes(t for s in state for k, t in s.items() if k in ("exp_avg", "exp_avg_sq"))


def test_8bit_adamw_and_bf16_reference_by_hand(config_dir):
    # parameters of 8192 and 4096 values get 8-bit moments and a float32 scale per 256 values, the 100-value one float32
    # moments: 2 x 100 x 4 + 2 x ((8192 + 4 x 32) + (4096 + 4 x 16)) = 800 + 24960 = 25760 (float32 AdamW: 99104)
    assert adamw_bytes([8192, 4096, 100], 4, eight_bit=True) == 25760
    assert adamw_bytes([8192, 4096, 100], 4, eight_bit=False) == 2 * 12388 * 4 == 99104
    model = build_meta_model(str(config_dir))
    m = estimate_memory(_cfg(config_dir, optimizer="adamw_8bit", ref_model_dtype="bfloat16"), model, CPU)
    assert m.adamw == 2 * 6288 * 4  # every parameter of this model is under 4096 values: float32 moments
    assert m.optimizer_step == 0  # no 8-bit parameter to dequantise
    assert m.reference == 6288 * 2  # all of the copy in bf16, the tied embedding and the norms too
    # the untied embedding and head, 100 x 48 = 4800 values each, are the largest 8-bit parameters; bitsandbytes' CPU
    # step holds 5 float32 copies of one at a time
    wide = LlamaConfig(vocab_size=100, hidden_size=48, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    wide.save_pretrained(config_dir / "wide")
    w = estimate_memory(
        _cfg(config_dir / "wide", optimizer="adamw_bnb_8bit"), build_meta_model(str(config_dir / "wide")), CPU
    )
    assert w.optimizer_step == 5 * 4 * 4800
    assert w.peak == w.weights + w.reference + w.adamw + max(
        w.gradients + max(w.micro_batch, w.optimizer_step), w.generation
    )


def test_8bit_adamw_and_bf16_reference_match_a_trainers_tensors(word_prompts, tmp_path):
    pytest.importorskip("bitsandbytes")
    from grpokit.testing import build_tiny_causal_lm

    model_dir = tmp_path / "model"
    build_tiny_causal_lm(model_dir, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    args = one_step(
        tmp_path / "run", model_name_or_path=str(model_dir), optimizer="adamw_8bit", ref_model_dtype="bfloat16"
    )
    estimate = estimate_memory(args, build_meta_model(args.model_name_or_path))
    trainer = trained_one_step(args, word_prompts)
    assert estimate.reference == nbytes(trainer.reference.model.parameters())
    state = trainer.optimizer.state.values()
    moments = ("state1", "state2", "absmax1", "absmax2")
    assert estimate.adamw == nbytes(t for s in state for k, t in s.items() if k in moments)
    assert any(s["state1"].dtype == torch.uint8 for s in state)


def test_memory_warning_names_the_need_and_the_fixes(config_dir, monkeypatch):
    cfg = _cfg(config_dir)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**40)
    assert memory.memory_warning(cfg, str(config_dir), CPU) is None
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**20)  # 1 MiB free
    warning = memory.memory_warning(cfg, str(config_dir), CPU, processes=2)
    # two CPU processes: 2 x (346560 B of tensors + 0.5 GiB of process) = 1.0 GiB
    assert "needs about 1.0 GiB of cpu memory" in warning and "0.0 GiB is free" in warning
    # nothing fits in 1 MiB: every setting is named with its need (of the micro-batches, the smallest)
    assert "None of these settings alone would fit" in warning
    assert "per_device_train_batch_size: 1 with gradient_accumulation_steps: 16" in warning
    assert "lora.r: 16" in warning and "gradient_checkpointing: true" in warning and "load_in_4bit: true" in warning
    assert "ref_model_dtype: bfloat16" in warning and "optimizer: adamw_8bit" in warning
    assert memory.memory_warning(cfg, str(config_dir / "missing"), CPU) is None  # no config: no estimate, no warning


def test_memory_warning_names_the_settings_that_fit(config_dir, monkeypatch):
    cfg = _cfg(config_dir)
    # per process: the tensors' peak + PROCESS_OVERHEAD (2**29). Float32 tensors' peaks, by hand:
    #   as configured: 311744 (test_parts_by_hand_float32)
    #   per_device_train_batch_size 4 (x 4 accumulation): 4 rows x 6 + 1 group x 10 = 34 tokens x 2 layers x 944 B
    #     = 64192, logits 4 * 6 * 100 * 4 = 9600, head chunks 2 x 2400 x 4 = 19200: micro-batch 92992;
    #     100608 (weights, reference, AdamW) + 25152 + 92992 = 218752
    #   gradient checkpointing: micro-batch 211200 (test_lora_and_checkpointing_by_hand; the lean MLP does not run
    #     under it): 100608 + 25152 + 211200 = 336960, more than as configured
    #   LoRA r 16: adapters 2 layers x 16 x (32 + 24 + 24 + 32 + 48 + 48 + 48) = 8192; weights 25152, no reference,
    #     AdamW 65536, gradients 32768 + micro-batch 220800 (LoRA on the MLP: the module's MLP, 1200 B per token
    #     and layer): 25152 + 65536 + 253568 = 344256
    #   reference in bf16: 311744 - 25152 + 6288 x 2 = 299168
    free = 2**29 + 305000
    monkeypatch.setattr(memory, "available_bytes", lambda device: free)
    warning = memory.memory_warning(cfg, str(config_dir), CPU)
    assert "These settings would fit" in warning
    fits = warning.split("These settings would fit")[1]
    assert "per_device_train_batch_size: 4 with gradient_accumulation_steps: 4" in fits  # the largest that fits
    assert "per_device_train_batch_size: 2" not in fits
    assert "gradient_checkpointing: true" not in fits.split("QLoRA")[0]
    assert "ref_model_dtype: bfloat16 (" in fits
    assert "lora.r" not in fits.split("QLoRA")[0]  # LoRA alone needs 344256 + 2**29 > free
    model = build_meta_model(str(config_dir))
    fitting, others = memory.fitting_settings(cfg, model, CPU, 2**29 + 344256)
    assert any(f.startswith("LoRA (lora.r: 16)") for f in fitting)  # exactly its need: fits
    fitting, others = memory.fitting_settings(cfg, model, CPU, free)
    # checkpointing and (Q)LoRA need more than the run as configured, and the 8-bit AdamW saves nothing on this
    # tiny model (parameters under 4096 values keep float32 moments)
    assert [o.split(" (")[0] for o in others] == [
        "gradient_checkpointing: true",
        "optimizer: adamw_8bit",
        "LoRA",
        "QLoRA",
    ]
    assert any(f.startswith("ref_model_dtype: bfloat16") for f in fitting)


def test_explain_says_whether_the_run_fits(config_dir, monkeypatch):
    import grpokit.commands.explanation as explain_module

    for module in (memory, explain_module):
        monkeypatch.setattr(module, "available_bytes", lambda device: 2**40)
    assert "fits here:                 yes" in explain_module.explain(_cfg(config_dir))
    for module in (memory, explain_module):
        monkeypatch.setattr(module, "available_bytes", lambda device: 2**20)
    text = explain_module.explain(_cfg(config_dir))
    assert "fits here:                 NO" in text and "warning: this run needs about 0.5 GiB" in text


def test_trainer_warns_before_loading_a_model_that_will_not_fit(tiny_model_dir, word_prompts, tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**20)
    args = GRPOConfig(
        model_name_or_path=str(tiny_model_dir),
        num_generations=4,
        per_device_train_batch_size=8,
        max_steps=1,
        output_dir=str(tmp_path / "run"),
        report_to=["jsonl"],
        progress_bar=False,
    )
    with pytest.warns(UserWarning, match="may run out of memory"):
        GRPOTrainer(
            reward_funcs=lambda prompts, completions, **k: [0.0] * len(completions),
            args=args,
            train_dataset=word_prompts,
        )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/meminfo (Linux)")
def test_available_bytes_reads_this_host():
    psutil = pytest.importorskip("psutil")
    # the same kernel figure (MemAvailable), read a moment apart
    assert memory.available_bytes(CPU) == pytest.approx(psutil.virtual_memory().available, rel=0.05)


def test_a_local_teacher_on_the_students_device_is_held_by_hand(config_dir):
    # a teacher Llama of vocabulary 100, hidden 32, MLP 64, 1 layer, 2 heads (head_dim 16), 1 KV head, tied embeddings:
    #   embedding 100 x 32 = 3200; q 32 x 32 = 1024, k 16 x 32 = 512, v 512, o 1024, gate, up, down 2048 each = 9216;
    #   2 norms x 32 = 64; final norm 32: 3200 + 9216 + 64 + 32 = 12512 parameters
    LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    ).save_pretrained(config_dir / "teacher")
    model = build_meta_model(str(config_dir))
    alone = estimate_memory(_cfg(config_dir), model, CPU)
    assert alone.teacher == 0
    taught = _cfg(config_dir, teacher_model_name_or_path=str(config_dir / "teacher"))
    m = estimate_memory(taught, model, CPU)  # teacher_dtype auto: float32 on a CPU, 12512 x 4 B
    assert m.teacher == 12512 * 4 == 50048 and m.peak == alone.peak + 50048
    in_bf16 = estimate_memory(taught.replace(teacher_dtype="bfloat16"), model, CPU)
    assert in_bf16.teacher == 12512 * 2 and in_bf16.weights == alone.weights  # the student's parts are unchanged
    # a teacher on a device of its own is not in this process's ledger
    assert memory.local_teacher_size(taught.replace(teacher_device="cpu"), torch.device("cuda")) == (0, 0)
    assert memory.local_teacher_size(taught.replace(teacher_device="cpu"), CPU) == (12512, 4)


def test_the_estimate_is_a_function_of_its_typed_inputs(config_dir):
    from dataclasses import replace

    from grpokit.memory.estimate import memory_estimate

    inputs = memory.memory_inputs(_cfg(config_dir), build_meta_model(str(config_dir)), CPU)
    assert inputs.shape.parameters == 6288 and inputs.shape.untied_linear == 4608 and inputs.weight_bytes == 4
    assert memory_estimate(inputs) == memory_estimate(inputs)  # the same inputs, the same estimate
    # a teacher of 1000 bf16 values adds 2000 B to the floor, and nothing else
    taught = memory_estimate(replace(inputs, teacher_parameters=1000, teacher_bytes=2))
    assert taught.teacher == 2000 and taught.peak == memory_estimate(inputs).peak + 2000


def test_explain_lists_a_local_teacher(config_dir):
    import grpokit.commands.explanation as explain_module

    plain = explain_module.explain(_cfg(config_dir))
    assert "teacher" not in plain.split("# derived sizes")[1].split("# compute precision")[0]
    text = explain_module.explain(_cfg(config_dir, teacher_model_name_or_path=str(config_dir)))  # itself: 6288 x 4 B
    assert "= weights + reference + teacher + AdamW" in text
    assert "\n  teacher (distillation): 0.0 MiB\n" in text  # 25152 B, printed in MiB to one decimal
