"""get_reward and resolve_reward: built-ins by name, module and file functions, dict specs."""

import functools
import pickle
import textwrap

import pytest

from grpokit.rewards import BUILTINS, get_reward, resolve_reward
from grpokit.rewards.format import FormatReward
from grpokit.rewards.length import LengthReward

USER_MODULE = textwrap.dedent(
    """
    from dataclasses import dataclass

    @dataclass
    class Bonus:  # a dataclass needs its module in sys.modules while the file runs
        value: float = 1.0

    def exclaim(prompts, completions, scale=1.0, **columns):
        return [scale * c.count("!") for c in completions]

    NOT_A_FUNCTION = 3
    """
)


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_MODULE)
    return path


def test_get_reward_builds_each_builtin():
    assert isinstance(get_reward("format"), FormatReward)
    assert isinstance(get_reward("length", target_length=5), LengthReward)
    assert {"accuracy", "format", "length", "molecule", "reward_model"} <= set(BUILTINS)


def test_get_reward_unknown_name_suggests_and_lists():
    with pytest.raises(ValueError, match="did you mean 'accuracy'") as info:
        get_reward("acuracy")
    for name in BUILTINS:
        assert name in str(info.value)
    with pytest.raises(ValueError, match="Known: accuracy"):
        get_reward("zzzz")


def test_get_reward_bad_param_names_the_reward():
    with pytest.raises(ValueError, match=r"'format'.*colour"):
        get_reward("format", colour="red")


def test_resolve_callable():
    def shouty(prompts, completions, **columns):
        return [1.0] * len(completions)

    assert resolve_reward(shouty) == ("shouty", shouty, 1.0)
    name, fn, weight = resolve_reward({"name": shouty, "weight": -0.5})
    assert (name, fn, weight) == ("shouty", shouty, -0.5)


def test_resolve_builtin_string_and_dict():
    name, fn, weight = resolve_reward("format")
    assert (name, type(fn), weight) == ("format", FormatReward, 1.0)
    name, fn, weight = resolve_reward({"name": "length", "weight": 0.25, "target_length": 10})
    assert (name, weight) == ("length", 0.25)
    assert fn([""], ["x" * 5]) == [-0.5]  # params reached the constructor: |5 - 10| / 10


