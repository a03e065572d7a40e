"""The task: the colour of a square in a generated picture. Only the image can answer it: every prompt has the same
text, and the six colours are equally frequent in every split.

A picture is ``SIDE`` x ``SIDE`` pixels: a light, noisy background and one square (side 14 to 30 pixels, anywhere
in the picture) of one of :data:`COLOURS`, its shade jittered. Pictures are drawn with numpy from a seeded
generator, so a split is the same every time. A *blank* picture (the control) is uniform grey: the same for every
prompt.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

SIDE = 28  # 2 x 2 patches of 14 pixels: one image token after Qwen2-VL's 2 x 2 merge
COLOURS = {
    "red": (220, 30, 30),
    "green": (40, 170, 40),
    "blue": (30, 50, 220),
    "yellow": (225, 205, 30),
    "purple": (160, 40, 190),
    "cyan": (30, 200, 210),
}
NAMES = list(COLOURS)
QUESTION = "colour ?"
WORDS = [*NAMES, *QUESTION.split(), "user", "assistant"]  # the roles: the chat template writes them
BLANK_GREY = 128


def next_colour(name: str) -> str:
    """The sloppy teacher's habit: the colour after ``name`` in :data:`NAMES` (red -> green, ..., cyan -> red)."""
    return NAMES[(NAMES.index(name) + 1) % len(NAMES)]


def draw(rng: np.random.Generator, colour: str) -> Image.Image:
    """A picture of one ``colour`` square on a light grey, noisy background."""
    background = rng.integers(190, 256)  # a light grey, the same in every channel: no tint to confuse with a colour
    image = np.clip(background + rng.normal(0, 4, size=(SIDE, SIDE, 3)), 0, 255)
    size = int(rng.integers(12, 21))
    top, left = (int(v) for v in rng.integers(0, SIDE - size + 1, size=2))
    shade = np.clip(np.array(COLOURS[colour]) + rng.integers(-20, 21, size=3), 0, 255)
    image[top : top + size, left : left + size] = shade
    return Image.fromarray(image.astype(np.uint8))


def blank() -> Image.Image:
    """The control's picture: uniform grey, no square."""
    return Image.new("RGB", (SIDE, SIDE), (BLANK_GREY,) * 3)


def pictures(count: int, seed: int) -> list[tuple[Image.Image, str]]:
    """``count`` (picture, colour name) pairs, the colours balanced (``count / 6`` each, in a shuffled order)."""
    rng = np.random.default_rng(seed)
    names = [NAMES[i % len(NAMES)] for i in range(count)]
    rng.shuffle(names)
    return [(draw(rng, name), name) for name in names]
