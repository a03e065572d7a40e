"""The CUDA path of vllm_mode: server, on a CPU: vLLM 0.32's real trainer-side NCCL engine
(``NCCLTrainerWeightTransferEngine``) driven by grpokit's NCCLPush against the fake server of tests/unit, with the
three CUDA-only pieces replaced: opening the NCCL endpoint, the packed broadcast (it records what it would send)
and the stream sync. What this checks: the routes, their order and payloads, and the tensors offered to the
broadcast. What it cannot: the NCCL group, the broadcast and the server's side of the transfer (never run: no GPU)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from fake_vllm_server import FakeVLLM

from grpokit.rollout.vllm.http import ServerClient
from grpokit.rollout.vllm.weights import vllm_weight_items


def test_nccl_push_drives_vllms_weight_transfer_routes(monkeypatch, vllm_model_dir):
    from transformers import AutoModelForCausalLM
    from vllm.distributed.weight_transfer import nccl_engine

    from grpokit.rollout.vllm.server_weights import NCCLPush

    opened, sent = [], []
    monkeypatch.setattr(nccl_engine, "open_trainer_endpoint", lambda info: opened.append(info) or "group")

    def broadcast(iterator, group, src, post_iter_func, buffer_size_bytes, num_buffers):
        assert (group, src) == ("group", 0)
        sent.extend((item[0], post_iter_func(item).clone()) for item in iterator)

    monkeypatch.setattr(nccl_engine, "packed_nccl_broadcast_producer", broadcast)
    monkeypatch.setattr(nccl_engine.NCCLTrainerWeightTransferEngine, "_post_send_sync", lambda self: None)
    policy = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32)
    with FakeVLLM(key="k") as fake:  # keyed as `grpokit vllm-serve` is
        pusher = NCCLPush(ServerClient(fake.url, 30, api_key="k"), policy)
        pusher.push(0, policy)
        ahead = copy.deepcopy(policy)  # sampling ahead pushes a copy of the policy at the batch's version
        with torch.no_grad():
            ahead.model.norm.weight.add_(1.0)
        pusher.push(1, ahead)
        pusher.close()
    routes = [route for route, _ in fake.calls]
    one_push = ["/start_weight_update", "/update_weights", "/finish_weight_update", "/reset_prefix_cache"]
    assert routes == ["/get_world_size", "/init_weight_transfer_engine", *one_push, *one_push,
                      "/shutdown_weight_transfer_engine"]  # fmt: skip
    init = fake.calls[1][1]["init_info"]
    assert (init["rank_offset"], init["world_size"], init["packed"]) == (1, 2, True)  # rank 0 here, 1 worker
    assert (opened[0].world_size, opened[0].rank, opened[0].master_port) == (2, 0, init["master_port"])
    # the rendezvous binds the address facing the server, told to its workers: loopback for a loopback server
    assert opened[0].master_address == init["master_address"] == "127.0.0.1"
    assert {header for _, header in fake.authorization} == {"Bearer k"}  # every route with the key
    update = fake.calls[3][1]["update_info"]
    names = [name for name, _ in vllm_weight_items(policy)]
    assert update["names"] == names and "lm_head.weight" not in names  # the tied head goes once, as the embeddings
    assert set(update["dtype_names"]) == {"float32"}
    assert update["shapes"][names.index("model.norm.weight")] == [64]
    assert fake.calls[4] == ("/finish_weight_update", None)  # no weight_version
    assert [name for name, _ in sent] == names * 2
    second = dict(sent[len(names) :])
    assert torch.equal(second["model.norm.weight"], ahead.model.norm.weight)  # the copy's weight was offered
    assert not torch.equal(dict(sent[: len(names)])["model.norm.weight"], second["model.norm.weight"])
