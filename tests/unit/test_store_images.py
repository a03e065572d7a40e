"""The store's images (grpokit/store/images.py): each distinct image once as RUN/images/<sha256>.png, described by the
images table, named by the rollouts; the size cap and log_multimodal; a kill -9 in the middle of writing one leaves
nothing a resume trusts; the report's thumbnails link the files by a path relative to the page."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from PIL import Image

from grpokit.store import RolloutRecord, RolloutStore
from grpokit.store.groups import thumbnails
from grpokit.store.images import ImageFiles, png_bytes
from grpokit.store.integrity import chain_through
from grpokit.store.report import images_url

RED, BLUE, GREEN = (Image.new("RGB", (8, 6), c) for c in [(255, 0, 0), (0, 0, 255), (0, 200, 0)])


def sha(image) -> str:
    return hashlib.sha256(png_bytes(image)).hexdigest()


def records(prompt_images: list[list], G: int = 2) -> list[RolloutRecord]:
    """G completions for each prompt, the prompt's images on each (as rollout_records builds them)."""
    out = []
    for p, images in enumerate(prompt_images):
        for g in range(G):
            out.append(
                RolloutRecord(
                    prompt_index=p, completion_index=g, prompt="colour ?", completion="red", prompt_tokens=3,
                    completion_tokens=1, finish_reason="stop", rewards={"r": 1.0}, reward=1.0, advantage=0.0,
                    policy_version=0, images=[sha(i) for i in images] or None, image_sources=list(images) or None,
                )
            )  # fmt: skip
    return out


def table(run) -> list[tuple]:
    with sqlite3.connect(run / "rollouts.sqlite") as conn:
        return conn.execute(
            "SELECT sha256, step, bytes, width, height, stored FROM images ORDER BY step, sha256"
        ).fetchall()


def test_each_distinct_image_is_stored_once_and_named_by_its_rollouts(tmp_path):
    with RolloutStore(tmp_path, run_id="r") as store:
        store.write_step(1, records([[RED], [RED, BLUE]]), {})
        store.write_step(2, records([[BLUE], [GREEN], []]), {})  # BLUE seen at step 1: not written again
        assert store.rollouts(step=2)[0]["images"] == [sha(BLUE)] and store.rollouts(step=2)[-1]["images"] is None
        assert store.rollouts(step=1)[2]["images"] == [sha(RED), sha(BLUE)]  # the prompt's order
        known = store.images([sha(RED), sha(GREEN), "0" * 64])
    files = sorted(p.name for p in (tmp_path / "images").iterdir())
    assert files == sorted(f"{sha(i)}.png" for i in (RED, BLUE, GREEN))
    for name in files:  # each file's bytes hash to its name
        assert hashlib.sha256((tmp_path / "images" / name).read_bytes()).hexdigest() + ".png" == name
    sizes = {sha(i): len(png_bytes(i)) for i in (RED, BLUE, GREEN)}
    expected = sorted([(sha(RED), 1), (sha(BLUE), 1), (sha(GREEN), 2)], key=lambda r: (r[1], r[0]))
    assert table(tmp_path) == [(s, step, sizes[s], 8, 6, 1) for s, step in expected]
    assert (
        set(known) == {sha(RED), sha(GREEN)} and known[sha(GREEN)]["path"] == tmp_path / "images" / f"{sha(GREEN)}.png"
    )


def test_the_size_cap_and_log_multimodal_false(tmp_path):
    red, blue = len(png_bytes(RED)), len(png_bytes(BLUE))
    with RolloutStore(tmp_path / "capped", run_id="r", max_image_bytes=red + blue - 1) as store:
        store.write_step(1, records([[RED, BLUE]]), {})  # RED fits, BLUE would pass the cap: listed, not written
        store.write_step(2, records([[BLUE]]), {})  # still listed as not written, not retried
    assert {s: stored for s, _, _, _, _, stored in table(tmp_path / "capped")} == {sha(RED): 1, sha(BLUE): 0}
    assert [p.name for p in (tmp_path / "capped" / "images").iterdir()] == [f"{sha(RED)}.png"]
    with RolloutStore(tmp_path / "off", run_id="r", log_multimodal=False) as store:
        store.write_step(1, records([[RED]]), {})
        assert store.rollouts()[0]["images"] == [sha(RED)]  # the rollouts still name their images
    assert table(tmp_path / "off") == [] and not (tmp_path / "off" / "images").exists()


