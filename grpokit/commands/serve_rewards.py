"""`grpokit serve-rewards REWARDS ...`: serve a rewards list over HTTP (grpokit/rewards/serve.py is the server)."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser(
        "serve-rewards",
        help="serve a rewards list over HTTP (grpokit's and OpenRLHF's formats)",
        description="Serve rewards over HTTP: a YAML config (its rewards: list and reward: settings), a YAML list, or "
        "reward specs (accuracy, file.py:function, module:function). docs/rewards.md, 'Remote rewards'.",
    )
    p.add_argument("rewards", nargs="+", help="a YAML config or rewards list, or reward specs")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need a token)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one and prints it)")
    p.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="file holding the shared token required on every request (or set $GRPOKIT_REWARD_TOKEN)",
    )
    p.add_argument("--token", default=None, help=argparse.SUPPRESS)  # refused: the command line is public (ps)
    p.add_argument("--timeout", type=float, default=None, help="seconds per reward per batch (default: the config's)")
    p.add_argument("--max-body", type=int, default=64 << 20, help="bytes of a request body (default 64 MiB; 413 over)")
    p.add_argument("--max-queue", type=int, default=16, help="requests waiting their turn (default 16; 503 over)")
    p.add_argument(
        "--request-timeout", type=float, default=60.0, help="seconds to send a body once admitted (default 60; 408)"
    )
    p.add_argument(
        "--header-timeout", type=float, default=10.0, help="seconds to send a request line and headers (default 10)"
    )
    p.add_argument(
        "--keep-alive-timeout", type=float, default=30.0, help="seconds an idle connection stays open (default 30)"
    )
    p.add_argument("--max-connections", type=int, default=4096, help="open connections (default 4096; 503 over)")
    p.add_argument("--certfile", default=None, help="PEM certificate: serve HTTPS (with --keyfile)")
    p.add_argument("--keyfile", default=None, help="PEM private key of --certfile")
    p.add_argument("--client-ca", default=None, help="PEM CA bundle: require client certificates it signed (mTLS)")
    p.set_defaults(func=run_serve_rewards)


def run_serve_rewards(args) -> int:
    import os

    from grpokit.compose.rewards import served_reward_runner
    from grpokit.rewards.contract import RewardError
    from grpokit.rewards.serve import ServeOptions, check_binding, run_server
    from grpokit.rewards.serve_token import ON_COMMAND_LINE, served_token

    if args.token is not None:
        raise RewardError(ON_COMMAND_LINE)
    token = served_token(args.token_file, os.environ)
    options = ServeOptions(
        max_body=args.max_body,
        max_queue=args.max_queue,
        request_timeout=args.request_timeout,
        certfile=args.certfile,
        keyfile=args.keyfile,
        client_ca=args.client_ca,
        header_timeout=args.header_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        max_connections=args.max_connections,
    )
    options.check()  # these three before the reward workers start
    options.tls_context()
    check_binding(args.host, token)
    return run_server(served_reward_runner(args.rewards, args.timeout), args.host, args.port, token, options)
