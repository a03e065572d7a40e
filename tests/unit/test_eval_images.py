"""Evaluation prompts' images in the store (kept as training's: once per image, by content, named by each
``eval_prompts`` row, their rows marked ``eval`` 1 so no step's digest changes after the step was written); the
console's completions table naming each image ``[image <hash> <w>x<h>]``; the report's best-and-worst, Tokens and
Held-out views drawing thumbnails, escaped and relative to the page."""

from __future__ import annotations

import hashlib
import sqlite3
from types import SimpleNamespace

from PIL import Image

from grpokit.store import RolloutRecord, RolloutStore
from grpokit.store.heldout import eval_prompts, heldout_html
from grpokit.store.images import png_bytes
from grpokit.store.integrity import chain_through
from grpokit.store.samples import best_and_worst, samples_html
from grpokit.store.thumbs import known_images
from grpokit.train.completions_table import console_prompt, image_tag

RED, BLUE, GREEN = (Image.new("RGB", (8, 6), c) for c in [(255, 0, 0), (0, 0, 255), (0, 200, 0)])


def sha(image) -> str:
    return hashlib.sha256(png_bytes(image)).hexdigest()


def record(images: list, completion_index: int = 0, reward: float = 1.0) -> RolloutRecord:
    return RolloutRecord(
        prompt_index=0, completion_index=completion_index, prompt="colour ?", completion="red", prompt_tokens=3,
        completion_tokens=1, finish_reason="stop", rewards={"r": reward}, reward=reward, advantage=0.0,
        policy_version=0, images=[sha(i) for i in images] or None, image_sources=list(images) or None,
    )  # fmt: skip


def evaluated(index: int, images: list) -> dict:
    """An ``Evaluation.per_prompt`` entry as the evaluator builds it for a prompt with ``images``."""
    found = {"images": [sha(i) for i in images], "image_sources": list(images)} if images else {}
    return {"prompt_index": index, "prompt": "colour ?", "correct": 1, "samples": 2, "mean_reward": 0.5} | found


def image_rows(run) -> list[tuple]:
    with sqlite3.connect(run / "rollouts.sqlite") as conn:
        return conn.execute("SELECT sha256, step, eval, stored FROM images ORDER BY step, sha256").fetchall()


def test_eval_images_are_stored_once_named_by_their_prompts_and_leave_the_step_digest(tmp_path):
    with RolloutStore(tmp_path, run_id="r") as store:
        store.write_step(1, [record([RED])], {"loss": 1.0})
        before = store.step_digest(1)
        # RED was shown by training: no second row; BLUE and GREEN are new: eval rows at the eval's step
        store.write_eval(1, "eval", {"eval/pass@1": 0.5}, [evaluated(0, [RED, BLUE]), evaluated(1, [GREEN])])
        store.write_eval(1, "other", {"eval/pass@1": 0.5}, [evaluated(0, [BLUE]), evaluated(1, [])])
        assert store.step_digest(1) == before  # the checkpoint of step 1 records the digest taken before its eval
        data = eval_prompts(store)
    assert image_rows(tmp_path) == sorted([(sha(RED), 1, 0, 1), (sha(BLUE), 1, 1, 1), (sha(GREEN), 1, 1, 1)])
    files = sorted(p.name for p in (tmp_path / "images").iterdir())
    assert files == sorted(f"{sha(i)}.png" for i in (RED, BLUE, GREEN))
    assert data["eval"]["prompts"][0]["images"] == [sha(RED), sha(BLUE)]  # the prompt's order
    assert data["other"]["prompts"][1]["images"] is None  # a text prompt
    with sqlite3.connect(tmp_path / "rollouts.sqlite") as conn:
        joined = conn.execute(
            "SELECT p.dataset, p.prompt_index, i.sha256 FROM eval_prompts p, json_each(p.images) j "
            "JOIN images i ON i.sha256 = j.value ORDER BY 1, 2, j.key"
        ).fetchall()
    assert joined == [
        ("eval", 0, sha(RED)), ("eval", 0, sha(BLUE)), ("eval", 1, sha(GREEN)), ("other", 0, sha(BLUE))
    ]  # fmt: skip
    # the same through `grpokit inspect --sql`'s read-only connection (json_each on a fresh one: docs/vision.md)
    with RolloutStore(tmp_path, readonly=True) as store:
        _, rows = store.query(
            "SELECT p.dataset, p.prompt_index, i.sha256 FROM eval_prompts p, json_each(p.images) j "
            "JOIN images i ON i.sha256 = j.value ORDER BY 1, 2, j.key"
        )
        assert rows == joined
        assert store.query("SELECT count(*) FROM rollouts r, json_each(r.images) j")[1] == [(1,)]


