"""`grpokit doctor`: passes on a sound setup of the tiny model, and fails, naming the fix, on each broken one: a
reward that always returns 1, a reward column the data lacks, a chat template that is not prefix-preserving, and an
engine whose weights are not the learner's (a broken sync)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from grpokit.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

REWARDS = """
def text(c):  # a chat prompt's completion is [{"role": "assistant", "content": text}]
    return c if isinstance(c, str) else c[0]["content"]

def distinct_words(prompts, completions, **kwargs):
    return [float(len(set(text(c).split()))) for c in completions]

def always_one(prompts, completions, **kwargs):
    return [1.0] * len(completions)

def wants_answer(prompts, completions, answer, **kwargs):
    return [float(a in text(c)) for a, c in zip(answer, completions)]
"""


def write_config(tmp_path, model, reward="distinct_words", chat=False, **more):
    from shared_helpers import tiny_run_config, word_prompts

    (tmp_path / "rewards.py").write_text(REWARDS)
    return tiny_run_config(
        tmp_path,
        model,
        max_steps=10,
        rewards=[f"{tmp_path / 'rewards.py'}:{reward}"],
        prompts=word_prompts(12, 4, target=None, chat=chat),
        algo={"beta": 0.0},
        generation={"max_completion_length": 6},
        run={"report_to": [], "progress_bar": True},
        **more,
    )


def doctor(config, capsys, *extra):
    code = main(["doctor", str(config), *extra])
    out = capsys.readouterr().out
    return code, {line.split(":")[0].split("  ", 1)[1]: line for line in out.splitlines() if line[:4] in
                  ("PASS", "WARN", "FAIL", "SKIP")}, out  # fmt: skip


def test_passes_on_a_sound_setup(tmp_path, tiny_model_dir, capsys):
    code, lines, out = doctor(write_config(tmp_path, tiny_model_dir, chat=True), capsys)
    assert code == 0, out
    names = ("data", "prompt length", "eos and pad", "chat template", "template prefixes", "token round trip",
             "sampler-learner parity", "reward distinct_words", "reward spread", "memory", "time per step")  # fmt: skip
    for name in names:
        assert name in lines and not lines[name].startswith("FAIL"), (name, out)
    assert lines["data"].startswith("PASS  data: 12 train prompts")
    # the HF engine samples the learner's own weights: the gap is float rounding
    gap = float(lines["sampler-learner parity"].split("mean ")[1].split(",")[0])
    assert gap < 1e-4
    assert "doctor: no failure" in out and not (tmp_path / "run").exists()  # writes nothing


def test_a_reward_that_always_returns_1_fails(tmp_path, tiny_model_dir, capsys):
    code, lines, out = doctor(write_config(tmp_path, tiny_model_dir, reward="always_one"), capsys)
    assert code == 1
    assert lines["reward spread"].startswith("FAIL  reward spread: ")
    assert "4 of 4 groups have zero variance: every group's totals tie" in out
    assert "fix: a larger num_generations, a softer reward (partial credit), or a higher temperature" in out


def test_a_missing_column_fails(tmp_path, tiny_model_dir, capsys):
    code, _, out = doctor(write_config(tmp_path, tiny_model_dir, reward="wants_answer"), capsys)
    assert code == 1
    failed = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert failed == [
        "FAIL  inputs: reward 'wants_answer' needs the column 'answer', but train_dataset row 0 has none (its other "
        "columns: none); add the column 'answer' to the data, or configure the reward to read another column."
    ]


def test_a_template_that_is_not_prefix_preserving_fails(tmp_path, tiny_model_dir, capsys):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    # the last message is marked: rendering the first turns alone marks another message than the whole does
    template = ("{% for m in messages %}{% if loop.last %}last {% endif %}{{ m['role'] }} : {{ m['content'] }} "
                "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}")  # fmt: skip
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "chat_template.jinja").unlink(missing_ok=True)  # transformers prefers this file when present
    code, lines, out = doctor(write_config(tmp_path, model, chat=True), capsys)
    assert code == 1
    assert lines["template prefixes"].startswith("FAIL  template prefixes: the first 1 messages render to text")
    assert "fix: use a prefix-preserving chat template" in out


def test_an_engine_with_a_broken_sync_fails(tmp_path, tiny_model_dir):
    """The sampler's weights are not the learner's: the doctor's sample is drawn, then the learner's weights move,
    as when an engine missed a weight sync."""
    from grpokit.compose.run import build_run
    from grpokit.config import load_config
    from grpokit.doctor import samples

    run = build_run(load_config(write_config(tmp_path, tiny_model_dir)))
    try:
        sample = samples.sample_groups(run, 2)
        assert samples.parity_check(run, sample).status == "PASS"
        with torch.no_grad():
            for p in run.model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        check = samples.parity_check(run, sample)
    finally:
        run.rewards.close()
    assert check.status == "FAIL" and "check the weight sync" in check.fix
