"""A tool that returns an image (TRL's multimodal tool response: content parts with an image) ends the run in one
line, in every isolation and in the multi-turn engine, instead of its repr reaching the model as text (the image
dropped, a memory address in the conversation): grpokit's tool rollouts do not carry images yet (docs/vision.md)."""

from __future__ import annotations

import pytest
from PIL import Image
from shared_helpers import sampling_params
from test_multiturn import chat, multiply, scripted_engine, tool_call  # noqa: F401 (chat: the fixture)

from grpokit.errors import ConfigError
from grpokit.tools import ToolCall, ToolExecutor
from grpokit.tools.executor import shows_images

pytestmark = pytest.mark.usefixtures("one_thread")
REFUSED = "tool 'screenshot' returned an image; grpokit's tool rollouts cannot show a tool's image to the model yet"


def screenshot() -> list:
    """Takes a screenshot and returns it (TRL's test_train_with_tools_multimodal_response)."""
    return [{"type": "image", "image": Image.new("RGB", (64, 64), "red")}, {"type": "text", "text": "Here it is"}]


def test_which_return_values_hold_images():
    red = Image.new("RGB", (2, 2), "red")
    assert shows_images(red) and shows_images(screenshot()) and shows_images(({"type": "image_url", "url": "x"},))
    assert not shows_images("text") and not shows_images([{"type": "text", "text": "a"}]) and not shows_images(3)
    assert not shows_images({"image": "a key, not a content part"})


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_tool_returning_an_image_is_refused_in_one_line(isolation):
    with ToolExecutor([screenshot, multiply], isolation=isolation) as executor:
        fine = executor.submit([ToolCall("multiply", {"a": 2, "b": 3}, "<call multiply>", 0, 0)]).result()
        assert fine[0].content == "6"  # other tools of the same executor answer as before
        with pytest.raises(ConfigError) as refused:
            executor.submit([ToolCall("screenshot", {}, "<call screenshot>", 0, 0)]).result()
    assert str(refused.value).startswith(REFUSED) and "\n" not in str(refused.value)


def test_the_multi_turn_engine_stops_on_a_tool_image(chat):  # noqa: F811
    scripts = {"0": [tool_call("screenshot", "{}"), "done<|im_end|>"], "1": [tool_call("multiply", '{"a": 1, "b": 2}')]}
    prompts = [[{"role": "user", "content": f"Q{k}"}] for k in scripts]
    executor = ToolExecutor([screenshot, multiply], isolation="thread")
    with executor, pytest.raises(ConfigError, match="returned an image"):
        scripted_engine(chat, scripts, executor).generate(prompts, 2, sampling_params(max_completion_length=300))
