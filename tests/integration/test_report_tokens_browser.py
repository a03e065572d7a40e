"""The report's Tokens view as headless Chromium opens it from file://, on a run trained through the CLI with
run.store_token_values: no console message, the view and its selector shown, and every token recoloured by the
page's script exactly as the page's own default colouring (store/tokens.py's scales, mirrored in the script) for
each value asked for with ?token=NAME; clipped tokens (weight 0) are grey. Needs Chromium (skipped without)."""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import pytest
from shared_helpers import tiny_run_config

from grpokit.cli import main
from grpokit.store.tokens import colour

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import screenshot_report

try:
    screenshot_report.find_chromium()
except SystemExit as exc:
    pytest.skip(f"headless report check needs Chromium: {exc}", allow_module_level=True)

SPAN = re.compile(r'<span class="tok" style="background: ?(rgb\([^)]*\))[^"]*" title="[^"]*" data-v="([^"]*)">')


@pytest.fixture(scope="module")
def page(tmp_path_factory, tiny_model_dir) -> Path:
    tmp = tmp_path_factory.mktemp("tokens-page")
    # two passes over each batch with a tiny clip range: the second pass clips tokens (weight 0)
    config = tiny_run_config(
        tmp,
        tiny_model_dir,
        max_steps=3,
        algo={"num_iterations": 2, "epsilon": 1e-4},
        run={"store_token_values": ["all"]},
    )
    assert main(["train", str(config)]) == 0
    return tmp / "run" / "report.html"


def scales(dom: str) -> dict[str, float]:
    import json

    return json.loads(html.unescape(re.search(r'data-scales="([^"]*)"', dom).group(1)))


def test_tokens_view_opens_with_no_console_messages(page):
    dom, console = screenshot_report.open_page(page.resolve().as_uri() + "?view=tokens")
    assert console == []
    assert re.search(r'<section id="tokens" class="view"', dom) and '<section id="curves" class="view hide"' in dom
    assert re.search(r'<select id="token-value">', dom)  # shown once the script runs (hidden without it)
    select = re.search(r'<select id="token-value">(.*?)</select>', dom, re.DOTALL).group(1)
    options = re.findall(r'<option value="(\w+)"', select)
    assert options == ["logprob", "gap", "entropy", "weight"]


@pytest.mark.parametrize("name", ["logprob", "gap", "entropy", "weight"])
def test_script_colours_every_token_as_the_page_does(page, name):
    dom, console = screenshot_report.open_page(page.resolve().as_uri() + f"?view=tokens&token={name}")
    assert console == []
    spans = SPAN.findall(dom)
    assert len(spans) >= 8
    order = ["logprob", "gap", "entropy", "weight"]
    full = scales(dom)
    for background, values in spans:
        value = values.split(",")[order.index(name)]
        expected = colour(name, float(value) if value else None, full[name])
        assert background.replace(" ", "") == expected, (name, value)
    if name == "weight":  # the second pass clipped some tokens: grey (no gradient)
        assert any(values.split(",")[3] == "0" for _, values in spans)
        assert "rgb(150,150,150)" in [b.replace(" ", "") for b, _ in spans]


def test_readable_without_javascript(page):
    raw = page.read_text()
    section = raw[raw.index('<section id="tokens"') :]
    section = section[: section.index("</section>")]
    # the default colouring (the gap) is inline, and each token's title holds every value
    first = re.search(r'<span class="tok" style="background:(rgb\([^)]*\))" title="([^"]*)"', section)
    assert first and all(f"{n} " in first.group(2) for n in ("logprob", "gap", "entropy", "weight"))
    assert '<select id="token-value" hidden>' in section and "gap: white: sampler and learner agree" in section


def test_screenshot(page, tmp_path):
    png = tmp_path / "tokens.png"
    screenshot_report.screenshot(page, png, height=1200, suffix="?view=tokens&token=weight")
    assert png.stat().st_size > 10_000
