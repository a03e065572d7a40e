"""Command line: grpokit train | eval | explain | demo | inspect | report | env | serve-rewards | vllm-serve.

Every way out of a command is one line on stderr, never a traceback, besides a bug's: a signal (exit 128 + signum,
from the first line of ``main`` to the interpreter's last, imports included: ``interrupt.CommandSignals``), an error
grpokit raises on purpose and a file the storage would not read or write (``grpokit: error: ...``, exit 2).
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpokit.commands.user_errors import command_overrides, is_user_error  # light: its imports are in the function
from grpokit.train import interrupt  # signal handling only: no heavy import comes before the handlers


def main(argv: list[str] | None = None) -> int:
    """Run the command in ``argv`` (default: the process's arguments) and return its exit status.

    Without ``argv`` main owns the process (the console script, ``python -m grpokit``): its signal handlers stay
    until the process ends. With ``argv`` (a call from Python) the caller's handlers are restored on return."""
    signals = interrupt.CommandSignals()
    previous = signals.install()  # first, before anything that imports numpy, torch or transformers
    if argv is None:
        _ask_for_huge_pages()
    try:
        return _run(argv, signals)
    except BaseException:  # while parsing the arguments (argparse's SystemExit), or a bug re-raised
        signals.finish()  # what remains is reporting: a signal now ends the process at once
        if signals.signum is None:
            raise
        return _stopped(signals.signum)  # a signal, whatever a library made of it
    finally:
        signals.finish()
        if argv is not None:
            interrupt.restore(previous)


def _ask_for_huge_pages() -> None:
    """The CLI owns its process: PyTorch backs its CPU tensors of 2 MB or more with transparent huge pages
    (``grpokit.kernels.allocator``), unless the environment already says (``THP_MEM_ALLOC_ENABLE=0`` turns it off).
    PyTorch reads the variable at its first allocation, so this comes before torch is imported (the CLI imports it
    in the commands)."""
    import os

    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # allocator.HUGE_PAGES_ENV; importing it would import torch


def _run(argv: list[str] | None, signals: interrupt.CommandSignals) -> int:
    """Parse ``argv``, run the command, and turn each way it can fail into one line and an exit status."""
    args = _parser().parse_args(argv)
    try:
        code = int(args.func(args) or 0)
    except BaseException as exc:
        signals.finish()
        return _failed(exc, signals.signum)
    signals.finish()
    if signals.signum is None or code >= 128:  # no signal, or one the command has reported (the trainer's stop)
        return code
    return _stopped(signals.signum)  # its Interrupted was swallowed (a library's except BaseException)


def _failed(exc: BaseException, signum: int | None) -> int:
    """One line and the exit status for ``exc``, which ended a command; re-raises a bug."""
    if isinstance(exc, interrupt.Interrupted):
        print(f"grpokit: {exc.message}", file=sys.stderr)
        return 128 + exc.signum
    if signum is not None or isinstance(exc, KeyboardInterrupt):  # whatever a library made of the signal
        # (KeyboardInterrupt alone: Python's own SIGINT handler, when main() runs outside the main thread)
        return _stopped(signum or 2)
    if isinstance(exc, BrokenPipeError):  # `grpokit inspect RUN | head`: the reader has all it wants
        _silence_stdout()
        return 141  # as a shell reports a process ended by SIGPIPE
    if is_user_error(exc):
        print(f"grpokit: error: {exc}", file=sys.stderr)
        return 2
    from grpokit.system.io_errors import storage_error_line

    line = storage_error_line(exc)
    if line is None:
        raise exc
    print(f"grpokit: error: {line}", file=sys.stderr)
    return 2


def _stopped(signum: int) -> int:
    print(f"grpokit: stopped by {interrupt.signal_name(signum)}", file=sys.stderr)
    return 128 + signum


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail on the closed pipe again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _parser():
    import argparse

    parser = argparse.ArgumentParser(prog="grpokit", description="GRPO-family RL fine-tuning of language models.")
    from grpokit.version import __version__

    parser.add_argument("--version", action="version", version=f"grpokit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "train",
        help="train from a YAML config",
        description="Train from a YAML config. Overrides: key=value, section.key=value or --key=value.",
    )
    p.add_argument("config", help="a YAML config (every key: docs/config.md)")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value settings that replace the config's")
    p.set_defaults(func=_quietly(cmd_train))

    p = sub.add_parser("eval", help="evaluate a config's model, or a run's final model, on its eval dataset")
    p.add_argument("target", help="a YAML config or a run folder")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value settings that replace the config's")
    p.set_defaults(func=_quietly(cmd_eval))

    p = sub.add_parser("explain", help="print the resolved config and derived sizes, without training")
    p.add_argument("config", help="a YAML config or a run folder")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value settings that replace the config's")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("demo", help="offline CPU demo: teach a small model arithmetic with GRPO")
    p.add_argument("--output-dir", default="runs/demo", help="the run folder (default: runs/demo)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the example config's)")
    p.add_argument("--rebuild", action="store_true", help="rebuild the cached warm-start policy")
    p.set_defaults(func=_quietly(cmd_demo))

    p = sub.add_parser("env", help="print versions, hardware and what grpokit picks here (for bug reports)")
    p.add_argument("--probe", action="store_true", help="measure the CPU's compute paths again (new hardware)")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser(
        "serve-rewards",
        help="serve a rewards list over HTTP (grpokit's and OpenRLHF's formats)",
        description="Serve rewards over HTTP: a YAML config (its rewards: list and reward: settings), a YAML list, or "
        "reward specs (accuracy, file.py:function, module:function). docs/rewards.md, 'Remote rewards'.",
    )
    p.add_argument("rewards", nargs="+", help="a YAML config or rewards list, or reward specs")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need a token)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one and prints it)")
    p.add_argument("--token", default=None, help="shared token required on every request (or $GRPOKIT_REWARD_TOKEN)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per reward per batch (default: the config's)")
    p.add_argument("--max-body", type=int, default=64 << 20, help="bytes of a request body (default 64 MiB; 413 over)")
    p.add_argument("--max-queue", type=int, default=16, help="requests waiting their turn (default 16; 503 over)")
    p.add_argument("--request-timeout", type=float, default=60.0, help="seconds per read of a request (default 60)")
    p.add_argument("--certfile", default=None, help="PEM certificate: serve HTTPS (with --keyfile)")
    p.add_argument("--keyfile", default=None, help="PEM private key of --certfile")
    p.add_argument("--client-ca", default=None, help="PEM CA bundle: require client certificates it signed (mTLS)")
    p.set_defaults(func=cmd_serve_rewards)

    from grpokit.rollout.vllm_serve_cmd import register as register_vllm_serve

    register_vllm_serve(sub)
    from grpokit.store.cli import register

    register(sub)
    from grpokit.doctor.cli import register as register_doctor

    register_doctor(sub)
    return parser


