"""Multi-turn tool rollouts in training: the run's tools and environments, and the sampler that runs them.

:func:`resolve_tools` turns GRPOTrainer's ``tools=`` / ``environment_factory=`` (TRL's arguments) or the config's
``agent`` section into a :class:`ToolSpec` before any model loads: every tool's schema is built and the
first environment instance made, so a missing docstring or a broken ``reset`` stops the run at once.
:class:`ToolRollouts` samples a step's rollouts with them: one environment session per rollout (reset with its
dataset row), a :class:`grpokit.rollout.multiturn.MultiTurnEngine` over the run's HF engine, each group seeded
on its own (so a resumed run samples the same rollouts); it keeps the step's sessions, whose instances the
reward functions get as ``environments``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpokit.config import ConfigError, GRPOConfig
from grpokit.data.prompts import DataError
from grpokit.rewards.contract import is_conversational
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.multiturn import MultiTurnEngine
from grpokit.rollout.types import Conversation, Rollouts, SamplingParams
from grpokit.tools import (
    ConversationTokens,
    Environments,
    ToolError,
    ToolExecutor,
    get_tool_parser,
    tool_metrics,
    tool_schemas,
    with_observation,
)
from grpokit.tools.conversation import tool_suffix_ids
from grpokit.tools.parsing import ToolParser


@dataclass
class ToolSpec:
    """What a run's tool rollouts use: plain ``tools``, ``environments`` (None: none), the tool-call ``parser``
    (None: detected from the chat template), ``max_tool_calling_iterations`` (None: no limit), and how calls run
    (``timeout`` seconds, ``workers``, ``isolation``)."""

    tools: list[Callable]
    environments: Environments | None
    parser: str | ToolParser | None
    max_tool_calling_iterations: int | None
    timeout: float
    workers: int
    isolation: str

    def reward_functions(self) -> list[Callable]:
        """The environments' ``get_reward`` as reward functions (TRL: weight 1, named after the class)."""
        if self.environments is None:
            return []
        functions = []
        for name, fn in self.environments.reward_functions():
            fn.__name__ = fn.__qualname__ = name
            functions.append(fn)
        return functions


def resolve_tools(args: GRPOConfig, tools: Sequence[Callable] | None, environment_factory: Any) -> ToolSpec | None:
    """The run's :class:`ToolSpec` from GRPOTrainer's ``tools`` and ``environment_factory`` where given, else from
    the config's ``tools`` and ``environment_factory``; None when the run has neither (single-turn rollouts).
    Bad tools, environments or parser names are a :class:`ConfigError` naming the setting."""
    from grpokit.rewards.registry import load_callable

    try:
        if tools is None:
            tools = [load_callable(spec, "tools") for spec in args.tools]
        if environment_factory is None and args.environment_factory is not None:
            environment_factory = load_callable(args.environment_factory, "environment_factory")
        if not tools and environment_factory is None:
            return None
        args.check_multi_turn()
        tools = list(tools)
        tool_schemas(tools)  # every tool documented and typed, before any model loads
        parser = args.tool_parser
        if parser == "auto":
            parser = None
        elif ":" in parser:
            parser = load_callable(parser, "tool_parser")
        else:
            get_tool_parser(parser)
        environments = None if environment_factory is None else Environments(environment_factory)
    except (ToolError, ValueError, TypeError, FileNotFoundError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"agent: {exc}") from exc
    return ToolSpec(
        tools,
        environments,
        parser,
        args.max_tool_calling_iterations,
        args.tool_timeout,
        args.tool_workers,
        args.tool_isolation,
    )


def check_tool_prompts(rows: Sequence[Mapping[str, Any]], prompt_column: str, name: str = "train_dataset") -> None:
    """Tool rollouts are conversations: every prompt must be a list of chat messages."""
    for i, row in enumerate(rows):
        if not is_conversational(row[prompt_column]):
            raise DataError(
                f"{name} row {i}: with tools or an environment_factory the {prompt_column!r} column must hold chat "
                'messages ([{"role": "user", "content": ...}]), which the chat template renders with the tools.'
            )


