"""serve-rewards' token comes from $GRPOKIT_REWARD_TOKEN or --token-file, never the command line: --token is refused
in one line naming both, a file is read (first line, whitespace stripped), and a file others can read is warned of."""

from __future__ import annotations

import pytest

from grpokit.cli import main
from grpokit.rewards.contract import RewardError
from grpokit.rewards.serve_token import served_token


def test_the_token_from_the_environment_or_a_file(tmp_path):
    assert served_token(None, {}) is None
    assert served_token(None, {"GRPOKIT_REWARD_TOKEN": " s3cret\n"}) == "s3cret"
    file = tmp_path / "token"
    file.write_text("s3cret \nsecond line ignored\n")
    file.chmod(0o600)
    assert served_token(str(file), {}) == "s3cret"


@pytest.mark.parametrize(
    ("content", "env", "message"),
    [
        ("", {}, "is empty: write the token on its first line"),
        ("x", {"GRPOKIT_REWARD_TOKEN": "y"}, "both $GRPOKIT_REWARD_TOKEN and --token-file give a token: keep one"),
        (None, {}, "cannot read --token-file"),
    ],
)
def test_a_bad_token_source_is_one_line(tmp_path, content, env, message):
    file = tmp_path / "token"
    if content is not None:
        file.write_text(content)
    with pytest.raises(RewardError, match="serve-rewards: .*" + message.replace("$", r"\$")):
        served_token(str(file), env)


def test_a_token_file_others_can_read_gets_one_warning(tmp_path, capsys):
    file = tmp_path / "token"
    file.write_text("s3cret\n")
    file.chmod(0o644)
    assert served_token(str(file), {}) == "s3cret"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "can be read by other users (mode 644); chmod 600" in err
    file.chmod(0o600)
    served_token(str(file), {})
    assert capsys.readouterr().err == ""


def test_token_on_the_command_line_is_refused_naming_the_env_var_and_the_file(capsys):
    assert main(["serve-rewards", "accuracy", "--host", "0.0.0.0", "--token", "s3cret"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("grpokit:") == 1, err
    assert "--token puts the token on the command line" in err
    assert "$GRPOKIT_REWARD_TOKEN" in err and "--token-file FILE" in err


def test_off_loopback_without_a_token_names_both_ways(capsys, monkeypatch):
    monkeypatch.delenv("GRPOKIT_REWARD_TOKEN", raising=False)
    assert main(["serve-rewards", "accuracy", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "set GRPOKIT_REWARD_TOKEN or pass --token-file FILE" in err
