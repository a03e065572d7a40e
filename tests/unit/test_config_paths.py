"""Every path field expands ``~`` and environment variables the same way (system/paths.py's expand_path)."""

import pytest

from grpokit.config import PATH_FIELDS, GRPOConfig, load_config
from grpokit.models.loading import load_tokenizer, model_source
from grpokit.rewards.resolve import resolve_reward
from grpokit.system.paths import expand_path


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DATA", str(tmp_path / "data"))
    return tmp_path


def test_expand_path(home):
    assert expand_path("~/m") == f"{home}/home/m"
    assert expand_path("$DATA/train.jsonl") == f"{home}/data/train.jsonl"
    assert expand_path("${DATA}/x") == f"{home}/data/x"
    for unchanged in ("Qwen/Qwen2.5-0.5B", "builtin:arithmetic", "latest", "runs/a", "$UNSET_GRPOKIT_VAR/x"):
        assert expand_path(unchanged) == unchanged


def test_every_path_field_is_expanded(home):
    values = {
        "model_name_or_path": "~/model",
        "tokenizer_name_or_path": "$DATA/tok",
        "train_dataset": "~/train.jsonl",
        "eval_dataset": "${DATA}/eval.jsonl",
        "output_dir": "~/runs/a",
        "resume_from": "$DATA/checkpoints/step-2",
        "value_model_name_or_path": "~/critic",
    }
    assert set(values) == set(PATH_FIELDS)
    cfg = GRPOConfig(**values)
    assert cfg.model_name_or_path == f"{home}/home/model"
    assert cfg.tokenizer_name_or_path == f"{home}/data/tok"
    assert cfg.train_dataset == f"{home}/home/train.jsonl"
    assert cfg.eval_dataset == f"{home}/data/eval.jsonl"
    assert cfg.output_dir == f"{home}/home/runs/a"
    assert cfg.resume_from == f"{home}/data/checkpoints/step-2"
    assert cfg.value_model_name_or_path == f"{home}/home/critic"
    cfg.output_dir = "$DATA/b"  # assignment goes through the same check
    assert cfg.output_dir == f"{home}/data/b"
    assert GRPOConfig(resume_from="latest", model_name_or_path="Qwen/Qwen2.5-0.5B").resume_from == "latest"


def test_yaml_and_command_line_paths_are_expanded(home):
    config = home / "c.yaml"
    config.write_text(
        "model:\n  model_name_or_path: ~/m\n  tokenizer_name_or_path: ~/t\nrun:\n  output_dir: $DATA/out\n"
    )
    cfg = load_config(config, ["train_dataset=~/d.jsonl"])
    assert (cfg.model_name_or_path, cfg.tokenizer_name_or_path) == (f"{home}/home/m", f"{home}/home/t")
    assert (cfg.output_dir, cfg.train_dataset) == (f"{home}/data/out", f"{home}/home/d.jsonl")


def test_reward_files_are_expanded(home):
    for folder in ("home", "data"):
        (home / folder).mkdir()
        (home / folder / "r.py").write_text("def score(completions, **kw):\n    return [1.0] * len(completions)\n")
    for spec in ("~/r.py:score", "$DATA/r.py:score", {"name": "${DATA}/r.py:score", "weight": 2.0}):
        name, fn, _ = resolve_reward(spec)
        assert name == "score" and fn(completions=["a", "b"]) == [1.0, 1.0]


def test_model_and_tokenizer_given_directly_are_expanded(home, tiny_model_dir, monkeypatch):
    (home / "home").mkdir()
    (home / "home" / "tiny").symlink_to(tiny_model_dir)
    assert model_source("~/tiny") == f"{home}/home/tiny"
    monkeypatch.setenv("MODELS", str(home / "home"))
    assert load_tokenizer("$MODELS/tiny").eos_token_id is not None
    assert model_source("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # a hub id is left alone