def _quietly(command):
    """``command`` (one that loads a model) run with transformers' own progress bars off: see
    :func:`_quiet_model_loading`."""

    def run(args) -> int:
        from grpokit.system.quiet import quiet_third_party

        quiet_third_party()  # before peft (and through it bitsandbytes) is imported
        _quiet_model_loading()
        return command(args)

    return run


def _quiet_model_loading() -> None:
    """Turn off transformers' own progress bars ("Loading weights", "Loading checkpoint shards", "Writing model
    shards"): drawn on stderr between a run's log lines, they break them up and tell a log nothing. Downloads keep
    huggingface_hub's bars (a first run of a hub model shows its progress); ``HF_HUB_DISABLE_PROGRESS_BARS=0``
    keeps every bar. The CLI owns its process; the library leaves a Python user's settings alone."""
    from huggingface_hub import constants
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    if constants.HF_HUB_DISABLE_PROGRESS_BARS is False:  # the user asked for every bar
        return
    downloads = not are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()  # turns off huggingface_hub's bars too,
    if downloads:
        enable_progress_bars()  # which downloads keep


def _keep_freed_memory_on_cpu(device: str) -> None:
    """The CLI owns its process: on CPU, let glibc keep freed memory for the next step
    (:func:`grpokit.kernels.keep_freed_memory`; the library never changes its caller's allocator)."""
    from grpokit.kernels import keep_freed_memory
    from grpokit.machine.hardware import pick_device

    try:
        cpu = pick_device(device).type == "cpu"
    except RuntimeError:  # an unavailable device: the trainer reports it
        return
    if cpu:
        keep_freed_memory()


def cmd_train(args) -> int:
    import os

    from grpokit.compose.specs import run_dir_spec
    from grpokit.config import load_config
    from grpokit.system.processes import under_torchrun
    from grpokit.train.rundir.folder import check_run_dir
    from grpokit.trl.trainer import GRPOTrainer

    cfg = load_config(args.config, command_overrides(args.overrides))
    if os.environ.get("RANK", "0") == "0":  # rank 0 owns the run folder (GRPOTrainer checks it again in train())
        check_run_dir(run_dir_spec(cfg))  # a folder holding another run is refused before the model loads
    _keep_freed_memory_on_cpu(cfg.device)
    finished = distributed = False
    try:
        trainer = GRPOTrainer(args=cfg)
        trainer.train()
        finished = trainer.interrupted_by is None
    finally:
        if under_torchrun():  # leave the process group before exiting
            from grpokit.distributed import shutdown_distributed

            distributed = shutdown_distributed(finished)
    if trainer.interrupted_by is not None:
        code = 128 + int(trainer.interrupted_by)  # 130 for SIGINT, 143 for SIGTERM
    else:
        code = 1 if trainer.stop_reason and "non-finite" in trainer.stop_reason else 0
    if distributed:
        from grpokit.distributed import exit_process

        exit_process(code)  # a torchrun rank skips the interpreter's teardown (see exit_process)
    return code


