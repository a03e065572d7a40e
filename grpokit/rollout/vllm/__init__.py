"""vLLM as a rollout engine, beside grpokit's own sampler (rollout/engine.py): its settings (settings.py, torch-free),
the colocated engine (engine.py; per torchrun rank: colocate.py), a vLLM server's client and engine (http.py,
server.py, server_weights.py, server_worker.py: the extension on the server's side), weight sync and its check
(weights.py), partial rollouts (partial.py), the server's key (keys.py, serve_auth.py) and the GPU check
(gpu_check.py). Nothing here imports vllm at module level."""
