"""Tools and environments for multi-turn rollouts (schemas, tool-call parsing, isolated execution,
environments, conversation tokens and loss masks, the loop's bookkeeping). grpokit.rollout.multiturn
generates rollouts with them, grpokit.train.experience.tool_rollouts trains on them: see docs/tools.md.

The names are imported on first use, so the package's settings (``grpokit.tools.settings``) are read by the config
without loading torch."""

from grpokit.system.lazy import lazy_names

_WHERE = {
    "ConversationTokens": "conversation",
    "EnvironmentFactory": "environment",
    "EnvironmentPool": "environment",
    "EnvironmentSession": "environment",
    "Environments": "environment",
    "STATUSES": "executor",
    "TokenConversation": "conversation",
    "ToolCall": "parsing",
    "ToolError": "json_schema",
    "ToolExecutor": "executor",
    "ToolLoop": "loop",
    "ToolParser": "parsing",
    "ToolResult": "executor",
    "ToolRollout": "loop",
    "assistant_message": "parsing",
    "check_arguments": "json_schema",
    "end_of_turn_id": "conversation",
    "environment_tools": "environment",
    "get_tool_parser": "parsing",
    "parse_tool_calls": "parsing",
    "register_tool_parser": "parsing",
    "render_ids": "conversation",
    "tool_metrics": "executor",
    "tool_parser_for": "parsing",
    "tool_parser_names": "parsing",
    "tool_schema": "json_schema",
    "tool_schemas": "json_schema",
    "tool_suffix_ids": "conversation",
    "validate_calls": "parsing",
    "with_observation": "environment",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_names(__name__, _WHERE)