def test_resolve_module_function(tmp_path, monkeypatch):
    (tmp_path / "grpokit_test_user_rewards.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    name, fn, weight = resolve_reward("grpokit_test_user_rewards:exclaim")
    assert (name, weight) == ("exclaim", 1.0)
    assert fn(["", ""], ["hi!!", "no"]) == [2.0, 0.0]
    name, fn, weight = resolve_reward({"name": "grpokit_test_user_rewards:exclaim", "weight": 2.0, "scale": 0.5})
    assert isinstance(fn, functools.partial) and (name, weight) == ("exclaim", 2.0)
    assert fn([""], ["!!!!"]) == [2.0]  # 0.5 * 4


def test_resolve_file_function(user_file):
    name, fn, _ = resolve_reward(f"{user_file}:exclaim")
    assert name == "exclaim"
    assert fn([""], ["a!b!"]) == [2.0]
    _, scaled, _ = resolve_reward({"name": f"{user_file}:exclaim", "scale": 3.0})
    assert scaled([""], ["!"]) == [3.0]
    # Pickles by path, for worker processes, and loads the file again on the other side.
    clone = pickle.loads(pickle.dumps(fn))
    assert clone([""], ["!!!"]) == [3.0]


def test_resolve_relative_file_path(user_file, monkeypatch):
    monkeypatch.chdir(user_file.parent)
    assert resolve_reward("my_rewards.py:exclaim")[2] == 1.0
    assert resolve_reward("./my_rewards.py:exclaim")[1]([""], ["!"]) == [1.0]


def test_resolve_errors(user_file):
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        resolve_reward("no_such_module_xyz:fn")
    with pytest.raises(FileNotFoundError, match=r"missing\.py"):
        resolve_reward(f"{user_file.parent}/missing.py:fn")
    with pytest.raises(ValueError, match="did you mean 'exclaim'"):
        resolve_reward(f"{user_file}:exclain")
    with pytest.raises(TypeError, match="int, not a function"):
        resolve_reward(f"{user_file}:NOT_A_FUNCTION")
    with pytest.raises(ValueError, match="did you mean 'join'"):
        resolve_reward("os.path:jion")
    with pytest.raises(ValueError, match="module:function"):
        resolve_reward("os.path:")
    with pytest.raises(ValueError, match="'name'"):
        resolve_reward({"weight": 1.0})
    with pytest.raises(TypeError):
        resolve_reward(3)


@pytest.fixture(scope="module")
def reward_model_folder(tmp_path_factory):
    """A tiny sequence classifier with one output and its word tokenizer, saved to a folder named `judge-rm`."""
    from grpokit.testing import build_tiny_reward_model, build_word_tokenizer

    path = tmp_path_factory.mktemp("models") / "judge-rm"
    build_tiny_reward_model(path, build_word_tokenizer(["good", "bad", "answer"]))
    return path


def test_reward_kind_tells_the_strings_apart(reward_model_folder, user_file, tmp_path, monkeypatch):
    from grpokit.rewards.resolve import reward_kind

    monkeypatch.chdir(tmp_path)
    (tmp_path / "accuracy").mkdir()  # a folder named like a built-in does not shadow it: a bare name is a built-in
    (tmp_path / "my-rm").mkdir()  # an existing folder, even without a slash, is a model
    expected = {
        "accuracy": "builtin",
        "acuracy": "builtin",  # an unknown bare name: refused as a built-in, with a suggestion (never a Hub id)
        "my-rm": "model",
        str(reward_model_folder): "model",
        "owner/some-reward-model": "model",  # a Hub id
        "os.path:join": "function",
        f"{user_file}:exclaim": "function",
        "rewards.py": "function",  # a file without its function: refused naming the form
    }
    assert {spec: reward_kind(spec) for spec in expected} == expected


def test_a_reward_model_folder_loads_as_trl_loads_it(reward_model_folder):
    import torch

    _, model, weight = resolve_reward({"name": str(reward_model_folder), "weight": 0.5})
    assert isinstance(model, torch.nn.Module) and (model.config.num_labels, weight) == (1, 0.5)
    from grpokit.rewards import RewardRunner

    runner = RewardRunner([str(reward_model_folder)], isolate=False)
    assert runner.names == ["judge-rm"]  # TRL's name: the model id's last part
    tokenizer = runner.functions[0].processing_class  # loaded from the folder, as TRL does without one given
    result = runner.score(["good answer", "bad"], [" good", " bad answer"])
    inputs = tokenizer(
        text=["good answer good", "bad bad answer"],
        return_tensors="pt",
        padding=True,
        padding_side="right",
        add_special_tokens=False,
    )
    with torch.no_grad():
        expected = model(**inputs).logits[:, 0].double()  # TRL's reward: logits[:, 0] of prompt + completion
    torch.testing.assert_close(result.per_func[:, 0], expected, atol=1e-5, rtol=1e-5)


def test_reward_model_strings_that_do_not_load_say_what_was_read(reward_model_folder, tmp_path):
    with pytest.raises(ValueError, match=r"'owner/no-such-reward-model' names a reward model .* cannot be loaded"):
        resolve_reward("owner/no-such-reward-model")  # offline here: not in the cache
    with pytest.raises(ValueError, match="takes no parameters"):
        resolve_reward({"name": str(reward_model_folder), "label": 1})
    with pytest.raises(ValueError, match=r"expected 'module:function' or 'file\.py:function'"):
        resolve_reward(str(tmp_path / "rewards.py"))
