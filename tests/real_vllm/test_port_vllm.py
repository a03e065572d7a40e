"""vLLM's rendezvous port taken between grpokit choosing it and vLLM binding it (CI saw it: two Ray workers' engines
starting at once, one failing with EADDRINUSE): the engine starts again on a fresh port instead of dying."""

from __future__ import annotations

import os
import socket

from real_vllm_helpers import SETTINGS, TARGET_REWARD, prompts
from shared_helpers import sampling_params

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.rollout.vllm import engine as vllm_engine


def test_a_port_taken_after_grpokit_chose_it_is_replaced(tmp_path, vllm_model_dir, monkeypatch):
    held: list[socket.socket] = []
    choose = vllm_engine.single_process_env

    def choose_then_lose_it():
        choose()
        if not held:  # the first port chosen: another process listens on it before vLLM binds it
            taker = socket.socket()
            taker.bind(("127.0.0.1", int(os.environ["MASTER_PORT"])))
            taker.listen()
            held.append(taker)

    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.setattr(vllm_engine, "single_process_env", choose_then_lose_it)
    args = GRPOConfig(**{**SETTINGS, "output_dir": str(tmp_path / "run"), "dtype": "float32"})
    try:
        trainer = GRPOTrainer(str(vllm_model_dir), TARGET_REWARD, args=args, train_dataset=prompts())
        taken = held[0].getsockname()[1]
    finally:
        for taker in held:
            taker.close()
    assert int(os.environ["MASTER_PORT"]) != taken
    rollouts = trainer.engine.generate([[5, 6, 7]], 2, sampling_params(4, temperature=1.0))
    assert rollouts.completion_ids.shape[0] == 2
