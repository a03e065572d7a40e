"""A vision-language run's images in its run folder, through the CLI on a tiny Qwen2-VL: each distinct image once as
RUN/images/<sha256>.png, named by the rollouts; `grpokit inspect` prints each image's hash and size; the report's
Groups view shows a thumbnail beside each prompt, linked relative to the page; a run killed with SIGKILL after its
second checkpoint and resumed holds the same images, rows and completions as the straight run."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml
from PIL import Image

from grpokit.cli import main
from grpokit.store.images import png_bytes

pytestmark = pytest.mark.usefixtures("one_thread")
COLOURS = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255), "white": (250, 250, 250)}
WORDS = [*COLOURS, "colour", "?"]
STEPS = 4
COMPARED = ("loss", "reward", "grad_norm", "entropy")


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    path = tmp_path_factory.mktemp("tiny-qwen2-vl")
    build_tiny_qwen2_vl(path, words=WORDS, image_side=28)
    return path


def run_config(tmp_path, vlm_dir, name: str) -> str:
    """A 4-step run of 2 prompts x 4 completions a step over 5 rows: four one-image rows of different sizes and
    colours, and one with two images, so new images appear at later steps and some come back."""
    rows = []
    for k, (colour, rgb) in enumerate(COLOURS.items()):
        Image.new("RGB", (20 + 4 * k, 24), rgb).save(tmp_path / f"{colour}.png")
        rows.append({"prompt": "colour ?", "images": [str(tmp_path / f"{colour}.png")], "answer": colour})
    rows.append(
        {"prompt": "colour ?", "images": [str(tmp_path / "red.png"), str(tmp_path / "blue.png")], "answer": "red"}
    )
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rewards.py").write_text(
        "def colour(completions, answer, **kw):\n"
        "    return [float(a in c.split()) for c, a in zip(completions, answer)]\n"
    )
    config = {
        "model": {"model_name_or_path": str(vlm_dir)},
        "data": {"train_dataset": str(tmp_path / "train.jsonl")},
        "algo": {"num_generations": 4, "beta": 0.0},
        "generation": {"max_completion_length": 3},
        "optim": {"per_device_train_batch_size": 8, "max_steps": STEPS, "learning_rate": 1e-2},
        "run": {"output_dir": str(tmp_path / name), "report_to": ["jsonl"], "progress_bar": False, "save_steps": 1},
        "rewards": [f"{tmp_path / 'rewards.py'}:colour"],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def stored(run) -> tuple:
    """(rollouts with their images, the images table, the images folder: name -> sha256 of the bytes)."""
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        rollouts = db.execute(
            "SELECT step, prompt_index, completion_index, completion, images FROM rollouts ORDER BY 1, 2, 3"
        ).fetchall()
        images = db.execute("SELECT sha256, step, bytes, width, height, stored FROM images ORDER BY 1").fetchall()
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (run / "images").iterdir()}
    return rollouts, images, files


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_images_stored_once_inspected_reported_and_resumed_exactly(tmp_path, vlm_dir, capsys):
    straight = run_config(tmp_path, vlm_dir, "straight")
    assert main(["train", straight]) == 0
    run = tmp_path / "straight"
    rollouts, images, files = stored(run)
    expected = {
        c: hashlib.sha256(png_bytes(Image.open(tmp_path / f"{c}.png").convert("RGB"))).hexdigest() for c in COLOURS
    }
    named = {sha for *_, column in rollouts for sha in json.loads(column)}
    assert all(json.loads(column) for *_, column in rollouts)  # every prompt has images: every rollout names them
    # 5 rows, 2 a step for 4 steps: every row is drawn; the two-image row shows red and blue again
    assert named == set(expected.values())
    assert [expected["red"], expected["blue"]] in [json.loads(column) for *_, column in rollouts]  # in its order
    assert {sha for sha, *_ in images} == named  # each distinct image one row ...
    assert files == {f"{sha}.png": sha for sha in named}  # ... and one file whose bytes hash to its name
    assert all(stored_flag == 1 for *_, stored_flag in images)  # under the default cap

    capsys.readouterr()
    assert main(["inspect", str(run), "--step", "1"]) == 0
    shown = capsys.readouterr().out
    sizes = {sha: size for sha, _, size, *_ in images}
    step_one = {sha for step, *_, column in rollouts if step == 1 for sha in json.loads(column)}
    for sha in step_one:
        assert f"sha256 {sha} · {sizes[sha]} bytes" in shown, shown

    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    for sha in step_one:
        assert f'<img src="images/{sha}.png"' in page
    other = tmp_path / "pages" / "r.html"
    other.parent.mkdir()
    assert main(["report", str(run), "--output", str(other)]) == 0
    link = f"../straight/images/{next(iter(step_one))}.png"
    assert f'src="{link}"' in other.read_text() and (other.parent / link).is_file()

    killed = run_config(tmp_path, vlm_dir, "killed")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    with (tmp_path / "killed.log").open("w") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "grpokit.cli", "train", killed], env=env, stdout=log, stderr=log
        )
        second = tmp_path / "killed" / "checkpoints" / "step-2"
        while not second.exists() and child.poll() is None:  # the kill lands anywhere after the second checkpoint
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert second.exists(), (tmp_path / "killed.log").read_text()[-3000:]
    assert main(["train", killed, "resume_from=latest"]) == 0
    a, b = metrics(run), metrics(tmp_path / "killed")
    assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(1, STEPS + 1))
    for x, y in zip(a, b):
        for key in COMPARED:
            assert x[key] == pytest.approx(y[key], abs=1e-6), (x["step"], key)
    assert stored(tmp_path / "killed") == (rollouts, images, files)  # rows, image rows and files alike
