"""A vision-language run's images beyond the Groups view, through the CLI on a tiny Qwen2-VL: the evaluation's
prompts' images stored once by content like training's (an eval-only image too), named by each eval_prompts row;
`grpokit report`'s best-and-worst samples, Tokens and Held-out prompts views drawing them as thumbnails linked
relative to the page; the console's completions table naming each image `[image <hash> <w>x<h>]`; and a run resumed
from its step-1 checkpoint holding the same image rows and evaluations. (That a step's evaluation adding image rows
leaves the step's digest as its checkpoint recorded it is tests/unit/test_eval_images.py's: here the evaluation before
training shows every evaluation image first, at step 0, which no digest covers.)"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3

import pytest
import yaml
from PIL import Image

from grpokit.cli import main
from grpokit.store.images import png_bytes

pytestmark = pytest.mark.usefixtures("one_thread")
COLOURS = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255), "yellow": (250, 250, 0)}
WORDS = [*COLOURS, "colour", "?"]


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    path = tmp_path_factory.mktemp("tiny-qwen2-vl")
    build_tiny_qwen2_vl(path, words=WORDS, image_side=28)
    return path


def sha_of(path) -> str:
    return hashlib.sha256(png_bytes(Image.open(path).convert("RGB"))).hexdigest()


def write_run(tmp_path, vlm_dir, steps: int) -> str:
    """Training on red, green and blue pictures; evaluation on yellow (seen only there) and red (seen by both)."""
    for k, (colour, rgb) in enumerate(COLOURS.items()):
        Image.new("RGB", (20 + 4 * k, 24), rgb).save(tmp_path / f"{colour}.png")
    row = lambda c: {"prompt": "colour ?", "images": [str(tmp_path / f"{c}.png")], "answer": c}
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row(c)) + "\n" for c in ("red", "green", "blue")))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(row(c)) + "\n" for c in ("yellow", "red")))
    (tmp_path / "rewards.py").write_text(
        "def colour(completions, answer, **kw):\n"
        "    return [float(a in c.split()) for c, a in zip(completions, answer)]\n"
    )
    config = {
        "model_name_or_path": str(vlm_dir),
        "train_dataset": str(tmp_path / "train.jsonl"),
        "eval_dataset": str(tmp_path / "eval.jsonl"),
        "eval_steps": 1,
        "num_generations_eval": 2,
        "pass_at_k": [1],
        "num_generations": 4,
        "beta": 0.0,
        "max_completion_length": 3,
        "per_device_train_batch_size": 8,
        "max_steps": steps,
        "learning_rate": 1e-2,
        "save_steps": 1,
        "output_dir": str(tmp_path / "run"),
        "report_to": ["jsonl"],
        "progress_bar": False,
        "logging_steps": 1,
        "log_completions": True,
        "num_completions_to_print": 8,
        "store_token_values": ["all"],
        "rewards": [f"{tmp_path / 'rewards.py'}:colour"],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_eval_images_stored_and_every_view_shows_images(tmp_path, vlm_dir, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich lays the console's table out this wide: one line per cell
    assert main(["train", write_run(tmp_path, vlm_dir, steps=2)]) == 0
    console = capsys.readouterr().err
    run, sha = tmp_path / "run", {c: sha_of(tmp_path / f"{c}.png") for c in COLOURS}
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        images = {s: (step, e, st) for s, step, e, st in db.execute("SELECT sha256, step, eval, stored FROM images")}
        evals = db.execute("SELECT step, prompt_index, images FROM eval_prompts ORDER BY 1, 2").fetchall()
    # the evaluation before training (step 0) shows yellow and red first; training then shows green and blue
    assert images[sha["yellow"]] == (0, 1, 1) and images[sha["red"]] == (0, 1, 1)
    assert {images[sha[c]][:2] for c in ("green", "blue")} <= {(1, 0), (2, 0)}
    assert sorted(p.name for p in (run / "images").iterdir()) == sorted(f"{s}.png" for s in sha.values())
    assert [s for s, *_ in evals] == [0, 0, 1, 1, 2, 2]  # before training and after each step
    assert {json.loads(h)[0] for _, i, h in evals if i == 0} == {sha["yellow"]}  # each row names its image
    assert {json.loads(h)[0] for _, i, h in evals if i == 1} == {sha["red"]}

    # the console's table: each prompt's image as [image <6 hex> <w>x<h>] where the template put it
    tags = set(re.findall(r"\[image ([0-9a-f]{6}) (\d+x\d+)\]", console))
    assert tags and tags <= {(sha[c][:6], f"{20 + 4 * k}x24") for k, c in enumerate(COLOURS)}, console[-3000:]
    assert "<|image_pad|>" not in console

    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    views = {name: page[page.index(f'<section id="{name}"') :] for name in ("samples", "tokens", "heldout")}
    for name, view in views.items():
        view = view[: view.index("</section>")]
        linked = set(re.findall(r'<img src="images/([0-9a-f]{64})\.png"', view))
        assert linked, name
        assert all((run / "images" / f"{s}.png").is_file() for s in linked)
    assert f'src="images/{sha["yellow"]}.png"' in views["heldout"]  # the eval-only picture

    # a resume from the checkpoint of step 1 (after its evaluation) redoes step 2 and its evaluation alike
    assert main(["train", str(tmp_path / "config.yaml"), f"resume_from={run / 'checkpoints' / 'step-1'}"]) == 0
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        again = {s: (step, e, st) for s, step, e, st in db.execute("SELECT sha256, step, eval, stored FROM images")}
        steps = [s for (s,) in db.execute("SELECT step FROM eval_prompts ORDER BY step")]
    assert again == images and steps == [0, 0, 1, 1, 2, 2]
