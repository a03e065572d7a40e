"""Multi-turn tool rollouts in training: the run's tools and environments, and the sampler that runs them.

:func:`resolve_tools` turns GRPOTrainer's ``tools=`` / ``environment_factory=`` (TRL's arguments) or the config's
``agent`` section into a :class:`ToolSpec` before any model loads: every tool's schema is built and the
first environment instance made, so a missing docstring or a broken ``reset`` stops the run at once.
:class:`ToolRollouts` samples a step's rollouts with them: one environment session per rollout (reset with its
dataset row), a :class:`grpokit.rollout.multiturn.MultiTurnEngine` over the run's HF engine (with
``generation.engine: transformers``
:class:`grpokit.rollout.transformers_multiturn.TransformersMultiTurnEngine`, TRL's round loop of generate calls:
the engine entry's ``tool_engine``), each group seeded on its own (so a resumed run samples the same rollouts); it
keeps the step's sessions, whose instances the reward functions get as ``environments``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpokit.data.prompts import DataError
from grpokit.errors import ConfigError
from grpokit.models.vision import processor_of
from grpokit.rewards.contract import is_conversational
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.engines import MultiTurnSpec, get_engine
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

    def all_tools(self) -> list[Callable]:
        """The plain tools, then each environment's tools (bound to the instance made when the run was built)."""
        tools = list(self.tools)
        for pool in [] if self.environments is None else self.environments.pools.values():
            tools += [t for t in pool.tools if t.__name__ not in {x.__name__ for x in tools}]
        return tools

    def reward_functions(self) -> list[Callable]:
        """The environments' ``get_reward`` as reward functions (TRL: weight 1, named after the class)."""
        if self.environments is None:
            return []
        functions = []
        for name, fn in self.environments.reward_functions():
            fn.__name__ = fn.__qualname__ = name
            functions.append(fn)
        return functions


def resolve_tools(
    agent,
    tools: Sequence[Callable] | None,
    environment_factory: Any,
    check_settings: Callable[[], None] = lambda: None,
) -> ToolSpec | None:
    """The run's :class:`ToolSpec` from GRPOTrainer's ``tools`` and ``environment_factory`` where given, else from
    the config's ``agent`` section (``tools``, ``environment_factory``); None when the run has neither (single-turn
    rollouts). ``check_settings``: called once the run is known to have tools (the root passes the config's
    refusal of settings multi-turn rollouts cannot run with). Bad tools, environments or parser names are a
    :class:`ConfigError` naming the setting."""
    from grpokit.rewards.resolve import load_callable

    try:
        if tools is None:
            tools = [load_callable(spec, "tools") for spec in agent.tools]
        if environment_factory is None and agent.environment_factory is not None:
            environment_factory = load_callable(agent.environment_factory, "environment_factory")
        if not tools and environment_factory is None:
            return None
        check_settings()
        tools = list(tools)
        tool_schemas(tools)  # every tool documented and typed, before any model loads
        parser = agent.tool_parser
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
        agent.max_tool_calling_iterations,
        agent.tool_timeout,
        agent.tool_workers,
        agent.tool_isolation,
    )


PLACEHOLDER_PROMPT = [{"role": "user", "content": ""}]  # TRL's: reset()'s observation becomes the whole message


