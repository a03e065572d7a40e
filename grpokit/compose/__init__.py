"""The composition root: the flat config in, a built :class:`~grpokit.compose.run.Run` out (``build_run``). Builders
are grouped by what they build: ``inputs`` (arguments, processes, datasets, rewards), ``policy`` (model, tokenizer,
LoRA), ``rollouts`` (engine, sampler, source), ``learner`` (reference, optimizer, learner, critic), ``specs`` (each
part's typed, frozen settings) and ``run`` (the whole Run). The only code outside ``config/`` that reads the flat
config."""

from grpokit.compose.run import Run, build_run

__all__ = ["Run", "build_run"]