class ToolRollouts:
    """Samples a step's multi-turn rollouts from the dataset rows of its prompts (see the module docstring).
    ``sessions``: the environment session of each rollout of the last batch (empty without environments)."""

    def __init__(
        self, spec: ToolSpec, engine: HFRolloutEngine, tokenizer: Any, prompt_column: str, template_kwargs=None
    ):
        """``template_kwargs``: apply_chat_template's keywords for every rendering (TRL's chat_template_kwargs)."""
        self.spec, self.prompt_column = spec, prompt_column
        template_kwargs = dict(template_kwargs or {})
        try:
            chat = ConversationTokens(tokenizer, **template_kwargs)
            # the template must render tool rounds after a turn the same way whatever follows: checked now
            tool_suffix_ids(
                tokenizer,
                [{"role": "tool", "name": "probe", "content": "probe"}],
                end_of_turn=chat.end_of_turn,
                **template_kwargs,
            )
        except ToolError as exc:
            raise ConfigError(f"agent: {exc}") from exc
        self.engine = MultiTurnEngine(
            engine,
            chat,
            self._executor(),
            max_tool_calling_iterations=spec.max_tool_calling_iterations,
            parser=spec.parser,
        )
        self.sessions: list = []
        self.closed = False

    def _executor(self) -> ToolExecutor:
        spec = self.spec
        return ToolExecutor(spec.tools, timeout=spec.timeout, max_workers=spec.workers, isolation=spec.isolation)

    def generate(
        self,
        rows: Sequence[Mapping[str, Any]],
        num_generations: int,
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> Rollouts:
        """``num_generations`` rollouts of each row's prompt, the group of row b sampled from ``seeds[b]`` (None:
        from the engine's generator)."""
        if self.closed:  # closed at the end of train(); a later evaluate() starts the tool workers again
            self.engine.executor, self.closed = self._executor(), False
        prompts = [row[self.prompt_column] for row in rows]
        sessions = None
        if self.spec.environments is not None:
            sessions = self.spec.environments.sessions([row for row in rows for _ in range(num_generations)])
        self.sessions = sessions or []
        return self.engine.generate(prompts, num_generations, params, sessions, seeds=seeds)

    @property
    def environments(self) -> list[Any] | None:
        """The environment instances of the last batch's rollouts (reward functions' ``environments``), or None."""
        return [s.instance for s in self.sessions] if self.spec.environments is not None else None

    def reward_inputs(
        self, prompts: list, conversations: Sequence[Conversation], columns: dict[str, list]
    ) -> tuple[list, list, dict[str, list]]:
        """``(prompts, completions, columns)`` for the reward functions, as TRL gives them for tool rollouts: each
        completion is its messages after the prompt; with environments each prompt carries its ``reset``
        observation and the columns get ``environments`` (this batch's instances, in order)."""
        completions = [c.messages for c in conversations]
        if self.spec.environments is None:
            return prompts, completions, columns
        prompts = [with_observation(p, s.observation) for p, s in zip(prompts, self.sessions)]
        return prompts, completions, {**columns, "environments": self.environments}

    def close(self) -> None:
        """Stop the tool workers (a later :meth:`generate` starts new ones)."""
        self.engine.executor.close()
        self.closed = True


def conversation_metrics(conversations: Sequence[Conversation]) -> dict[str, float]:
    """TRL's ``tools/call_frequency`` and ``tools/failure_frequency`` (:func:`grpokit.tools.tool_metrics`, from each
    rollout's tool turns) and ``tools/rounds``, the mean rounds of tool calls per rollout."""
    metrics = tool_metrics([[t for t in c.turns if t.role == "tool"] for c in conversations])
    metrics["tools/rounds"] = sum(c.tool_rounds for c in conversations) / max(len(conversations), 1)
    return metrics