def cmd_eval(args) -> int:
    """Evaluate and print the metrics as JSON. Nothing is written: the trainer's output_dir is a temporary folder
    (it only has to pass the run-folder check), so a finished run on read-only storage evaluates too."""
    import json
    import tempfile

    from grpokit.config import ConfigError
    from grpokit.trl.trainer import GRPOTrainer

    cfg, model = eval_inputs(Path(args.target), command_overrides(args.overrides))
    if cfg.eval_dataset is None:
        raise ConfigError(f"{args.target} sets no data.eval_dataset; add one (or pass eval_dataset=PATH) to evaluate.")
    _keep_freed_memory_on_cpu(cfg.device)
    with tempfile.TemporaryDirectory(prefix="grpokit-eval-") as scratch:
        trainer = GRPOTrainer(
            model=model,  # None: the config's model_name_or_path
            args=cfg.replace(output_dir=str(Path(scratch) / "eval"), resume_from=None),
        )
        try:
            metrics = trainer.evaluation_metrics()  # grpokit's names, as metrics.jsonl has them
        finally:
            trainer.rewards.close()  # the reward worker processes
            trainer.run.evaluator.reward_runner.close()  # eval_rewards' (the same runner without them)
    from grpokit.system.io_errors import write_stdout

    write_stdout(json.dumps(metrics, indent=2) + "\n")
    return 0


def eval_inputs(target: Path, overrides: list[str]):
    """(config, model or None) of `grpokit eval`: a YAML config as it is (its starting model, loaded by the trainer),
    or a run folder's config with its final model. A LoRA run's final/ holds the adapter: it is loaded onto its base
    and merged here (peft), and the run's lora section dropped, since new adapters on top would start from zero and
    be evaluated in place of the trained ones (a QLoRA run's adapter is merged into the unquantised base)."""
    from grpokit.config import load_config

    if not target.is_dir():
        return load_config(target, overrides), None
    cfg = load_config(_run_config(target), overrides)
    final = target / "final"
    if not final.is_dir():
        raise FileNotFoundError(
            f"{target} has no final/ model yet; evaluate a finished run, or its config to use the starting model."
        )
    cfg.model_name_or_path = str(final)
    cfg.resume_from = None
    if not (final / "adapter_config.json").is_file():
        return cfg, None
    from peft import AutoPeftModelForCausalLM

    from grpokit.machine.hardware import pick_device, pick_dtype

    dtype = pick_dtype(cfg.dtype, pick_device(cfg.device))  # the training run's weights dtype
    model = AutoPeftModelForCausalLM.from_pretrained(str(final), dtype=dtype, trust_remote_code=cfg.trust_remote_code)
    tokenizer = cfg.tokenizer_name_or_path or str(final)  # final/ holds the run's tokenizer
    merged = model.merge_and_unload().requires_grad_(True)  # a plain model, as a full fine-tuning run's (peft froze it)
    return cfg.replace(r=0, load_in_4bit=False, tokenizer_name_or_path=tokenizer), merged


def cmd_explain(args) -> int:
    from grpokit.commands.explain import explain
    from grpokit.config import load_config

    path = Path(args.config)
    print(explain(load_config(_run_config(path) if path.is_dir() else path, command_overrides(args.overrides))))
    return 0


def _run_config(run: Path) -> Path:
    """RUN/config.yaml of a run folder, or a ConfigError saying the folder is not one."""
    from grpokit.config import ConfigError

    config = run / "config.yaml"
    if not config.is_file():
        raise ConfigError(
            f"{run} is a folder without config.yaml, so not a grpokit run folder; give a run folder "
            "(the output_dir of `grpokit train`) or a YAML config."
        )
    return config


def cmd_demo(args) -> int:
    from grpokit.demo import run_demo

    _keep_freed_memory_on_cpu("auto")  # the demo's config leaves the device to auto
    result = run_demo(output_dir=args.output_dir, steps=args.steps, rebuild=args.rebuild)
    for key in ("pass1_before", "pass1_after", "pass8_before", "pass8_after", "wall_seconds"):
        print(f"{key}={result[key]:.4f}")  # machine-readable, one key=value per line
    return 0


def cmd_serve_rewards(args) -> int:
    import os

    from grpokit.compose.rewards import served_reward_runner
    from grpokit.rewards.serve import TOKEN_ENV, ServeOptions, check_binding, run_server

    token = args.token or os.environ.get(TOKEN_ENV) or None
    options = ServeOptions(
        args.max_body, args.max_queue, args.request_timeout, args.certfile, args.keyfile, args.client_ca
    )
    options.check()  # these three before the reward workers start
    options.tls_context()
    check_binding(args.host, token)
    return run_server(served_reward_runner(args.rewards, args.timeout), args.host, args.port, token, options)


def cmd_env(args) -> int:
    from grpokit.commands.env import format_report, report

    print(format_report(report(probe=args.probe)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
