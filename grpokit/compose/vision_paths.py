"""Which sampling paths take prompts with images: grpokit's own sampler (``generation.engine: hf``), in one process,
in Ray rollout workers or under torchrun (DDP, FSDP; every training prompt with an image), synchronous or sampling
ahead; tool rollouts (``tools``) in one process. Every other path is refused in one line before anything samples, so
none drops a prompt's images."""

from __future__ import annotations

from grpokit.errors import ConfigError

FIX = "prompts with images are sampled by grpokit's own sampler only (docs/vision.md, 'What each path supports')"


def check_image_paths(args, engine: str, prompts, procs, tools, rollout_func, eval_sets: dict | None = None) -> None:
    """A ConfigError naming the first sampling path that cannot take the run's images; nothing when no prompt of the
    train or eval sets has one."""
    from grpokit.models.vision_inputs import VisionPrompt, has_images

    sources = [prompts, *[s for s, _ in (eval_sets or {}).values()]]
    if not any(has_images(s.ids) for s in sources):
        return
    refusals = [
        (rollout_func is not None, "a rollout_func samples outside grpokit and would not get the images"),
        (
            getattr(tools, "environments", None) is not None,
            "an environment_factory's rollouts do not take prompts with images yet (tools= do); give tools",
        ),
        (
            not _engine_takes_images(engine),
            f"generation.engine: {engine} does not take images (vLLM: not passed to its multi_modal_data yet); set "
            "generation.engine: hf",
        ),
        (
            procs.world_size > 1 and not all(isinstance(p, VisionPrompt) for p in prompts.ids),
            f"torchrun ({procs.world_size} processes) needs an image in every training prompt when any has one (a "
            "rank whose batch has none leaves the vision tower out of the gradient reduction); give each prompt an "
            "image or run one process",
        ),
    ]
    for refused, reason in refusals:
        if refused:
            raise ConfigError(f"{FIX}: {reason}.")


def _engine_takes_images(engine: str) -> bool:
    """The engine's registry entry says it samples prompts with images (``EngineEntry.takes_images``)."""
    from grpokit.rollout.engines import ENGINES

    entry = ENGINES.get(engine)
    return entry is not None and entry.takes_images
