"""vLLM in a Ray rollout worker (``distributed.backend: ray`` with ``generation.engine: vllm``).

Each worker (a Ray actor, its own process) holds one ``vllm.LLM`` in that process: the same engine as one learner
process (:class:`grpokit.rollout.vllm.engine.VLLMRolloutEngine`, ``distributed_executor_backend=
"external_launcher"`` over a one-process world on a free port of its own), so vLLM's model is reachable for the
in-place reload. vLLM's own Ray executor is not used: vLLM 0.32 refuses it on the CPU platform, and it would start
further actors from inside this one.

- Threads: Ray sets ``OMP_NUM_THREADS`` to the actor's ``num_cpus``; vLLM's ``CPUWorker`` then turns
  ``torch.set_num_threads`` into a no-op for the whole process, so the threads are set before the engine is built.
- Weights: by version from the object store into the worker's CPU copy of the policy, strictly
  (:func:`grpokit.distributed.ray_rollout.load_published`: the names must be exactly the copy's), then, before the
  next sampling, from the copy into vLLM by ``collective_rpc("reload_weights", ...)`` as the in-process engine does
  (:func:`grpokit.rollout.vllm.weights.push_weights`). The copy costs one more model in CPU memory per worker.
- A worker that dies is replaced by a new actor (a new engine, built from the model folder) and its chunk re-run with
  the same group seeds; vLLM seeds each request, so the chunk's rollouts are the ones the dead worker would have
  returned.
"""

from __future__ import annotations

import torch


def worker_vllm_engine(model, eos_token_ids, pad_token_id, device, autocast_dtype, *, spec, seed: int, threads: int):
    """The worker's engine: ``threads`` torch threads set first, then a VLLMRolloutEngine over ``model`` (the
    worker's CPU copy) on ``device``'s type (vLLM's CUDA build on a GPU worker, its CPU build on a CPU one)."""
    from grpokit.rollout.vllm.engine import VLLMRolloutEngine

    torch.set_num_threads(max(1, threads))
    return VLLMRolloutEngine(
        model,
        eos_token_ids,
        pad_token_id,
        spec,
        seed=seed,
        learner_dtype=autocast_dtype,
        device_type=device.type,
    )


def worker_vllm_options(spec, seed: int, worker_cpus: float) -> dict:
    """The ``vllm`` keywords of :class:`grpokit.distributed.ray_rollout.RolloutWorker` (picklable)."""
    return {"spec": spec, "seed": seed, "threads": max(1, int(worker_cpus))}


@torch.no_grad()
def sync_gap(model: torch.nn.Module, rollouts, temperature: float) -> float:
    """The largest |log p_copy - log p_vLLM| over the sampled tokens of ``rollouts``, where p_copy is the worker's
    own copy of the policy at the version vLLM just loaded (float32 logits / ``temperature``, log-softmax: the
    learner's formula, and vLLM's processed log-probs with top_p 1, top_k 0, min_p 0). Whatever the staleness of the
    run, both sides hold the same version, so a correct load gives float32 rounding (~1e-7) and a broken one far
    more. One forward pass of the copy per completion, after each new version only (on the copy's device)."""
    device = getattr(next(model.parameters(), None), "device", "cpu")
    worst = 0.0
    G = rollouts.num_generations
    for row in range(rollouts.completion_ids.size(0)):
        n = int(rollouts.completion_mask[row].sum())
        if n == 0:
            continue
        prompt = list(rollouts.prompt_ids[row // G])
        completion = rollouts.completion_ids[row, :n].tolist()
        ids = torch.tensor([prompt + completion], device=device)  # [1, P + n]
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float().cpu() / max(temperature, 1e-6)  # [n, V]
        mine = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]  # [n]
        worst = max(worst, (mine - rollouts.logprobs[row, :n]).abs().max().item())
    return worst
