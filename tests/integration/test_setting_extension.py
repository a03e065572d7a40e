"""Adding a setting touches its part's file only: a throwaway optimizer key (``adam_amsgrad``, AdamW's amsgrad) is
added to the optimizer's settings class, and nothing else, in a copy of the package; it then reaches the optimizer from
YAML, from ``key=value`` and from TRL's ``GRPOConfig``, and the part's own check refuses a bad value. The generated
``typed_keys.py`` and docs/config.md are only for editors and readers (their tests would ask to regenerate them)."""

from __future__ import annotations

import pytest
from package_copy import assert_changes_are_the_pages

SETTINGS = "train/learning/optimizer_settings.py"
FIELD = '''    warmup_steps: int = 0
    """Warmup steps (overrides warmup_ratio when > 0)."""
    adam_amsgrad: bool = False
    """AdamW's amsgrad: the maximum of the second moments so far (a throwaway key of a test)."""
'''
CHECK = """        if self.adam_amsgrad and self.eight_bit:
            raise ConfigError("adam_amsgrad: true needs optimizer: adamw_torch_fused (the 8-bit AdamW has none).")
        for name, ok, rule in ("""
HYPER = "weight_decay=self.weight_decay, amsgrad=self.adam_amsgrad"

# Run in the copy: build a trainer each way and print the optimizer's amsgrad.
PROBE = """
import sys
from grpokit import GRPOConfig, GRPOTrainer
from grpokit.config import ConfigError, load_config

model, yaml_path = sys.argv[1], sys.argv[2]
assert sys.modules["grpokit"].__file__.startswith(sys.argv[4]), "not the copy"
data = [{"prompt": "w1 w2 w3"}] * 8
reward = lambda completions, **kw: [0.0] * len(completions)
common = dict(output_dir=sys.argv[3], num_generations=2, per_device_train_batch_size=4, max_steps=1,
              max_completion_length=2, save_strategy="no", progress_bar=False, report_to=[])
overrides = ["adam_amsgrad=true", *(f"{k}={v}" for k, v in common.items() if k != "report_to")]
for name, args in (
    ("yaml", load_config(yaml_path, {"output_dir": sys.argv[3]})),
    ("override", load_config(None, overrides)),
    ("trl", GRPOConfig(adam_amsgrad=True, **common)),
):
    trainer = GRPOTrainer(model, reward_funcs=reward, args=args, train_dataset=data)
    print(name, trainer.optimizer.defaults["amsgrad"])
try:
    GRPOConfig(adam_amsgrad=True, optimizer="adamw_8bit", **common)
except ConfigError as exc:
    print("refused", exc)
"""


@pytest.mark.usefixtures("one_thread")
def test_an_optimizer_key_needs_only_its_parts_file(package_copy, tiny_model_dir):
    package_copy.edit(
        SETTINGS,
        ('    warmup_steps: int = 0\n    """Warmup steps (overrides warmup_ratio when > 0)."""\n', FIELD),
        ("        for name, ok, rule in (", CHECK),
        ("weight_decay=self.weight_decay", HYPER),
    )
    assert_changes_are_the_pages(package_copy, "A setting", {SETTINGS})  # the one file

    root = package_copy.root
    config = root / "config.yaml"
    config.write_text(
        "optim:\n  adam_amsgrad: true\n  per_device_train_batch_size: 4\n  max_steps: 1\n"
        "algo:\n  num_generations: 2\ngeneration:\n  max_completion_length: 2\n"
        "run:\n  save_strategy: 'no'\n  progress_bar: false\n  report_to: []\n"
    )
    out = package_copy.python("-c", PROBE, tiny_model_dir, config, root / "run", package_copy.package)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert [line for line in lines if not line.startswith("refused")] == ["yaml True", "override True", "trl True"]
    assert "refused adam_amsgrad: true needs optimizer: adamw_torch_fused (the 8-bit AdamW has none)." in lines
