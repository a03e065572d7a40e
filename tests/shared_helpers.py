"""What tests share besides fixtures: the tiny vocabulary, the chat template, the reward file the runs score with,
and the one builder of a small run (``tiny_args`` from Python, ``tiny_run_config`` as YAML) with its one prompt set
(``word_prompts``): a test writes down only what differs from the tiny run (docs/testing.md).

A module with a name of its own (not ``conftest``), so that ``from shared_helpers import ...`` finds this file
whichever subset of the tree pytest collects (tests/real_vllm has a conftest.py of its own).
"""

from __future__ import annotations

import os

WORDS = [f"w{i}" for i in range(40)]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
REWARD_FILE = os.path.join(os.path.dirname(__file__), "integration", "rewards_for_tests.py")
TARGET_REWARD = f"{REWARD_FILE}:target_fraction"


def cli_env(*path, **extra: str) -> dict:
    """The environment of a ``grpokit`` subprocess: this process's, offline, no tokenizer threads; the folders
    ``path`` first on its PYTHONPATH; ``extra`` variables added."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **extra)
    if path:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, path), os.environ.get("PYTHONPATH", "")])
    return env


def grpokit_cli(*args, env: dict | None = None, cwd=None, timeout: float = 600):
    """``grpokit ARGS`` in a subprocess (``python -m grpokit.cli``, the installed command's path), in ``cwd``, with
    ``env`` (default :func:`cli_env`); stdout and stderr captured as text, the exit code left to the caller."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "grpokit.cli", *map(str, args)]
    return subprocess.run(
        command, env=env or cli_env(), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def word_prompts(count: int = 30, length: int = 5, target: str | None = "w7", chat: bool = False) -> list[dict]:
    """The prompt set the tiny runs train on: ``count`` prompts of ``length`` consecutive words (w0 w1 w2 ..., then
    w1 w2 w3 ...), each with a ``target`` column naming the word the target reward asks for (none if ``None``);
    ``chat``: each prompt a conversation of one user message."""
    texts = [" ".join(WORDS[i : i + length]) for i in range(count)]
    rows = [{"prompt": [{"role": "user", "content": t}] if chat else t} for t in texts]
    return rows if target is None else [{**row, "target": target} for row in rows]


PROMPTS = word_prompts()


# The keys a TRL script writes for a small run, for the modules that train as one does: TRL's progress and report
# keys, a log line a step, a learning rate the tiny model moves with.
TRL_STYLE = dict(learning_rate=1e-3, disable_tqdm=True, report_to="none", logging_steps=1)


# Two Ray rollout workers of half a CPU each: what the Ray tests run on a small machine.
RAY_WORKERS = dict(backend="ray", num_rollout_workers=2, rollout_worker_cpus=0.5)


def signal_after_step(trainer, step: int, signum: int) -> None:
    """Makes ``trainer`` send its own process ``signum`` as soon as step ``step`` is done: the trainer's handler
    (SIGINT, SIGTERM) turns it into a stop after that step, with a checkpoint. Counts steps, never times them."""
    after_step = trainer.loop._after_step

    def stop_after(step_metrics):
        after_step(step_metrics)
        if trainer.step == step:
            os.kill(os.getpid(), signum)

    trainer.loop._after_step = stop_after


def tiny_args(run=None, *, num_generations: int = 4, prompts_per_step: int = 2, **overrides):
    """The :class:`grpokit.GRPOConfig` of the tiny run most Python-API tests train: ``num_generations`` completions
    for each of ``prompts_per_step`` prompts a step (the batch: their product), 2 steps of completions of at most 4
    tokens, the run folder ``run`` (none if ``None``) with metrics.jsonl only and no progress bar. ``overrides``
    change or add any key; a module's own defaults: ``config = functools.partial(tiny_args, learning_rate=1e-2)`` (a
    call's keys still win). TRL's ``disable_tqdm`` in ``overrides`` replaces the ``progress_bar`` default (the config
    refuses both)."""
    from grpokit import GRPOConfig

    values = dict(
        num_generations=num_generations,
        per_device_train_batch_size=num_generations * prompts_per_step,
        max_steps=2,
        max_completion_length=4,
        progress_bar=False,
        report_to=["jsonl"],
    )
    if "disable_tqdm" in overrides:
        del values["progress_bar"]
    if run is not None:
        values["output_dir"] = str(run)
    return GRPOConfig(**(values | overrides))


def loss_spec(**overrides):
    """A :class:`grpokit.algos.losses.LossSpec` for tests of the loss functions: dapo, clip 0.2, no KL, vLLM's
    truncated weights capped at 3 (TRL's), nothing else on; ``overrides`` change any field. The run's own LossSpec is
    derived from the config (``GRPOConfig.loss_spec``), whose defaults differ (beta 0.04)."""
    from grpokit.algos.losses import LossSpec

    base = dict(
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=None,
        beta=0.0,
        use_bias_correction_kl=False,
        importance_sampling_level="token",
        max_completion_length=None,
        sampling_cap=3.0,
        sampling_is_mode="token_truncate",
        sampling_is_min=None,
        delta=None,
        off_policy_mask_threshold=None,
    )
    return LossSpec(**{**base, **overrides})


def sampling_params(max_completion_length: int, temperature: float = 1.0, **overrides):
    """A :class:`grpokit.rollout.types.SamplingParams` for tests that sample: plain sampling at ``temperature``
    (``SamplingParams.plain``) with ``overrides`` (a filter, greedy, a logits rule)."""
    import dataclasses

    from grpokit.rollout.types import SamplingParams

    return dataclasses.replace(SamplingParams.plain(max_completion_length, temperature), **overrides)


def sampled_batch(n: int, max_completion_length: int, seed: int = 0, num_layers: int = 1):
    """What the learner tests update on: a tiny Llama (hidden 32, 2 heads, ``num_layers``, 30 words), ``n``
    completions of each of the prompts [5, 6, 7] and [8, 9] sampled on the CPU (HFRolloutEngine, ``seed``), and their
    learner batch. Returns (model, rollouts, batch)."""
    import torch

    from grpokit.rollout.engine import HFRolloutEngine
    from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer
    from grpokit.train.learning.policy_logprobs import build_batch

    cpu = torch.device("cpu")
    tokenizer = build_word_tokenizer(WORDS[:30])
    model, _ = build_tiny_causal_lm(tokenizer=tokenizer, hidden_size=32, num_layers=num_layers, num_heads=2)
    engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, cpu, seed=seed)
    rollouts = engine.generate([[5, 6, 7], [8, 9]], n, sampling_params(max_completion_length))
    return model, rollouts, build_batch(model, rollouts, tokenizer.pad_token_id, cpu)


def save_tiny_moe(path, tokenizer, router_aux_loss_coef: float, seed: int = 0, **config):
    """A random-init (``seed``) tiny Qwen3-MoE (2 layers, hidden 32, 4 experts, 2 a token, head_dim 16, tied
    embeddings) and ``tokenizer`` saved to ``path``, with the router's load-balancing coefficient and ``config``'s
    other fields; returns ``path``."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    layers = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2, tie_word_embeddings=True)
    attention = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    experts = dict(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2)
    ids = dict(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    moe = Qwen3MoeConfig(**layers, **attention, **experts, **ids, router_aux_loss_coef=router_aux_loss_coef, **config)
    Qwen3MoeForCausalLM(moe).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_run_config(
    tmp_path,
    model_dir,
    *,
    max_steps: int,
    num_generations: int = 4,
    prompts_per_step: int = 2,
    rewards: list | None = None,
    name: str = "run",
    prompts: list[dict] | None = None,
    **sections,
):
    """The tiny YAML run most CLI tests train: the tiny model, 20 prompts of four words (``target``: w7, in
    tmp_path/train.jsonl), ``num_generations`` x ``prompts_per_step`` completions of 4 tokens a step, lr 1e-3, beta
    0.04, the run folder tmp_path/``name`` with metrics.jsonl only and no progress bar, ``rewards`` (default the
    target reward). ``prompts``: other rows for train.jsonl. ``sections``: ``{section: {key: value}}`` merged into
    the sections (``run={"save_steps": 1}``). Writes tmp_path/``name``.yaml and returns its path."""
    import json

    import yaml

    data = tmp_path / "train.jsonl"
    rows = word_prompts(20, 4) if prompts is None else prompts
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {
        "model": {"model_name_or_path": str(model_dir)},
        "data": {"train_dataset": str(data)},
        "algo": {"num_generations": num_generations, "beta": 0.04},
        "generation": {"max_completion_length": 4},
        "optim": {
            "learning_rate": 1e-3,
            "per_device_train_batch_size": num_generations * prompts_per_step,
            "max_steps": max_steps,
        },
        "run": {"output_dir": str(tmp_path / name), "progress_bar": False, "report_to": ["jsonl"]},
        "rewards": rewards or [TARGET_REWARD],
    }
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def logged_steps(run) -> list[dict]:
    """metrics.jsonl's step lines; a last line torn by a kill is not one."""
    import contextlib
    import json

    path = run / "metrics.jsonl"
    found = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            entry = json.loads(line)
            if "loss" in entry:
                found.append(entry)
    return found


def stored(run) -> list[tuple]:
    """A run's stored rollouts, in order, as the kill-and-resume tests compare them."""
    import sqlite3

    with sqlite3.connect(run / "rollouts.sqlite") as db:
        return db.execute(
            "SELECT step, prompt_index, completion_index, completion, policy_version, token_versions, advantage "
            "FROM rollouts "
            "ORDER BY step, prompt_index, completion_index"
        ).fetchall()


def kill_storm(command: list[str], run, env: dict, logs, kills: int, seed: int, start_timeout: float) -> list[str]:
    """Start ``command`` (a resuming train of ``run``) ``kills`` times, each killed with SIGKILL a random 0-1 s after
    the next step is logged (or after ``start_timeout`` s, generous: start-up on two busy cores; the kill lands
    anyway): into a step, its checkpoint, or the work ahead. Each start's output goes to ``logs``/log-N.txt. Counts
    logged steps, never times a step. Returns a line per kill, for the assertions' messages."""
    import random
    import subprocess
    import time

    rng, history = random.Random(seed), []
    for kill in range(kills):
        with open(os.path.join(logs, f"log-{kill}.txt"), "w") as log:
            proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            seen = len(logged_steps(run))
            deadline = time.monotonic() + start_timeout
            while proc.poll() is None and len(logged_steps(run)) <= seen and time.monotonic() < deadline:
                time.sleep(0.02)
            pause = rng.uniform(0.0, 1.0)
            time.sleep(pause)
            proc.kill()
            proc.wait(timeout=60)
        history.append(f"kill {kill}: {pause:.2f}s after step {len(logged_steps(run))} was logged")
    return history
