"""What the commands that load a model share: transformers' progress bars off, freed memory kept on the CPU, and a
run folder's config."""

from __future__ import annotations

from pathlib import Path


def quietly(command):
    """``command`` (one that loads a model) run with transformers' own progress bars off: see
    :func:`quiet_model_loading`."""

    def run(args) -> int:
        from grpokit.system.quiet import quiet_third_party

        quiet_third_party()  # before peft (and through it bitsandbytes) is imported
        quiet_model_loading()
        return command(args)

    return run


def quiet_model_loading() -> None:
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


def keep_freed_memory_on_cpu(device: str) -> None:
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


def run_config(run: Path) -> Path:
    """RUN/config.yaml of a run folder, or a ConfigError saying the folder is not one."""
    from grpokit.config import ConfigError

    config = run / "config.yaml"
    if not config.is_file():
        raise ConfigError(
            f"{run} is a folder without config.yaml, so not a grpokit run folder; give a run folder "
            "(the output_dir of `grpokit train`) or a YAML config."
        )
    return config
