"""Tools and environments for multi-turn rollouts (schemas, tool-call parsing, isolated execution,
conversation tokens and loss masks). Not yet wired into the rollout engine or the trainer."""

from grpokit.tools.schema import ToolError, check_arguments, tool_schema, tool_schemas

__all__ = ["ToolError", "check_arguments", "tool_schema", "tool_schemas"]
