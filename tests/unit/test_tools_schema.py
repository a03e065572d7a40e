"""Tool schemas from plain functions (transformers' get_json_schema) and argument checks against them."""

from __future__ import annotations

from typing import Literal

import pytest

from grpokit.tools import ToolError, check_arguments, tool_schema, tool_schemas


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def search(
    query: str, limit: int | None = None, tags: list[str] | None = None, mode: Literal["fast", "exact"] = "fast"
):
    """Search the notes.

    Args:
        query: What to look for.
        limit: At most this many hits.
        tags: Only notes with these tags.
        mode: How to match.
    """


def test_schema_of_a_function_is_transformers_own():
    schema = tool_schema(multiply)
    assert schema == {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first factor."},
                    "b": {"type": "integer", "description": "The second factor."},
                },
                "required": ["a", "b"],
            },
            "return": {"type": "integer"},
        },
    }


def test_schema_of_a_bound_method_leaves_self_out():
    class Env:
        def move(self, steps: int) -> str:
            """Move forward.

            Args:
                steps: How far.
            """
            return "ok"

    schema = tool_schema(Env().move)
    assert schema["function"]["name"] == "move"
    assert list(schema["function"]["parameters"]["properties"]) == ["steps"]


def no_docstring(x: int) -> int:
    return x


def no_hint(x):
    """Echo.

    Args:
        x: A value.
    """
    return x


def undocumented_argument(x: int, y: int) -> int:
    """Add.

    Args:
        x: A value.
    """
    return x + y


@pytest.mark.parametrize(
    ("fn", "problem"),
    [
        (no_docstring, "no docstring"),
        (no_hint, "missing a type hint"),
        (undocumented_argument, "y"),
        (lambda x: x, "no docstring"),
    ],
)
def test_unconvertible_function_names_itself_and_the_fix(fn, problem):
    with pytest.raises(ToolError) as info:
        tool_schema(fn)
    message = str(info.value)
    assert fn.__qualname__ in message
    assert problem in message
    assert "type hint" in message and "Args:" in message  # the fix


def test_not_callable_is_refused():
    with pytest.raises(ToolError, match="must be a function"):
        tool_schema("multiply")


def test_duplicate_names_are_refused():
    def other():
        """Nothing.

        Args:
        """

    other.__name__ = "multiply"
    with pytest.raises(ToolError, match="two tools are named 'multiply'"):
        tool_schemas([multiply, other])


def test_check_arguments():
    schema = tool_schema(search)
    assert check_arguments(schema, {"query": "x"}) is None
    assert check_arguments(schema, {"query": "x", "limit": None, "tags": ["a"], "mode": "exact"}) is None
    assert check_arguments(schema, {}) == "missing required argument 'query'"
    assert check_arguments(tool_schema(multiply), {}) == "missing required arguments 'a', 'b'"
    assert check_arguments(schema, {"query": "x", "page": 2}) == (
        "unknown argument 'page' (it takes 'query', 'limit', 'tags', 'mode')"
    )
    assert check_arguments(schema, {"query": 3}) == "argument 'query' must be string, got int 3"
    assert check_arguments(schema, {"query": "x", "limit": "5"}) == "argument 'limit' must be integer, got str '5'"
    assert check_arguments(schema, {"query": "x", "limit": True}) == "argument 'limit' must be integer, got bool True"
    assert (
        check_arguments(schema, {"query": "x", "tags": ["a", 1]}) == "argument 'tags' item 1 must be string, got int 1"
    )
    assert (
        check_arguments(schema, {"query": "x", "mode": "slow"})
        == "argument 'mode' must be one of ['fast', 'exact'], got 'slow'"
    )


def test_number_takes_an_int_but_not_a_bool():
    def scale(x: float) -> float:
        """Scale.

        Args:
            x: A number.
        """
        return x

    schema = tool_schema(scale)
    assert check_arguments(schema, {"x": 2}) is None
    assert check_arguments(schema, {"x": 2.5}) is None
    assert check_arguments(schema, {"x": False}) == "argument 'x' must be number, got bool False"