def environment_owned_rows(
    factory: Any, *, max_steps: int | None, prompts_per_step: int, prompt_column: str
) -> list[dict[str, Any]]:
    """The training rows of a run without a ``train_dataset`` (TRL's environment-owned data): one step's prompts
    (``prompts_per_step``), each an empty user message to which the environment's ``reset()`` appends the real
    prompt; ``max_steps`` (None: not set by the user), which must be set, counts the steps. Without an environment,
    or with several (a ``{name: factory}`` dict, which routes rows by their ``environment`` column), a dataset is
    required; errors carry TRL's words and grpokit's fix."""
    if factory is None:
        raise DataError(
            "`train_dataset` is required unless an `environment_factory` is provided: give train_dataset=... (or "
            "data.train_dataset: a JSONL / Parquet / CSV path, a list of dicts or a datasets.Dataset), or an "
            "environment_factory whose reset() returns each prompt (with max_steps)."
        )
    if isinstance(factory, Mapping):
        raise ConfigError(
            "A `dict` `environment_factory` (multiple environments) requires a `train_dataset` with an `environment` "
            "column naming each row's environment; give such a dataset, or pass a single environment factory whose "
            "reset() returns the prompt."
        )
    if max_steps is None or max_steps < 1:
        raise ConfigError(
            "max_steps must be set to a positive value when the environment owns the data (no train_dataset: each "
            "prompt comes from reset(), so there are no epochs to count); set max_steps=N (GRPOConfig(max_steps=...), "
            "or optim.max_steps in YAML)."
        )
    return [{prompt_column: [dict(m) for m in PLACEHOLDER_PROMPT]} for _ in range(prompts_per_step)]


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
        self,
        spec: ToolSpec,
        engine: HFRolloutEngine,
        tokenizer: Any,
        prompt_column: str,
        template_kwargs=None,
        tool_engine: str = "multi-turn",
    ):
        """``template_kwargs``: apply_chat_template's keywords for every rendering (TRL's chat_template_kwargs);
        ``tool_engine``: the internal engine that runs the rounds over ``engine`` (``rollout.engines``)."""
        self.spec, self.prompt_column = spec, prompt_column
        template_kwargs = dict(template_kwargs or {})
        try:
            # a vision-language model's processor renders the tool messages that hold images (tools/tool_images.py)
            chat = ConversationTokens(tokenizer, processor=processor_of(tokenizer), **template_kwargs)
            # the template must render tool rounds after a turn the same way whatever follows: checked now
            tool_suffix_ids(
                tokenizer,
                [{"role": "tool", "name": "probe", "content": "probe"}],
                end_of_turn=chat.end_of_turn,
                **template_kwargs,
            )
        except ToolError as exc:
            raise ConfigError(f"agent: {exc}") from exc
        settings = MultiTurnSpec(engine, chat, self._executor(), spec.max_tool_calling_iterations, spec.parser)
        self.engine: MultiTurnEngine = get_engine(tool_engine).build(None, settings)
        self.sessions: list = []
        self.closed = False

    def use_engine(self, tool_engine: str, base: Any) -> None:
        """Run the rounds with the internal engine ``tool_engine`` over ``base`` from now on (the same chat, tool
        executor, parser and rounds): transformers' generate for a GRPOTrainer whose model's generate was replaced."""
        old = self.engine
        settings = MultiTurnSpec(base, old.chat, old.executor, old.max_tool_calling_iterations, old.parser)
        self.engine = get_engine(tool_engine).build(None, settings)

    def _executor(self) -> ToolExecutor:
        spec = self.spec
        return ToolExecutor(spec.tools, timeout=spec.timeout, max_workers=spec.workers, isolation=spec.isolation)

    def generate(
        self,
        rows: Sequence[Mapping[str, Any]],
        num_generations: int,
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
        images: Sequence[list] | None = None,
    ) -> Rollouts:
        """``num_generations`` rollouts of each row's prompt, the group of row b sampled from ``seeds[b]`` (None:
        from the engine's generator); ``images``: each row's prompt images (PIL; [] or None: none), placed in its
        messages as the dataset's prompts with images are (:func:`grpokit.data.images.with_image_entries`)."""
        if self.closed:  # closed at the end of train(); a later evaluate() starts the tool workers again
            self.engine.executor, self.closed = self._executor(), False
        prompts = [row[self.prompt_column] for row in rows]
        if images is not None:
            prompts = [with_images(p, i) if i else p for p, i in zip(prompts, images)]
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


def with_images(prompt, images: list) -> list[dict]:
    """Chat messages whose ``{"type": "image"}`` entries carry the prompt's ``images`` in order (for the processor)."""
    from grpokit.data.images import with_image_entries

    queue = iter(images)
    out = []
    for message in with_image_entries(prompt, len(images)):
        content = message.get("content")
        if isinstance(content, list):
            content = [{**c, "image": next(queue)} if c.get("type") == "image" else c for c in content]
        out.append({**message, "content": content})
    return out


def conversation_metrics(conversations: Sequence[Conversation]) -> dict[str, float]:
    """TRL's ``tools/call_frequency`` and ``tools/failure_frequency`` (:func:`grpokit.tools.tool_metrics`, from each
    rollout's tool turns) and ``tools/rounds``, the mean rounds of tool calls per rollout."""
    metrics = tool_metrics([[t for t in c.turns if t.role == "tool"] for c in conversations])
    metrics["tools/rounds"] = sum(c.tool_rounds for c in conversations) / max(len(conversations), 1)
    return metrics
