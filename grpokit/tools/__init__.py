"""Tools and environments for multi-turn rollouts (schemas, tool-call parsing, isolated execution,
environments, conversation tokens and loss masks, the loop's bookkeeping). grpokit.rollout.multiturn
generates rollouts with them, grpokit.train.experience.tool_rollouts trains on them: see docs/tools.md."""

from grpokit.tools.conversation import (
    ConversationTokens,
    TokenConversation,
    end_of_turn_id,
    render_ids,
    tool_suffix_ids,
)
from grpokit.tools.environment import (
    EnvironmentFactory,
    EnvironmentPool,
    Environments,
    EnvironmentSession,
    environment_tools,
    with_observation,
)
from grpokit.tools.executor import STATUSES, ToolExecutor, ToolResult, tool_metrics
from grpokit.tools.json_schema import ToolError, check_arguments, tool_schema, tool_schemas
from grpokit.tools.loop import ToolLoop, ToolRollout
from grpokit.tools.parsing import (
    ToolCall,
    ToolParser,
    assistant_message,
    get_tool_parser,
    parse_tool_calls,
    register_tool_parser,
    tool_parser_for,
    tool_parser_names,
    validate_calls,
)

__all__ = [
    "STATUSES",
    "ConversationTokens",
    "EnvironmentFactory",
    "EnvironmentPool",
    "EnvironmentSession",
    "Environments",
    "TokenConversation",
    "ToolCall",
    "ToolError",
    "ToolExecutor",
    "ToolLoop",
    "ToolParser",
    "ToolResult",
    "ToolRollout",
    "assistant_message",
    "check_arguments",
    "end_of_turn_id",
    "environment_tools",
    "get_tool_parser",
    "parse_tool_calls",
    "register_tool_parser",
    "render_ids",
    "tool_metrics",
    "tool_parser_for",
    "tool_parser_names",
    "tool_schema",
    "tool_schemas",
    "tool_suffix_ids",
    "validate_calls",
    "with_observation",
]
