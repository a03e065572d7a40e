"""TRL's GRPOConfig keys in grpokit's GRPOConfig: the static key list matches the installed TRL, every
key is accepted, the keys grpokit implements map onto its fields, the others are named in one warning,
and a typo is still refused."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings

import pytest

from grpokit.config import ConfigError, GRPOConfig, load_config
from grpokit.config.trl_defaults import TRL_DEFAULTS, TRL_VERSION

trl = pytest.importorskip("trl", reason="comparing with TRL's GRPOConfig needs TRL: pip install 'grpokit[bench]'")


def trl_fields() -> dict:
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(trl.GRPOConfig)
    }


def test_static_key_list_is_trls():
    assert trl.__version__ == TRL_VERSION, "TRL was upgraded: regenerate TRL_DEFAULTS in grpokit/config/trl_defaults.py"
    fields = trl_fields()
    assert sorted(TRL_DEFAULTS) == sorted(fields)
    assert {k: v for k, v in fields.items() if TRL_DEFAULTS[k] != v} == {}


def test_grpokit_does_not_import_trl():
    code = (
        "import sys, grpokit.config, grpokit.trl.trainer; from grpokit import GRPOConfig; "
        "GRPOConfig(bf16=False); print('trl' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def quiet(**kwargs) -> GRPOConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning here fails the test
        return GRPOConfig(**kwargs)


def test_every_trl_default_is_accepted_without_a_warning():
    defaults = {
        k: v for k, v in trl_fields().items() if k != "vllm_importance_sampling_mode"
    }  # always named (see below)
    cfg = quiet(**defaults)
    assert cfg.max_steps == -1 and cfg.report_to == ["console", "jsonl"] and cfg.ref_model_sync_steps == 0
    assert cfg.beta == 0.0 and cfg.logging_steps == 10 and cfg.gradient_checkpointing is True
    for key, value in defaults.items():  # one at a time too: each default alone is a valid config
        quiet(**{key: value})


def test_unused_keys_are_named_in_one_warning_and_read_back():
    with pytest.warns(UserWarning) as record:
        cfg = GRPOConfig(
            push_to_hub=True,
            torch_compile=True,
            cast_lm_head_to_fp32=True,
            remove_unused_columns=False,
            vllm_importance_sampling_mode="sequence_mask",
        )
    messages = [str(w.message) for w in record if "TRL settings" in str(w.message)]
    assert len(messages) == 1
    for name in (
        "push_to_hub=True",
        "torch_compile=True",
        "cast_lm_head_to_fp32=True",
    ):
        assert name in messages[0]
    assert "vllm_importance_sampling_mode" not in messages[0]  # acted on (a grpokit field), not named
    assert cfg.vllm_importance_sampling_mode == "sequence_mask"
    assert "remove_unused_columns" not in messages[0]  # TRL's default: grpokit passes every column too
    assert cfg.push_to_hub is True and cfg.remove_unused_columns is False and cfg.per_device_eval_batch_size == 8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg.replace(max_steps=3)  # the same settings are not named again
    with pytest.warns(UserWarning, match=r"model_init_kwargs=\{'attn_implementation': 'eager'\}"):
        assert GRPOConfig(model_init_kwargs={"dtype": "float32", "attn_implementation": "eager"}).dtype == "float32"


def test_typos_are_still_refused_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown config key 'save_stratgy'\. Did you mean 'save_strategy'"):
        GRPOConfig(save_stratgy="no")
    with pytest.raises(ConfigError, match="Did you mean 'disable_tqdm'"):
        GRPOConfig(disable_tdqm=True)
    with pytest.raises(ConfigError, match="report_to contains 'tensorbord'"):
        GRPOConfig(report_to=["jsonl", "tensorbord"])


@pytest.mark.parametrize(
    "given, expected",
    [
        ("none", ["console", "jsonl"]),
        ("tensorboard", ["console", "jsonl", "tensorboard"]),
        (["wandb", "none"], ["console", "jsonl", "wandb"]),
        (["jsonl"], ["jsonl"]),  # grpokit's own list form is taken as written
        ([], []),
    ],
)
def test_report_to_forms(given, expected):
    assert quiet(report_to=given).report_to == expected


def test_report_to_all_and_unsupported_integrations():
    import importlib.util

    named = ("tensorboard", "wandb", "mlflow", "trackio")
    installed = [n for n in named if importlib.util.find_spec(n) is not None]
    assert quiet(report_to="all").report_to == ["console", "jsonl", *installed]
    with pytest.warns(UserWarning, match=r"report_to=\['comet_ml'\]"):
        assert GRPOConfig(report_to=["comet_ml", "tensorboard"]).report_to == ["console", "jsonl", "tensorboard"]
    # TRL's names of the sinks grpokit writes itself, MLflow and trackio among them (a list of them: as written)
    assert quiet(report_to="mlflow").report_to == ["console", "jsonl", "mlflow"]
    assert quiet(report_to=["trackio", "none"]).report_to == ["console", "jsonl", "trackio"]


@pytest.mark.parametrize(
    "given, field, value",
    [
        # TRL's bf16 / fp16: autocast over float32 weights (grpokit.machine.precision), not the weights' dtype
        ({"bf16": True}, "mixed_precision", "bf16"),
        ({"bf16": True}, "dtype", "auto"),
        ({"fp16": True}, "mixed_precision", "fp16"),
        ({"bf16": False}, "mixed_precision", "no"),
        ({"bf16": None}, "dtype", "auto"),
        ({"bf16": None}, "mixed_precision", "auto"),
        ({"use_cpu": True}, "device", "cpu"),
        ({"disable_tqdm": True}, "progress_bar", False),
        ({"shuffle_dataset": False}, "shuffle", False),
        ({"activation_checkpointing": True}, "gradient_checkpointing", True),
        ({"sync_ref_model": True}, "ref_model_sync_steps", 512),
        ({"sync_ref_model": True, "ref_model_sync_steps": 8}, "ref_model_sync_steps", 8),
        ({"ref_model_sync_steps": 8}, "ref_model_sync_steps", 8),  # grpokit's own key, without TRL's switch
        ({"vllm_importance_sampling_clip_max": 2.0}, "vllm_importance_sampling_cap", 2.0),
        ({"resume_from_checkpoint": True}, "resume_from", "latest"),
        ({"resume_from_checkpoint": "runs/x/checkpoints/step-4"}, "resume_from", "runs/x/checkpoints/step-4"),
        ({"scale_rewards": False}, "scale_rewards", "none"),
        ({"lr_scheduler_type": "constant_with_warmup"}, "lr_scheduler_type", "constant"),
        ({"warmup_steps": 0.1}, "warmup_ratio", 0.1),
        ({"max_steps": 20, "logging_steps": 0.25}, "logging_steps", 5),  # TRL: a fraction of max_steps
        ({"eval_strategy": "steps", "logging_steps": 3}, "eval_steps", 3),  # TRL: eval_steps defaults to logging_steps
        ({"eval_strategy": "no", "eval_steps": None}, "eval_steps", 0),
        ({"min_p": None, "output_dir": None}, "min_p", 0.0),  # TRL's None keeps grpokit's default
        ({"optim": "adamw_torch"}, "optimizer", "adamw_torch"),
        ({"optim": "adamw_bnb_8bit"}, "optimizer", "adamw_bnb_8bit"),
        ({"optim": "adamw_8bit"}, "optimizer", "adamw_8bit"),
        (
            {"model_init_kwargs": {"torch_dtype": "bfloat16"}, "bf16": False},
            "dtype",
            "bfloat16",
        ),  # the weights' dtype wins
        ({"model_init_kwargs": {"dtype": "float32", "trust_remote_code": True}}, "trust_remote_code", True),
        ({"steps_per_generation": 2, "gradient_accumulation_steps": 2}, "num_mini_batches", 1),
        ({"steps_per_generation": 6, "gradient_accumulation_steps": 2}, "num_mini_batches", 3),
        ({"steps_per_generation": 6, "gradient_accumulation_steps": 2}, "gradient_accumulation_steps", 2),
        (
            {"generation_batch_size": 16, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2},
            "num_mini_batches",
            1,
        ),
        (  # 32 completions per generation batch / 8 per micro-batch = 4 micro-batches = 2 optimizer steps of 2
            {"generation_batch_size": 32, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2},
            "num_mini_batches",
            2,
        ),
    ],
)
def test_trl_keys_map_onto_grpokit_fields(given, field, value):
    cfg = quiet(**given)
    assert getattr(cfg, field) == value
    for key, v in given.items():  # and read back as given
        assert getattr(cfg, key) == v or key in (
            "report_to",
            "logging_steps",
            "eval_steps",
            "min_p",
            "output_dir",
            "scale_rewards",
            "lr_scheduler_type",
            "warmup_steps",
            "optim",
        )  # cfg.optim is grpokit's section


def test_use_vllm_maps_to_the_vllm_engine_in_both_modes():
    colocated = quiet(use_vllm=True, vllm_mode="colocate")
    assert (colocated.engine, colocated.vllm_mode) == ("vllm", "colocate")
    server = quiet(use_vllm=True, vllm_mode="server", vllm_server_base_url="http://127.0.0.1:8123")
    assert (server.engine, server.vllm_mode, server.vllm_server_base_url) == ("vllm", "server", "http://127.0.0.1:8123")
    by_parts = quiet(use_vllm=True, vllm_mode="server", vllm_server_host="10.0.0.2", vllm_server_port=9000)
    assert (by_parts.vllm_server_host, by_parts.vllm_server_port, by_parts.vllm_server_timeout) == (
        "10.0.0.2",
        9000,
        240.0,
    )
    with pytest.raises(ConfigError, match="vllm_mode"):
        GRPOConfig(use_vllm=True, vllm_mode="remote")


def test_optimizers_grpokit_does_not_run_are_named():
    # torchao's 8-bit and 4-bit AdamW are other optimizers: named, not run as torch's AdamW in silence
    with pytest.warns(UserWarning, match="optim"):
        cfg = GRPOConfig(optim="adamw_torch_8bit")
    assert cfg.optimizer == "adamw_torch_fused"
    with pytest.raises(ConfigError, match="optim='adamw_8bit' sets optimizer='adamw_8bit'"):
        GRPOConfig(optim="adamw_8bit", optimizer="adamw_torch")


def test_conflicting_settings_are_refused():
    with pytest.raises(ConfigError, match="bf16=True sets mixed_precision='bf16', but mixed_precision='no' is given"):
        GRPOConfig(bf16=True, mixed_precision="no")
    with pytest.raises(ConfigError, match="choose one"):
        GRPOConfig(bf16=True, fp16=True)


def test_trl_step_counts_are_converted_to_generation_batches():
    """TRL counts optimizer steps; with steps_per_generation=4 (gradient_accumulation_steps=1) a grpokit step (one
    generation batch) takes 4 of them: max_steps 100 -> 25, save_steps 10 -> ceil(10 / 4) = 3, logging_steps
    5 -> 2, eval_steps 1 -> 1. Without steps_per_generation nothing is converted."""
    cfg = quiet(steps_per_generation=4, max_steps=100, save_steps=10, logging_steps=5, eval_steps=1)
    assert (cfg.num_mini_batches, cfg.max_steps, cfg.save_steps, cfg.logging_steps, cfg.eval_steps) == (4, 25, 3, 2, 1)
    # generation_batch_size=64 / (8 per micro-batch) = 8 micro-batches = 4 optimizer steps of 2: 40 -> 10
    cfg = quiet(generation_batch_size=64, per_device_train_batch_size=8, gradient_accumulation_steps=2, max_steps=40)
    assert (cfg.num_mini_batches, cfg.max_steps) == (4, 10)
    cfg = quiet(steps_per_generation=2, gradient_accumulation_steps=2, max_steps=7)  # 1 optimizer step per batch
    assert (cfg.num_mini_batches, cfg.max_steps) == (1, 7)
    assert quiet(max_steps=100, save_steps=10).max_steps == 100


def test_num_iterations_counts_in_trl_step_conversion():
    """TRL reuses a generation batch num_iterations times: steps_per_generation=2, num_iterations=2 is 2 x 2 = 4
    optimizer steps per generation batch, so TRL's max_steps=4 is one grpokit step (2 mini-batches, 2 passes),
    save_steps 6 -> ceil(6 / 4) = 2."""
    cfg = quiet(num_iterations=2, steps_per_generation=2, max_steps=4, save_steps=6)
    assert (cfg.max_steps, cfg.num_mini_batches, cfg.num_iterations, cfg.save_steps) == (1, 2, 2, 2)
    assert cfg.max_steps * cfg.optimizer_steps_per_step() == 4
    assert quiet(num_iterations=3, generation_batch_size=16, per_device_train_batch_size=8, max_steps=12).max_steps == 2
    with pytest.raises(ConfigError, match=r"steps_per_generation=2 with num_iterations=2 makes 4 optimizer steps"):
        GRPOConfig(num_iterations=2, steps_per_generation=2, max_steps=6)


def test_num_iterations_alone_counts_optimizer_steps_as_trl():
    """TRL's steps_per_generation defaults to gradient_accumulation_steps, so a generation batch is one optimizer
    step per pass, num_iterations passes: with num_iterations=2, TRL's max_steps=4 is 2 generation batches, save_steps
    3 -> ceil(3 / 2) = 2, eval_steps 5 -> 3, logging_steps 1 -> 1. gradient_accumulation_steps does not change it:
    num_iterations=3, gradient_accumulation_steps=2, max_steps=6 -> 6 / 3 = 2. num_iterations=1 converts nothing."""
    cfg = quiet(num_iterations=2, max_steps=4, save_steps=3, eval_strategy="steps", eval_steps=5, logging_steps=1)
    assert (cfg.max_steps, cfg.num_mini_batches, cfg.save_steps, cfg.eval_steps, cfg.logging_steps) == (2, 1, 2, 3, 1)
    assert cfg.max_steps * cfg.optimizer_steps_per_step() == 4  # TRL's 4 optimizer steps
    assert quiet(num_iterations=3, gradient_accumulation_steps=2, max_steps=6).max_steps == 2
    assert quiet(num_iterations=1, max_steps=5, save_steps=3).max_steps == 5
    assert quiet(num_iterations=2).max_steps == -1  # epochs: TRL's count already (each prompt once per epoch)
    with pytest.raises(ConfigError, match=r"max_steps=3 \(optimizer steps, as TRL counts them\) is not a whole"):
        GRPOConfig(num_iterations=2, max_steps=3)


def test_num_iterations_in_grpokit_forms_counts_generation_batches(tmp_path):
    """Only GRPOConfig's keyword arguments by TRL's names are TRL's form. A section, a YAML file, a command line, an
    alias (num_ppo_epochs), replace() and attributes keep grpokit's count: max_steps 4 stays 4 generation batches."""
    assert quiet(algo={"num_iterations": 2}, max_steps=4).max_steps == 4
    assert quiet(num_ppo_epochs=2, max_steps=4).max_steps == 4
    assert GRPOConfig.from_grpokit(num_iterations=2, max_steps=4).max_steps == 4
    assert load_config(None, ["num_iterations=2", "max_steps=4", "save_steps=3"]).max_steps == 4
    path = tmp_path / "grpokit.yaml"
    path.write_text("algo:\n  num_iterations: 2\noptim:\n  max_steps: 4\nrun:\n  save_steps: 3\n")
    assert (load_config(path).max_steps, load_config(path).save_steps) == (4, 3)
    cfg = quiet(num_iterations=2, max_steps=4)
    assert cfg.replace(max_steps=6).max_steps == 6  # the build's epoch count goes through replace, in batches
    cfg.max_steps = 8
    assert cfg.max_steps == 8


