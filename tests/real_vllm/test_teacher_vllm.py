"""A served teacher that is a real ``vllm serve`` (vLLM's CPU build), started by ``grpokit vllm-serve`` on a free
loopback port with its own key file: a tiny Llama with the student's tokenizer and other weights. A 2-step run with
``teacher_server_url`` (the student samples with grpokit's own sampler) gets, for every sampled token, the log-prob
the teacher model itself gives it in float32 (a plain transformers forward here, to GAP_FP32), stores those values,
logs the distill/* metrics; a resume from step 1 redoes step 2 with the stored teacher log-probs and no scoring
request; the same with max_staleness 1 (each batch's request sent from the producer's thread, one step ahead). A wrong
key is refused in one line naming teacher_server_api_key."""

from __future__ import annotations

import pytest
import torch
from real_vllm_helpers import GAP_FP32, TARGET_REWARD, WORDS, metrics, prompts
from test_server_vllm import Server

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.store import RolloutStore
from grpokit.train.teacher.served import ServedTeacher, TeacherServerError

DISTILL = ("distill/reverse_kl", "distill/teacher_logprob_mean", "distill/seconds")
COMPARED = ("loss", "reward", "distill/reverse_kl", "distill/teacher_logprob_mean")


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """The teacher: the student's shape and tokenizer (vllm_model_dir's), another seed."""
    from grpokit.testing import VLLM_HEAD_DIM, build_tiny_causal_lm, build_word_tokenizer

    path = tmp_path_factory.mktemp("teacher-hd32")
    build_tiny_causal_lm(
        path, build_word_tokenizer(WORDS), hidden_size=64, num_layers=2, num_heads=2, head_dim=VLLM_HEAD_DIM,
        max_positions=128, seed=7,
    )  # fmt: skip
    return path


@pytest.fixture(scope="module")
def teacher_server(teacher_dir, tmp_path_factory):
    """``grpokit vllm-serve TEACHER``: its key file in this module's own XDG_RUNTIME_DIR, no VLLM_API_KEY."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("runtime")))
        mp.delenv("VLLM_API_KEY", raising=False)
        server = Server(teacher_dir, tmp_path_factory.mktemp("teacher-server"))
        server.start()
        yield server
        server.kill()


def trainer(model_dir, run, url, **overrides) -> GRPOTrainer:
    values = dict(
        device="cpu", dtype="float32", num_generations=4, per_device_train_batch_size=8, max_steps=2,
        max_completion_length=8, learning_rate=1e-2, beta=0.0, temperature=1.0, progress_bar=False,
        report_to=["jsonl"], save_steps=1, lr_scheduler_type="constant", seed=3, teacher_server_url=url,
        teacher_server_timeout=120, output_dir=str(run),
    )  # fmt: skip
    args = GRPOConfig(**{**values, **overrides})
    return GRPOTrainer(str(model_dir), TARGET_REWARD, args=args, train_dataset=prompts())


@torch.no_grad()
def own_logprobs(model, rollouts) -> torch.Tensor:
    """[N, T]: the teacher model's float32 log-prob of each sampled token, one plain forward per sequence."""
    out = torch.zeros(rollouts.completion_ids.shape)
    for i, (n, g) in enumerate(zip(rollouts.completion_lengths.tolist(), rollouts.group_index.tolist())):
        prompt = list(rollouts.prompt_ids[g])
        ids = torch.tensor([prompt + rollouts.completion_ids[i, :n].tolist()])
        logp = model(ids).logits[0].float().log_softmax(-1)  # [L, V]
        out[i, :n] = logp[len(prompt) - 1 : -1].gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
    return out


def test_a_wrong_key_is_refused_in_one_line(teacher_server):
    with pytest.raises(TeacherServerError) as refused:
        ServedTeacher(teacher_server.url, 1.0, 60.0, api_key="not-its-key")
    text = str(refused.value)
    assert "\n" not in text and text.startswith(f"teacher server {teacher_server.url}: /v1/models answered HTTP 401")
    assert "the key sent (teacher_server_api_key) is not its key" in text and "set teacher_server_api_key" in text


@pytest.mark.parametrize("ahead", [0, 1], ids=["in-step", "one-step-ahead"])
def test_a_real_vllm_teacher_scores_as_the_model_itself_and_a_resume_replays_it(
    teacher_server, teacher_dir, vllm_model_dir, tmp_path, monkeypatch, ahead
):
    """``ahead`` 1: max_staleness 1, the teacher asked for each batch on the producer's thread."""
    from transformers import AutoModelForCausalLM

    from grpokit.train.teacher.distiller import Distiller

    scored, received, adjust, steps = ServedTeacher.logprobs, [], Distiller.adjust, []
    monkeypatch.setattr(Distiller, "adjust", lambda self, *a: steps.append(1) or adjust(self, *a))

    def recording(self, rollouts, pad_token_id):
        values = scored(self, rollouts, pad_token_id)
        received.append((rollouts, values.clone()))
        return values

    monkeypatch.setattr(ServedTeacher, "logprobs", recording)
    run = tmp_path / "run"
    first_run = trainer(vllm_model_dir, run, teacher_server.url, max_staleness=ahead)  # the key: its port's key file
    first_run.train()
    assert len(received) == 2  # one scoring request a step
    assert first_run.run.distiller.ahead_requests == 2 * ahead  # ahead: both sent from the producer's thread
    model = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    for rollouts, values in received:
        mask = rollouts.completion_mask.bool()
        own = own_logprobs(model, rollouts)
        gap = (values - own).abs()[mask].max().item()
        print(f"teacher log-probs, vLLM vs the model's float32 forward: max |gap| {gap:.2e} over {mask.sum()} tokens")
        assert gap <= GAP_FP32 and (values[mask] < 0).all() and (values[~mask] == 0).all()
    first = metrics(run)
    assert [m["step"] for m in first] == [1, 2]
    for line in first:
        assert all(key in line for key in DISTILL) and line["distill/reverse_kl"] != 0, line
    with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
        kept = store.teacher_logprobs()
    sent = sorted(v for _, values in received for v in values[values != 0].tolist())
    assert sorted(v for values in kept.values() for v in values) == pytest.approx(sent, abs=0)  # stored as received

    received.clear(), steps.clear()
    resumed = trainer(vllm_model_dir, run, teacher_server.url, max_staleness=ahead)
    resumed.train(resume_from_checkpoint=str(run / "checkpoints" / "step-1"))
    assert steps == [1] and received == []  # step 2 done again with the store's teacher log-probs, no request
    again = metrics(run)
    assert [m["step"] for m in again] == [1, 2]
    for key in COMPARED:
        assert again[1][key] == pytest.approx(first[1][key], abs=1e-6), key
