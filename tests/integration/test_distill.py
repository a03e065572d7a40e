"""On-policy distillation through the CLI on tiny models: a local teacher with a padded vocabulary, `rewards: []`
(distillation alone), the teacher's log-probs checked against a plain forward pass, a different tokenizer refused."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from shared_helpers import WORDS, tiny_run_config

from grpokit.cli import main
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def padded_teacher(path, model_dir, extra: int = 8, seed: int = 1):
    """A teacher with the student's tokenizer, far from the student (another seed, its LM head 10 x sharper), and 8
    padding rows past the tokenizer (their logits made the largest, so a teacher scored over them would be wrong)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model, _ = build_tiny_causal_lm(
        None, tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=seed, tie_word_embeddings=False
    )
    model.resize_token_embeddings(len(tokenizer) + extra, mean_resizing=False)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.mul_(10.0)
        head[len(tokenizer) :] = 5.0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


def config(tmp_path, model_dir, teacher: str, name: str, rewards=None, steps: int = 3, **algo) -> str:
    path = tiny_run_config(
        tmp_path,
        model_dir,
        max_steps=steps,
        name=name,
        algo={"beta": 0.0, "teacher_model_name_or_path": teacher, **algo},
        optim={"learning_rate": 1e-2},
    )
    if rewards is not None:
        values = yaml.safe_load(path.read_text())
        values["rewards"] = rewards
        path.write_text(yaml.safe_dump(values))
    return str(path)


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line]


def test_distillation_alone_lowers_the_reverse_kl(tmp_path, tiny_model_dir, capsys):
    padded_teacher(tmp_path / "teacher", tiny_model_dir)
    path = config(tmp_path, tiny_model_dir, str(tmp_path / "teacher"), "alone", rewards=[], steps=12)
    assert main(["train", path, "warn_tied_steps=2"]) == 0
    # every group ties on every step by design (teacher_only): the tie warning, due at step 2, does not come
    assert "got the same reward" not in capsys.readouterr().err
    steps = metrics(tmp_path / "alone")
    assert len(steps) == 12
    for m in steps:
        assert m["reward"] == 0.0  # teacher_only: every group ties, the reward advantage is 0
        assert m["distill/seconds"] > 0 and m["distill/teacher_logprob_mean"] < 0
    kl = [m["distill/reverse_kl"] for m in steps]
    # the student moves towards the teacher: the last 3 steps' KL well below the first 3 steps'
    assert sum(kl[-3:]) < 0.7 * sum(kl[:3]), kl


def test_teacher_logprobs_are_a_plain_forward_pass(tmp_path, tiny_model_dir):
    """The local teacher's log-probs of a rollout batch equal log_softmax over the shared ids of a full forward."""
    from transformers import AutoTokenizer

    from grpokit.rollout.types import Rollouts
    from grpokit.train.teacher.local import LocalTeacher

    model, tokenizer = padded_teacher(tmp_path / "teacher", tiny_model_dir)
    vocab = len(tokenizer)
    prompts = [tokenizer.encode("w1 w2 w3"), tokenizer.encode("w4 w5")]
    completions = torch.tensor([[7, 8, 9], [10, 2, 0], [11, 12, 0], [13, 14, 15]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1]]).float()
    rollouts = Rollouts(prompts, completions, mask, torch.zeros(completions.shape), ["stop"] * 4, 2)
    pad = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    got = LocalTeacher(model, vocab, 1.0, 3).logprobs(rollouts, pad)
    for row, group in enumerate([0, 0, 1, 1]):
        ids = torch.tensor([prompts[group] + completions[row].tolist()])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompts[group]) - 1 : -1, :vocab]
        want = torch.log_softmax(logits.float(), -1).gather(-1, completions[row, :, None]).squeeze(-1) * mask[row]
        torch.testing.assert_close(got[row], want, atol=1e-5, rtol=0)


def test_a_different_tokenizer_is_refused_in_one_line(tmp_path, tiny_model_dir, capsys):
    other = build_word_tokenizer([*reversed(WORDS), "user", "assistant", "system", ":"])
    build_tiny_causal_lm(tmp_path / "other", other, hidden_size=32, num_layers=1, num_heads=2)
    path = config(tmp_path, tiny_model_dir, str(tmp_path / "other"), "refused", steps=1)
    assert main(["train", path]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert any("its tokenizer differs from the student's" in line for line in err), err
