"""LoRA (peft): only adapters train, the reference is the frozen base (adapters disabled, no copy),
the saved adapter and the merged weights reload to the trained policy (QLoRA: test_qlora.py)."""

from __future__ import annotations

import pytest
import torch
from shared_helpers import tiny_args

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.config import ConfigError
from grpokit.train.learning.policy_logprobs import batched_logprobs, build_batch

peft = pytest.importorskip("peft")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def target_reward(prompts, completions, target, **columns):
    return [c.split().count(t) / max(1, len(c.split())) for c, t in zip(completions, target)]


def lora_args(tmp_path, **overrides) -> GRPOConfig:
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    run = dict(
        max_completion_length=6, beta=0.1, learning_rate=5e-2, lr_scheduler_type="constant", seed=0, save_steps=0
    )
    return tiny_args(tmp_path / "run", **({"lora": lora} | run | overrides))


def logprobs_of(model, trainer, rollouts):
    batch = build_batch(model, rollouts, trainer.tokenizer.pad_token_id, trainer.device)
    return batched_logprobs(model.eval(), batch, trainer.args.temperature, 8)


def test_lora_trains_adapters_reference_is_base_and_saves(tmp_path, tiny_model_dir, word_prompts):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer = GRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=target_reward,
        args=lora_args(tmp_path, merge_on_save=True),
        train_dataset=word_prompts,
    )
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert trainer.reference.model is None  # no second copy of the weights
    trainer.train()

    lora_b = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert any(p.abs().max() > 0 for p in lora_b)  # B starts at zero; training moved it

    rollouts = trainer.engine.generate([trainer.train_source.ids[i] for i in range(4)], 4, trainer.sampling)
    batch = build_batch(trainer.model, rollouts, trainer.tokenizer.pad_token_id, trainer.device)
    reference = trainer.learner.reference_logprobs(batch)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    policy = logprobs_of(trainer.model, trainer, rollouts)
    torch.testing.assert_close(reference, logprobs_of(base, trainer, rollouts))
    assert (policy - reference).abs().max() > 1e-3  # the adapters do change the policy

    final = tmp_path / "run" / "final"
    assert (final / "adapter_config.json").is_file()
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), final)
    torch.testing.assert_close(logprobs_of(reloaded, trainer, rollouts), policy)
    merged = AutoModelForCausalLM.from_pretrained(final / "merged")
    torch.testing.assert_close(logprobs_of(merged, trainer, rollouts), policy, atol=1e-4, rtol=1e-4)

    # `grpokit eval RUN` evaluates the trained adapter (loaded onto its base), not fresh zero adapters on the base
    from grpokit.commands.eval import eval_inputs

    cfg, evaluated = eval_inputs(tmp_path / "run", [])
    assert cfg.model_name_or_path == str(final) and cfg.lora.r == 0
    torch.testing.assert_close(logprobs_of(evaluated, trainer, rollouts), policy, atol=1e-4, rtol=1e-4)
    evaluator = GRPOTrainer(
        model=evaluated,
        reward_funcs=target_reward,
        args=cfg.replace(output_dir=str(tmp_path / "eval")),
        train_dataset=word_prompts,
    )
    assert all(p.requires_grad for p in evaluator.model.parameters())  # a plain model: the trainer builds as usual


def test_lora_rejects_reference_resync_and_custom_modules(tmp_path, word_prompts):
    from grpokit.testing import TinyGPT, build_word_tokenizer

    with pytest.raises(ConfigError, match="ref_model_sync_steps"):
        lora_args(tmp_path, ref_model_sync_steps=5)
    tokenizer = build_word_tokenizer(["a", "b"])
    with pytest.raises(ConfigError, match="Hugging Face models"):
        GRPOTrainer(
            model=TinyGPT(len(tokenizer)),
            tokenizer=tokenizer,
            reward_funcs=target_reward,
            args=lora_args(tmp_path),
            train_dataset=word_prompts,
        )


def test_load_in_4bit_needs_lora_and_a_path(tmp_path, tiny_model_dir, word_prompts):
    with pytest.raises(ConfigError, match=r"lora\.r > 0"):
        GRPOConfig(load_in_4bit=True)
    from transformers import AutoModelForCausalLM

    with pytest.raises(ConfigError, match="path or hub id"):
        GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
            reward_funcs=target_reward,
            args=lora_args(tmp_path, load_in_4bit=True),
            train_dataset=word_prompts,
        )


def _default_target_adapters(model) -> set[str]:
    """The module kinds under trainable adapters (q_proj, v_proj ...)."""
    return {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in model.named_parameters() if p.requires_grad}


def test_peft_config_without_target_modules_trains_peft_defaults(tmp_path, tiny_model_dir, word_prompts):
    """A LoraConfig with target_modules None (peft picks per architecture: q_proj and v_proj on Llama) trains; it
    crashed GRPOTrainer(...) in the memory estimate's lean-MLP rule."""
    from peft import LoraConfig

    trainer = GRPOTrainer(
        str(tiny_model_dir),
        target_reward,
        args=lora_args(tmp_path, lora={"r": 0}, beta=0.0, max_steps=1),
        train_dataset=word_prompts,
        peft_config=LoraConfig(r=4, lora_alpha=8),
    )
    assert trainer.args.lora.target_modules is None
    assert _default_target_adapters(trainer.model) == {"q_proj", "v_proj"}
    trainer.train()
    assert trainer.state.global_step == 1
    assert (tmp_path / "run" / "final" / "adapter_config.json").exists()


def test_yaml_lora_target_modules_null_trains_peft_defaults(tmp_path, tiny_model_dir, word_prompts, capsys):
    import json

    from grpokit.cli import main

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in word_prompts))
    (tmp_path / "c.yaml").write_text(
        f"model: {{model_name_or_path: {tiny_model_dir}}}\ndata: {{train_dataset: {data}}}\n"
        f"rewards: ['{__file__.rsplit('/', 1)[0]}/rewards_for_tests.py:target_fraction']\n"
        "lora: {r: 4, alpha: 8, target_modules: null}\nnum_generations: 4\nmax_completion_length: 5\n"
        "per_device_train_batch_size: 8\nmax_steps: 1\nsave_steps: 0\nprogress_bar: false\nreport_to: [jsonl]\n"
    )
    code = main(["train", str(tmp_path / "c.yaml"), f"output_dir={tmp_path / 'run'}"])
    assert code == 0, capsys.readouterr().err
    adapter = json.loads((tmp_path / "run" / "final" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
