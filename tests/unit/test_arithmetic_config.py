"""The demo's packaged GRPO config and examples/arithmetic/config.yaml stay in step."""

import os
from pathlib import Path

from grpokit.config import load_config
from grpokit.demo.run import CONFIG_PATH
from grpokit.demo.warmstart import VERSION

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "arithmetic" / "config.yaml"


def test_example_config_is_the_demo_config_plus_a_model():
    demo = load_config(CONFIG_PATH).to_dict()
    example = load_config(EXAMPLE).to_dict()
    # paths are expanded at load time (config.expand_path)
    assert example["model"]["model_name_or_path"] == os.path.expanduser(f"~/.cache/grpokit/demo-policy-v{VERSION}")
    for config in (demo, example):
        config["model"].pop("model_name_or_path")
        config["run"].pop("output_dir")
    assert example == demo


def test_demo_config_trains_on_the_builtin_task_and_evaluates_held_out():
    config = load_config(CONFIG_PATH)
    assert config.train_dataset == "builtin:arithmetic"
    assert config.eval_dataset == "builtin:arithmetic/eval"
    # pass@1 is measured at the training temperature with n >= 8 samples per question
    assert config.eval_temperature is None and config.num_generations_eval >= 8
    assert 1 in config.pass_at_k and config.eval_steps > 0
