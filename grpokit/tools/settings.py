"""Multi-turn tool rollouts' settings (:mod:`grpokit.tools`): the ``agent`` section, assembled from this class;
torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpokit.errors import require


@dataclass
class ToolSettings:
    """The tools and environments of multi-turn rollouts, and how their calls run."""

    tools: list = field(default_factory=list)
    """Tool functions the model may call in multi-turn rollouts: `module:function` or `path/to/file.py:function`,
    each with type hints and a Google-style docstring (GRPOTrainer(tools=[...]) takes the functions themselves)."""
    environment_factory: str | None = None
    """`module:Class` or `path/to/file.py:Class`: called with no argument, one instance per rollout, reset with the
    dataset row; its public methods are tools and reward functions get the instances as `environments`."""
    max_tool_calling_iterations: int | None = None
    """Rounds of tool calls per rollout at most (TRL's name); null = until the model answers without a call or the
    completion budget (max_completion_length, tool results included) is spent."""
    tool_parser: str = "auto"
    """How tool calls are read: auto (from the chat template) | hermes | qwen3_xml | llama3 | mistral | a registered
    name | `module:function` / `file.py:function` (text -> list of grpokit.tools.ToolCall)."""
    tool_timeout: float = 30.0
    """Seconds one tool call may take; past it the call's worker is killed and the model reads an error."""
    tool_workers: int = 4
    """Tool calls of different rollouts running at once (worker processes for plain tools)."""
    tool_isolation: str = "process"
    """process (plain tools in killable worker processes) | thread (threads of the trainer); environment methods
    always run on threads of the trainer, where the reward functions read the instances."""

    def check(self) -> None:
        for spec in self.tools:
            require(
                isinstance(spec, str) and ":" in spec,
                f"tools contains {spec!r}; each entry is 'module:function' or 'path/to/file.py:function' (pass "
                "functions themselves as GRPOTrainer(tools=[...])).",
            )
        factory, rounds = self.environment_factory, self.max_tool_calling_iterations
        require(
            factory is None or ":" in factory,
            f"environment_factory={factory!r}: give 'module:Class' or 'path/to/file.py:Class'.",
        )
        require(
            rounds is None or rounds >= 0,
            f"max_tool_calling_iterations={rounds} must be >= 0 or null (no limit).",
        )
        require(self.tool_timeout > 0, f"tool_timeout={self.tool_timeout} must be > 0 seconds.")
        require(self.tool_workers >= 1, f"tool_workers={self.tool_workers} must be >= 1.")