def test_a_saved_trl_config_reads_back_without_converting_again(tmp_path):
    """The run folder's config.yaml holds the converted counts (max_steps 2 generation batches for TRL's 4): read back
    (resume from the command line, grpokit eval / explain of the run), they are not halved again."""
    cfg = quiet(num_iterations=2, max_steps=4, save_steps=2, logging_steps=2)
    assert (cfg.max_steps, cfg.save_steps, cfg.logging_steps) == (2, 1, 1)
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    again = load_config(path, ["resume_from=latest"])
    assert (again.max_steps, again.save_steps, again.logging_steps, again.num_iterations) == (2, 1, 1, 2)
    assert again.replace(resume_from=None) == cfg


def test_repetition_penalty_and_generation_kwargs_are_acted_on():
    """Both are grpokit settings now: no warning, and the sampler's options follow them (generation_kwargs over the
    config's own keys, as TRL updates its generation kwargs with them)."""
    cfg = quiet(
        repetition_penalty=1.3,
        top_k=5,
        generation_kwargs={
            "top_k": 50,
            "suppress_tokens": [3, 4],
            "bad_words_ids": [[7], [8, 9]],
            "min_new_tokens": 2,
            "no_repeat_ngram_size": 3,
            "begin_suppress_tokens": [1],
            "do_sample": True,
            "use_cache": True,  # how transformers computes, not what is sampled
            "temperature": 1.0,  # agrees with temperature
            "num_beams": 1,
        },
    )
    assert "repetition_penalty" not in cfg.unused_trl_settings and "generation_kwargs" not in cfg.unused_trl_settings
    assert cfg.sampling_options() == {
        "top_p": 1.0,
        "top_k": 50,
        "min_p": 0.0,
        "repetition_penalty": 1.3,
        "no_repeat_ngram_size": 3,
        "min_new_tokens": 2,
        "suppress_tokens": (3, 4),
        "begin_suppress_tokens": (1,),
        "bad_words_ids": ((7,), (8, 9)),
        "greedy": False,
    }
    assert quiet(generation_kwargs={"do_sample": False}).sampling_options()["greedy"] is True
    assert load_config(None, ["repetition_penalty=1.1"]).repetition_penalty == 1.1


