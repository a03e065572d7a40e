"""Environments: stateful tasks whose methods are the tools, one instance per rollout.

The contract is TRL's ``environment_factory`` (``GRPOTrainer(environment_factory=...)``):

- the factory is called with no argument and returns an instance;
- ``reset(**row)`` is called with the dataset row of the rollout (every column) before generation
  and returns None or a string, which is appended to the last message of the prompt
  (:func:`with_observation`);
- every public method defined on the class other than ``reset`` and ``get_reward`` is a tool, and
  needs a type hint per argument and a Google-style docstring, as plain tools do;
- an optional ``get_reward()`` scores the finished rollout from the environment's state.

Instances are reused from batch to batch, as TRL does ("construct once, reset often"): an
:class:`EnvironmentPool` hands out one per rollout and makes more only when a batch needs more;
:class:`Environments` takes TRL's ``{name: factory}`` form too.

Isolation. An environment's state lives in this process: the reward functions read it (TRL passes
the instances to them as ``environments``), so its methods cannot run in a throwaway process the
way plain tools do. They run on a thread of this process with the same timeout
(:class:`grpokit.tools.executor.ToolExecutor`); a thread cannot be killed, so a call past its
timeout is abandoned and its instance is marked broken (``EnvironmentSession.broken``): later calls
on it return an error without running, its reward is None, and the pool never hands it out again.
A method that holds the GIL (a C extension, a catastrophic regex) stalls the whole process until it
returns, which only a worker process per environment could prevent.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpokit.tools.json_schema import ToolError, tool_schemas

EnvironmentFactory = Callable[[], Any]

_NOT_TOOLS = ("reset", "get_reward")
_SCHEMAS: weakref.WeakKeyDictionary[type, list[dict[str, Any]]] = weakref.WeakKeyDictionary()  # per class


def environment_tools(instance: Any) -> list[Callable]:
    """The tools of an environment instance: its public methods (listed on the class, as TRL does, so
    properties are not evaluated), bound to the instance, except ``reset`` and ``get_reward``."""
    names = [
        name
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if not name.startswith("_") and name not in _NOT_TOOLS
    ]
    return [getattr(instance, name) for name in names]


def with_observation(prompt: Sequence[Mapping[str, Any]], observation: str | None) -> list[dict[str, Any]]:
    """The prompt messages with ``reset``'s ``observation`` appended to the last message's content
    (TRL's rule); a new list, the given messages untouched."""
    messages = [dict(m) for m in prompt]
    if observation is not None and messages:
        messages[-1]["content"] = f"{messages[-1].get('content') or ''}{observation}"
    return messages


class EnvironmentSession:
    """One environment instance serving one rollout: its ``tools`` by name and their ``schemas``,
    the ``observation`` its ``reset`` returned, and ``broken`` (why it must not be used any more, or
    None). The executor runs its calls one at a time, in order."""

    def __init__(self, instance: Any, observation: str | None = None):
        self.instance = instance
        methods = environment_tools(instance)
        cls = type(instance)
        if cls not in _SCHEMAS:
            _SCHEMAS[cls] = tool_schemas(methods)
        self.schemas = _SCHEMAS[cls]
        self.tools: dict[str, Callable] = {s["function"]["name"]: m for s, m in zip(self.schemas, methods)}
        self.observation = observation
        self.broken: str | None = None

    def get_reward(self) -> float | None:
        """The environment's own reward of the rollout (``get_reward()``), None when it defines none
        or is broken."""
        if self.broken is not None or not callable(getattr(self.instance, "get_reward", None)):
            return None
        return self.instance.get_reward()


class EnvironmentPool:
    """Environment instances made by ``factory`` and reused across batches: :meth:`sessions` resets
    one per dataset row. The first instance is made at once, to check the environment and to know its
    tools' schemas before the first prompt is rendered."""

    def __init__(self, factory: EnvironmentFactory):
        if not callable(factory):
            raise ToolError(f"environment_factory must be a callable returning an environment, got {factory!r}")
        self.factory = factory
        first = self._make()
        self.schemas = EnvironmentSession(first).schemas
        self.tools = environment_tools(first)  # the tools, bound to this first instance (TRL's trainer.tools)
        self.environment_class = type(first)
        self.has_reward = callable(getattr(first, "get_reward", None))
        self._idle: list[Any] = [first]
        self._busy: list[EnvironmentSession] = []

    def _make(self) -> Any:
        instance = self.factory()
        if not callable(getattr(instance, "reset", None)):
            raise ToolError(
                f"the environment {type(instance).__name__} made by environment_factory has no reset method; "
                "define reset(self, **row) (it gets the dataset row and returns None or a string for the prompt)"
            )
        return instance

    def sessions(self, rows: Sequence[Mapping[str, Any]]) -> list[EnvironmentSession]:
        """One session per row, each reset with ``reset(**row)``. The sessions of the previous call
        are released first: their instances are reused, except broken ones, which are dropped."""
        self._idle.extend(s.instance for s in self._busy if s.broken is None)
        self._busy = []
        for row in rows:
            instance = self._idle.pop() if self._idle else self._make()
            self._busy.append(EnvironmentSession(instance, instance.reset(**row)))
        return list(self._busy)


class Environments:
    """``environment_factory`` as TRL takes it: one factory (every row uses it), or ``{name: factory}``,
    where each row names its environment in its ``environment`` column (not passed to ``reset``)."""

    def __init__(self, environment_factory: EnvironmentFactory | Mapping[str, EnvironmentFactory]):
        self.multi = isinstance(environment_factory, Mapping)
        factories = dict(environment_factory) if self.multi else {None: environment_factory}
        if not factories:
            raise ToolError("environment_factory is an empty dict; give at least one {name: factory}")
        self.pools: dict[str | None, EnvironmentPool] = {name: EnvironmentPool(f) for name, f in factories.items()}
        self.current: list[EnvironmentSession] = []  # the sessions of the last batch, in row order

    def name_of(self, row: Mapping[str, Any]) -> str | None:
        """The environment a row uses; a :class:`ToolError` naming the choices for an unknown one."""
        if not self.multi:
            return None
        name = row.get("environment")
        if name not in self.pools:
            raise ToolError(
                f"a row has environment={name!r}, which is not among the environments of environment_factory; "
                f"expected one of {list(self.pools)} in its 'environment' column"
            )
        return name

    def sessions(self, rows: Sequence[Mapping[str, Any]]) -> list[EnvironmentSession]:
        """One reset session per row, in order (the previous batch's are released)."""
        names = [self.name_of(row) for row in rows]
        by_pool: dict[str | None, list[EnvironmentSession]] = {}
        for name, pool in self.pools.items():
            chosen = [
                {k: v for k, v in row.items() if k != "environment"} if self.multi else row
                for row, n in zip(rows, names)
                if n == name
            ]
            by_pool[name] = pool.sessions(chosen)
        self.current = [by_pool[name].pop(0) for name in names]
        return list(self.current)

    def reward_functions(self) -> list[tuple[str, Callable]]:
        """(name, function) for each environment class that defines ``get_reward``: a reward function of
        TRL's contract, ``fn(environments, **kwargs)`` with the batch's instances, giving that class's
        rollouts their ``get_reward()`` (None for other classes and for broken instances; an instance from
        outside the batch is asked directly)."""
        functions, seen = [], set()
        for pool in self.pools.values():
            cls = pool.environment_class
            if not pool.has_reward or cls in seen:
                continue
            seen.add(cls)

            def get_reward(environments: Sequence[Any], _cls: type = cls, **kwargs: Any) -> list[float | None]:
                # an instance of this batch through its session (None once broken); any other, directly
                sessions = {id(s.instance): s for s in self.current}
                return [
                    None
                    if type(e) is not _cls
                    else sessions[id(e)].get_reward()
                    if id(e) in sessions
                    else e.get_reward()
                    for e in environments
                ]

            functions.append((cls.__name__, get_reward))
        return functions
