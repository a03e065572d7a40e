"""The teacher's settings (grpokit/train/teacher/settings.py) through GRPOConfig: defaults, TRL's names, one-line
refusals."""

import pytest

from grpokit.config import ConfigError, GRPOConfig


def test_defaults_mean_no_teacher():
    cfg = GRPOConfig()
    assert cfg.teacher_model_name_or_path is None and cfg.teacher_server_url is None
    assert cfg.distill_coef == 1.0 and cfg.teacher_temperature == 1.0
    assert not cfg.algo.distilling


def test_trl_server_name_is_accepted():
    cfg = GRPOConfig(teacher_model_server_url="http://127.0.0.1:8001", rewards=[])
    assert cfg.teacher_server_url == "http://127.0.0.1:8001" and cfg.algo.distilling
    cfg = GRPOConfig(algo={"teacher_model_name_or_path": "some/teacher", "distill_coef": 0.5})
    assert cfg.algo.teacher_model_name_or_path == "some/teacher" and cfg.distill_coef == 0.5


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"teacher_model_name_or_path": "a", "teacher_server_url": "http://x"}, "give the teacher one way"),
        ({"distill_coef": -1.0}, "distill_coef=-1.0 must be >= 0"),
        ({"distill_loss": "k3"}, "valid values are reverse_kl, forward_kl_topk, jsd"),
        ({"distill_loss": "jsd", "teacher_server_url": "http://x"}, "returns only the sampled token's log-prob"),
        ({"teacher_temperature": 0.0}, "teacher_temperature=0.0 must be > 0"),
        ({"teacher_dtype": "int8"}, "teacher_dtype='int8'"),
        ({"teacher_server_url": "127.0.0.1:8001"}, "must start with http://"),
        ({"teacher_server_url": "http://x", "importance_sampling_level": "sequence"}, "set importance_sampling_level"),
        ({"teacher_server_timeout": 0}, "teacher_server_timeout=0.0 must be > 0"),
    ],
)
def test_bad_settings_get_one_line(given, message):
    with pytest.raises(ConfigError, match=message) as info:
        GRPOConfig(**given)
    assert "\n" not in str(info.value)


def test_top_k_terms_are_accepted_with_a_local_teacher():
    cfg = GRPOConfig(teacher_model_name_or_path="some/teacher", distill_loss="forward_kl_topk", distill_topk=5)
    assert cfg.distill_loss == "forward_kl_topk" and cfg.distill_topk == 5


def test_empty_eval_rewards_are_refused_in_one_line():
    """eval_rewards: [] would score nothing (null means the training rewards)."""
    from grpokit.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"eval_rewards: \[\] scores nothing; list the rewards to evaluate with"):
        load_config(None, {"model_name_or_path": "m", "train_dataset": "builtin:arithmetic", "eval_rewards": []})


def test_the_teacher_servers_key_is_never_in_the_saved_config():
    """teacher_server_api_key is a secret as vllm_server_api_key: kept on the config, null in to_dict / YAML / repr."""
    args = GRPOConfig(teacher_server_url="http://127.0.0.1:8001", teacher_server_api_key="hush-teacher")
    assert args.teacher_server_api_key == "hush-teacher" and args.replace(max_steps=3).teacher_server_api_key
    assert args.to_dict()["algo"]["teacher_server_api_key"] is None
    assert "hush-teacher" not in args.to_yaml() + repr(args)