def test_a_step_digest_covers_its_images_and_a_text_step_digests_as_before(tmp_path):
    with RolloutStore(tmp_path, run_id="r") as store:
        store.write_step(1, records([[]]), {"m": 1.0})
        store.write_step(2, records([[RED]]), {})
        text_digest, image_digest = store.step_digest(1), store.step_digest(2)
    with sqlite3.connect(tmp_path / "rollouts.sqlite") as conn:
        conn.execute("UPDATE images SET bytes = bytes + 1")
    with RolloutStore(tmp_path, readonly=True) as store:
        assert store.step_digest(2) != image_digest  # a changed image row changes the step's digest
        assert store.step_digest(1) == text_digest
    # a text step's rows with the images column NULL digest as a store without the column (the chain of a
    # checkpoint written before the column existed still matches)
    with sqlite3.connect(tmp_path / "rollouts.sqlite") as conn:
        before = chain_through(conn, 1, 1)
        conn.execute("CREATE TABLE old AS SELECT * FROM rollouts")
        conn.execute("DROP TABLE rollouts")
        columns = [r[1] for r in conn.execute("PRAGMA table_info(old)") if r[1] != "images"]
        conn.execute(f"CREATE TABLE rollouts AS SELECT {', '.join(columns)} FROM old")
        assert chain_through(conn, 1, 1) == before


# A child writes step 1 (RED), then dies by SIGKILL while writing step 2's image BLUE: half of its bytes in the
# temporary file ("tmp"), or the file whole under its name but the step's rows never committed ("renamed").
CHILD = """
import os, signal, sys
from grpokit.store import images as images_module
from grpokit.store import RolloutStore
from test_store_images import BLUE, RED, records

where = sys.argv[2]
store = RolloutStore(sys.argv[1], run_id="r")
store.write_step(1, records([[RED]]), {})
write = images_module.ImageFiles.write

def dying_write(self, sha256, data):
    if where == "renamed":
        write(self, sha256, data)
    else:
        with open(self.folder / f".{sha256}.png.tmp", "wb") as out:
            out.write(data[: len(data) // 2])
            out.flush()
    os.kill(os.getpid(), signal.SIGKILL)

images_module.ImageFiles.write = dying_write
store.write_step(2, records([[BLUE]]), {})
"""


@pytest.mark.parametrize("where", ["tmp", "renamed"])
def test_a_kill_9_while_writing_an_image_leaves_nothing_a_resume_trusts(tmp_path, where):
    import os
    from pathlib import Path

    tests = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), str(tmp_path), where], env=env)
    assert child.returncode == -9
    left = sorted(p.name for p in (tmp_path / "images").iterdir())
    torn = f".{sha(BLUE)}.png.tmp" if where == "tmp" else f"{sha(BLUE)}.png"
    assert left == sorted([f"{sha(RED)}.png", torn])
    with RolloutStore(tmp_path, run_id="r") as store:
        assert store.last_step() == 1 and store.images([sha(BLUE)]) == {}  # no row names the killed step's image
        store.rollback_after(1)  # what a resume from step 1's checkpoint does
        assert sorted(p.name for p in (tmp_path / "images").iterdir()) == [f"{sha(RED)}.png"]
        store.write_step(2, records([[BLUE]]), {})
    assert ImageFiles(tmp_path / "images").holds(sha(BLUE))
    assert [r[0] for r in table(tmp_path)] == [sha(RED), sha(BLUE)]


def test_rolling_back_drops_the_images_of_the_steps_gone(tmp_path):
    with RolloutStore(tmp_path, run_id="r") as store:
        store.write_step(1, records([[RED]]), {})
        store.write_step(2, records([[RED], [BLUE]]), {})
        store.rollback_after(1)
        assert [r[0] for r in table(tmp_path)] == [sha(RED)]
        assert [p.name for p in (tmp_path / "images").iterdir()] == [f"{sha(RED)}.png"]


def test_thumbnails_link_the_files_relative_to_the_page_with_escaped_attributes(tmp_path):
    run = tmp_path / 'a "b" <c>'
    with RolloutStore(run, run_id="r") as store:
        store.write_step(1, records([[RED, BLUE]]), {})
        known = store.images([sha(RED), sha(BLUE)])
    assert images_url(run, None) == "images"
    url = images_url(run, tmp_path / "pages")
    assert url == "../a%20%22b%22%20%3Cc%3E/images"  # quoted: no quote or bracket reaches the attribute
    html = thumbnails([sha(RED), sha(BLUE), "f" * 64], known, url)
    assert f'<img src="{url}/{sha(RED)}.png"' in html and f'src="{url}/{sha(BLUE)}.png"' in html
    assert f"sha256 {sha(RED)}, {len(png_bytes(RED))} bytes, 8x6 px" in html
    assert "image 3 not stored (ffffffffffff)" in html
    hostile = thumbnails(['x" onerror="alert(1)'], {}, url)
    assert 'onerror="' not in hostile and "x&quot; onerror=&quot;alert(1)" in hostile  # the quotes are escaped
