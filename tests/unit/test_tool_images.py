"""A tool that returns an image (TRL's multimodal tool response: content parts with an image, or a bare PIL image):
the executor carries its images as content parts of the tool message, in every isolation; a text-only model (no
processor) ends the run in one line naming the fix instead of the image's repr reaching the model as text; an image
by URL is refused in one line (grpokit downloads nothing)."""

from __future__ import annotations

import pytest
from PIL import Image
from shared_helpers import sampling_params
from test_multiturn import chat, multiply, scripted_engine, tool_call  # noqa: F401 (chat: the fixture)

from grpokit.errors import ConfigError
from grpokit.tools import ToolCall, ToolExecutor
from grpokit.tools.tool_images import shows_images

pytestmark = pytest.mark.usefixtures("one_thread")
NO_PROCESSOR = "tool 'screenshot' returned an image, but the model has no image processor to show it"


def screenshot() -> list:
    """Takes a screenshot and returns it (TRL's test_train_with_tools_multimodal_response)."""
    return [{"type": "image", "image": Image.new("RGB", (64, 64), "red")}, {"type": "text", "text": "Here it is"}]


def photo():
    """Returns a bare PIL image."""
    return Image.new("RGBA", (8, 4), "blue")


def link() -> list:
    """Returns an image by URL."""
    return [{"type": "image_url", "image_url": "https://example.com/a.png"}]


def test_which_return_values_hold_images():
    red = Image.new("RGB", (2, 2), "red")
    assert shows_images(red) and shows_images(screenshot()) and shows_images(({"type": "image_url", "url": "x"},))
    assert not shows_images("text") and not shows_images([{"type": "text", "text": "a"}]) and not shows_images(3)
    assert not shows_images({"image": "a key, not a content part"})


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_tool_returning_images_gives_content_parts(isolation):
    calls = [ToolCall(name, {}, f"<call {name}>", 0, 0) for name in ("screenshot", "photo", "multiply")]
    calls[2] = ToolCall("multiply", {"a": 2, "b": 3}, "<call multiply>", 0, 0)
    with ToolExecutor([screenshot, photo, multiply, link], isolation=isolation) as executor:
        shot, bare, fine = executor.submit(calls).result()
        with pytest.raises(ConfigError) as refused:
            executor.submit([ToolCall("link", {}, "<call link>", 0, 0)]).result()
    assert fine.content == "6" and fine.parts is None and fine.message()["content"] == "6"
    assert shot.content == "Here it is" and [p["type"] for p in shot.parts] == ["image", "text"]
    assert shot.images[0].size == (64, 64) and shot.images[0].getpixel((0, 0)) == (255, 0, 0)
    assert shot.message()["content"][1] == {"type": "text", "text": "Here it is"}
    assert bare.content == "" and bare.images[0].mode == "RGB" and bare.images[0].size == (8, 4)
    message = str(refused.value)
    assert "'link' returned an image, but its 'image_url' part holds no PIL image" in message and "\n" not in message


def test_a_model_without_a_processor_stops_on_a_tool_image_in_one_line(chat):  # noqa: F811
    scripts = {"0": [tool_call("screenshot", "{}"), "done<|im_end|>"], "1": [tool_call("multiply", '{"a": 1, "b": 2}')]}
    prompts = [[{"role": "user", "content": f"Q{k}"}] for k in scripts]
    executor = ToolExecutor([screenshot, multiply], isolation="thread")
    with executor, pytest.raises(ConfigError) as refused:
        scripted_engine(chat, scripts, executor).generate(prompts, 2, sampling_params(max_completion_length=300))
    assert str(refused.value).startswith(NO_PROCESSOR) and "processing_class=AutoProcessor" in str(refused.value)