def test_a_rollback_removes_the_images_only_a_later_evaluation_showed(tmp_path):
    with RolloutStore(tmp_path, run_id="r") as store:
        store.write_step(1, [record([RED])], {})
        store.write_eval(1, "eval", {}, [evaluated(0, [BLUE])])
        store.write_step(2, [record([RED])], {})
        store.write_eval(2, "eval", {}, [evaluated(0, [BLUE]), evaluated(1, [GREEN])])
        chain = chain_through(store._conn, 1, 2)
        store.rollback_after(1)  # a resume from checkpoint 1: step 2's evaluation goes, and GREEN with it
        assert store.images([sha(GREEN)]) == {} and set(store.images([sha(RED), sha(BLUE)])) == {sha(RED), sha(BLUE)}
        store.write_step(2, [record([RED])], {})  # the resumed run writes step 2 again: the same chain
        assert chain_through(store._conn, 1, 2) == chain
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == sorted(f"{sha(i)}.png" for i in (RED, BLUE))


def test_a_store_written_before_eval_images_gets_the_columns_and_digests_as_before(tmp_path):
    with RolloutStore(tmp_path, run_id="r") as store:
        store.write_step(1, [record([RED])], {})
        chain = chain_through(store._conn, 1, 1)
    with sqlite3.connect(tmp_path / "rollouts.sqlite") as conn:  # as the stores before this change were
        conn.execute("ALTER TABLE images DROP COLUMN eval")
        conn.execute("ALTER TABLE eval_prompts DROP COLUMN images")
        conn.execute("INSERT INTO eval_prompts VALUES (1, 'eval', 0, 'p', 1, 2, 0.5)")
    with RolloutStore(tmp_path, readonly=True) as store:  # read as it is
        assert eval_prompts(store)["eval"]["prompts"][0]["images"] is None
        assert chain_through(store._conn, 1, 1) == chain
    with RolloutStore(tmp_path) as store:  # opened for writing: the columns added
        assert chain_through(store._conn, 1, 1) == chain
        store.write_eval(2, "eval", {}, [evaluated(0, [BLUE])])
    assert image_rows(tmp_path) == sorted([(sha(RED), 1, 0, 1), (sha(BLUE), 2, 1, 1)], key=lambda r: (r[1], r[0]))


def test_console_prompt_puts_each_images_tag_where_its_placeholder_was():
    qwen = (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|> a <|vision_start|><|image_pad|><|vision_end|> b"
    )
    two = SimpleNamespace(prompt=qwen, images=[sha(RED), sha(BLUE)], image_sources=[RED, Image.new("RGB", (28, 14))])
    assert console_prompt(two) == (
        f"<|im_start|>user\n[image {sha(RED)[:6]} 8x6] a [image {sha(BLUE)[:6]} 28x14] b"
    )  # the prompt's order; width x height
    llava = SimpleNamespace(prompt="USER: <image>\nwhat colour?", images=[sha(RED)], image_sources=[RED])
    assert console_prompt(llava) == f"USER: [image {sha(RED)[:6]} 8x6]\nwhat colour?"
    # placeholders that are not one per image (a template of its own): the tags go first, the text as it is
    odd = SimpleNamespace(prompt="look: <image> <image>", images=[sha(RED)], image_sources=None)
    assert console_prompt(odd) == f"[image {sha(RED)[:6]}] look: <image> <image>"
    text = SimpleNamespace(prompt="[bold]2+2[/bold]", images=None, image_sources=None)
    assert console_prompt(text) == "[bold]2+2[/bold]"
    assert image_tag("3f2a9c" + "0" * 58, Image.new("RGB", (28, 28))) == "[image 3f2a9c 28x28]"


def test_the_report_views_draw_escaped_relative_thumbnails(tmp_path):
    run = tmp_path / "run"
    with RolloutStore(run, run_id="r") as store:
        store.write_step(1, [record([RED], 0, 1.0), record([RED], 1, 0.0)], {})
        store.write_eval(1, "eval", {}, [evaluated(0, [BLUE]), {**evaluated(1, []), "images": ['x" onerror="a(1)']}])
    with RolloutStore(run, readonly=True) as store:
        chosen = best_and_worst(store, [1])
        known = known_images(store, [chosen[0][k]["images"] for k in ("best", "worst")])
        samples = samples_html(chosen, "../run/images", known)
        held = heldout_html(eval_prompts(store), "../run/images", store)
    assert samples.count(f'<img src="../run/images/{sha(RED)}.png"') == 2  # the best and the worst
    assert f'<img src="../run/images/{sha(BLUE)}.png"' in held
    assert "onerror=" not in held.replace("&quot; onerror=&quot;", "")  # the hand-edited hash stays text
    assert "image 1 not stored (x&quot; onerror=&quot;)" in held
    assert "http" not in samples + held  # nothing from the network


def test_known_images_looks_up_more_hashes_than_one_statement_may_name(tmp_path):
    with RolloutStore(tmp_path, run_id="r") as store:
        store.write_step(1, [record([RED])], {})
        store._conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)  # an SQLite before 3.32's limit
        many = [[f"{n:064x}"] for n in range(2500)] + [[sha(RED)], None, ["not a hash", 3]]
        assert list(known_images(store, many)) == [sha(RED)]