@pytest.mark.parametrize(
    "given, message",
    [
        (
            {"engine": "hf", "generation_kwargs": {"top_k": 50, "num_beams": 2, "length_penalty": -0.1}},
            r"generation_kwargs: 'length_penalty' cannot be honoured exactly by grpokit's sampler; remove it or set "
            r"generation.engine: transformers",
        ),
        (
            {"engine": "hf", "generation_kwargs": {"num_beams": 2}},
            r"num_beams=2 differs from what grpokit runs: .* set generation.engine: transformers",
        ),
        (
            {"generation_kwargs": {"temperature": 0.7}, "temperature": 1.0},
            r"generation_kwargs temperature=0.7 differs from what grpokit runs: set temperature=0.7 instead",
        ),
        (
            {"generation_kwargs": {"max_new_tokens": 9}, "max_completion_length": 8},
            r"set max_completion_length=9 instead",
        ),
        ({"engine": "hf", "generation_kwargs": {"typical_p": 0.9}}, r"'typical_p' cannot be honoured"),
        (
            {"engine": "vllm", "generation_kwargs": {"num_beams": 2}},
            r"num_beams=2 differs from what grpokit runs",
        ),
        ({"generation_kwargs": {"suppress_tokens": [-1]}}, r"suppress_tokens=\[-1\]: expected a list of token ids"),
        ({"generation_kwargs": {"bad_words_ids": [1, 2]}}, r"bad_words_ids=\[1, 2\]: expected a non-empty list of"),
        ({"generation_kwargs": {"top_p": 1.5}}, r"generation_kwargs top_p=1.5 is out of range"),
        ({"repetition_penalty": 0.0}, r"repetition_penalty=0.0 must be > 0"),
        ({"generation_kwargs": "top_k=5"}, r"generation_kwargs='top_k=5' has the wrong type: expected dict"),
    ],
)
def test_generation_kwargs_grpokit_cannot_honour_are_refused_by_name(given, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(**given)


def test_generation_kwargs_only_generate_honours_choose_the_transformers_engine():
    """A TRL script's beam search (TRL passes generation_kwargs to transformers' GenerationConfig) samples with
    transformers' generate when the config does not name an engine; grpokit's own keys stay SamplingParams fields."""
    cfg = quiet(generation_kwargs={"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1})
    assert cfg.engine == "transformers"
    options = cfg.sampling_options()
    assert options["top_k"] == 50 and options["transformers_kwargs"] == {"num_beams": 2, "length_penalty": -0.1}
    assert quiet(generation_kwargs={"top_k": 5, "num_beams": 1}).engine == "hf"  # grpokit's sampler honours these
    assert quiet(generation_kwargs={"typical_p": 0.9}).replace(seed=3).engine == "transformers"


def test_liger_kernel_refuses_a_lora_adapter_on_the_lm_head():
    """As TRL: use_liger_kernel computes the loss from lm_head.weight, so an adapter there would never train."""
    with pytest.raises(ValueError, match=r"lm_head"):
        quiet(use_liger_kernel=True, lora={"r": 8, "target_modules": ["q_proj", "lm_head"]})
    assert quiet(use_liger_kernel=True, lora={"r": 8, "target_modules": ["q_proj"]}).unused_trl_settings == {}
    assert quiet(lora={"r": 8, "target_modules": ["lm_head"]}).lora.r == 8  # without it the head's adapter trains


def test_accelerator_config_reads_back_as_an_object():
    """TRL's trainer.args.accelerator_config is transformers' AcceleratorConfig; dispatch_batches False (or unset)
    is what grpokit does anyway, so only other settings are named as not acted on."""
    cfg = quiet(accelerator_config={"dispatch_batches": False})
    assert cfg.accelerator_config.dispatch_batches is False and cfg.unused_trl_settings == {}
    assert quiet().accelerator_config.dispatch_batches is None
    with pytest.warns(UserWarning, match=r"accelerator_config=\{'split_batches': True\}"):
        assert GRPOConfig(accelerator_config={"split_batches": True}).accelerator_config.split_batches is True


def test_vllm_takes_the_generation_kwargs_it_has():
    """vLLM's SamplingParams has repetition_penalty and min_tokens with transformers' meaning, not the bans."""
    with pytest.raises(ConfigError, match=r"'suppress_tokens' cannot be honoured exactly by vLLM's sampler"):
        GRPOConfig(engine="vllm", generation_kwargs={"suppress_tokens": [1], "min_new_tokens": 2})
    options = GRPOConfig(engine="vllm", generation_kwargs={"min_new_tokens": 2}).sampling_options()
    assert options["min_new_tokens"] == 2


@pytest.mark.parametrize(
    "given, message",
    [
        (
            {"steps_per_generation": 4, "max_steps": 10},
            r"max_steps=10 \(optimizer steps, as TRL counts them\) is not a whole number of generation batches: "
            r"steps_per_generation=4 makes 4 optimizer steps per generation batch. Make max_steps a multiple of 4 "
            r"\(e.g. 8\)",
        ),
        (
            {"steps_per_generation": 3, "gradient_accumulation_steps": 2},
            r"steps_per_generation=3 makes 3 micro-batches per generation batch, not a multiple of "
            r"gradient_accumulation_steps \(2\)",
        ),
        (
            {"generation_batch_size": 12, "per_device_train_batch_size": 8},
            r"generation_batch_size=12 is not divisible by per_device_train_batch_size x processes \(8\)",
        ),
        ({"generation_batch_size": 16, "steps_per_generation": 2}, "cannot both be set"),
        ({"steps_per_generation": 0}, r"steps_per_generation=0 must be a positive integer"),
        ({"steps_per_generation": 4, "num_mini_batches": 3}, r"steps_per_generation=4 sets num_mini_batches=4, but"),
    ],
)
def test_impossible_generation_batches_are_refused(given, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(**given)


def test_setting_a_trl_key_after_construction_translates_it():
    cfg = quiet(max_steps=4)
    cfg.bf16 = True
    assert cfg.mixed_precision == "bf16" and cfg.dtype == "auto" and cfg.bf16 is True
    cfg.report_to = "none"
    assert cfg.report_to == ["console", "jsonl"]


def test_trl_keys_in_yaml_and_on_the_command_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text('bf16: false\nsave_strategy: "no"\nreport_to: none\n')
    cfg = load_config(path, ["--disable_tqdm", "--num_train_epochs=2", "max_steps=-1"])
    assert (
        cfg.mixed_precision,
        cfg.save_strategy,
        cfg.report_to,
        cfg.progress_bar,
        cfg.num_train_epochs,
        cfg.max_steps,
    ) == (
        "no",
        "no",
        ["console", "jsonl"],
        False,
        2.0,
        -1,
    )
    saved = tmp_path / "saved.yaml"
    saved.write_text(cfg.to_yaml())
    assert load_config(saved) == cfg  # the translated config round-trips as grpokit's own keys


def test_from_trl_doc_names_every_trl_key():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "from_trl.md").read_text()
    missing = [key for key in TRL_DEFAULTS if f"`{key}" not in doc]
    assert missing == [], "docs/from_trl.md does not say what grpokit does with these TRL keys"


def test_pass_at_k_follows_a_small_num_generations_eval():
    """TRL's num_generations_eval=1 (its test_train_with_num_generations_eval) with grpokit's default pass_at_k
    [1, 8]: the default becomes [1, n] rather than refusing k = 8 > n; a pass_at_k given is kept (and checked)."""
    assert quiet(num_generations_eval=1).pass_at_k == [1]
    assert quiet(num_generations_eval=4).pass_at_k == [1, 4]
    assert quiet(num_generations_eval=16).pass_at_k == [1, 8]
    with pytest.raises(ConfigError, match=r"pass_at_k contains 8: each k must be an integer in \[1, num_generations"):
        GRPOConfig(num_generations_eval=2, pass_at_k=[1, 8])


def test_num_train_epochs_without_max_steps_trains_epochs_as_trl():
    """TRL trains num_train_epochs passes when max_steps is unset (-1, its default and grpokit's); logging every 10
    steps, as TRL (its closing log entry then holds the steps no entry has logged yet)."""
    assert quiet(num_train_epochs=1).max_steps == -1
    assert quiet(num_train_epochs=1, max_steps=5).max_steps == 5
    assert (quiet().max_steps, quiet().num_train_epochs, quiet().logging_steps) == (-1, 3.0, 10)
