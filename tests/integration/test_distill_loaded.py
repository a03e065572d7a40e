"""A teacher given to GRPOTrainer as ``teacher_model`` (TRL GKD's name): a loaded causal LM is used as it is (no
loading; its own device and dtype); a run with it equals the run with the same weights as teacher_model_name_or_path;
a module built in memory (no folder) trains too; a wrong type, a module that is not a causal LM, a tokenizer that
differs, an output layer narrower than the tokenizer and a second teacher are each refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from shared_helpers import WORDS
from test_distill import padded_teacher

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.config import ConfigError
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
COMPARED = ("loss", "distill/reverse_kl", "distill/teacher_logprob_mean", "grad_norm")


def trainer(model_dir, run, teacher_model=None, **algo) -> GRPOTrainer:
    args = GRPOConfig(
        output_dir=str(run), device="cpu", dtype="float32", max_steps=2, num_generations=4,
        per_device_train_batch_size=8, max_completion_length=4, learning_rate=1e-2, beta=0.0, seed=5,
        report_to=["jsonl"], save_steps=0, progress_bar=False, **algo,
    )  # fmt: skip
    rows = [{"prompt": " ".join(WORDS[i : i + 3])} for i in range(8)]
    return GRPOTrainer(str(model_dir), [], args=args, train_dataset=rows, teacher_model=teacher_model)


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_a_loaded_teacher_trains_as_the_same_teacher_from_its_folder(tmp_path, tiny_model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    from grpokit.models import loading

    padded_teacher(tmp_path / "teacher", tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "teacher", dtype=torch.float32)  # as a user loads it
    loads, load = [], loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: loads.append(a[0]) or load(*a, **k))
    from_folder = trainer(tiny_model_dir, tmp_path / "folder", teacher_model_name_or_path=str(tmp_path / "teacher"))
    assert loads == [str(tmp_path / "teacher")]  # the teacher loaded from its folder
    from_folder.train()
    loads.clear()
    given = trainer(tiny_model_dir, tmp_path / "loaded", teacher_model=model)
    assert loads == []  # the teacher module is used as given, not loaded
    assert given.run.distiller.teacher.model is model and not any(p.requires_grad for p in model.parameters())
    assert given.args.algo.teacher_model_name_or_path == str(tmp_path / "teacher")  # its name: the folder it came from
    given.train()
    a, b = metrics(tmp_path / "folder"), metrics(tmp_path / "loaded")
    assert len(a) == len(b) == 2 and all(m["distill/reverse_kl"] != 0 for m in b)
    for x, y in zip(a, b):
        for key in COMPARED:
            assert y[key] == pytest.approx(x[key], abs=1e-6), key


def test_a_teacher_built_in_memory_trains(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model, _ = build_tiny_causal_lm(None, tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=4)
    model.config._name_or_path = ""  # nothing to load it from: named by its class
    run = trainer(tiny_model_dir, tmp_path / "memory", teacher_model=model)
    assert run.args.algo.teacher_model_name_or_path == "<LlamaForCausalLM passed as teacher_model>"
    run.train()
    assert [m["step"] for m in metrics(tmp_path / "memory")] == [1, 2]


def one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text, text
    return text


def test_wrong_teachers_are_refused_in_one_line(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError) as refused:
        trainer(tiny_model_dir, tmp_path / "a", teacher_model=42)
    assert one_line(refused).startswith("teacher_model has type int; give a path, a hub id or a loaded causal LM")
    with pytest.raises(ConfigError) as refused:
        trainer(tiny_model_dir, tmp_path / "b", teacher_model=torch.nn.Linear(2, 2))
    assert one_line(refused).startswith("teacher_model is a Linear, not a causal LM (no output layer)")
    model, _ = padded_teacher(tmp_path / "teacher", tiny_model_dir)
    with pytest.raises(ConfigError) as refused:
        trainer(tiny_model_dir, tmp_path / "c", teacher_model=model, teacher_server_url="http://127.0.0.1:9")
    assert "teacher_model is given and the config has a teacher too" in one_line(refused)
    from transformers import AutoModelForCausalLM

    student = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(ConfigError) as refused:  # the student itself as its teacher
        GRPOTrainer(student, [], args=GRPOConfig(output_dir=str(tmp_path / "d"), device="cpu"), teacher_model=student,
                    train_dataset=[{"prompt": "w1 w2"}] * 4)  # fmt: skip
    assert "teacher_model shares its weights with the model being trained" in one_line(refused)


def test_a_loaded_teacher_with_another_tokenizer_is_refused(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    other = build_word_tokenizer([*reversed(WORDS), "user", "assistant", "system", ":"])
    model, _ = build_tiny_causal_lm(tmp_path / "other", other, hidden_size=32, num_layers=1, num_heads=2)
    model.config._name_or_path = str(tmp_path / "other")  # loaded from a folder: its tokenizer is checked
    with pytest.raises(ConfigError) as refused:
        trainer(tiny_model_dir, tmp_path / "a", teacher_model=model)
    assert "its tokenizer differs from the student's" in one_line(refused)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    narrow, _ = build_tiny_causal_lm(None, build_word_tokenizer(WORDS[:10]), hidden_size=32, num_layers=1, num_heads=2)
    narrow.config._name_or_path = ""  # no tokenizer to compare: its output layer is, and is too narrow
    with pytest.raises(ConfigError) as refused:
        trainer(tiny_model_dir, tmp_path / "b", teacher_model=narrow)
    assert f"fewer than the tokenizer's {len(tokenizer)} tokens" in one_line(refused)
