"""report.html's frame: styles, the sections in order, the curves' data as JSON, and one small inline script.

Every section is plain HTML, so the page reads top to bottom without JavaScript. With it, the script adds tabs
(Curves, Groups, Held-out prompts, Prompts, Tokens, Samples), a filter over the panels, a step picker and a
zero-variance filter for the groups (``report.html?step=N`` opens step N; ``?view=heldout`` or ``#heldout``, also
groups, prompts, tokens and samples, opens a view), a category picker for the held-out prompts, and the per-token
value that colours the Tokens view (store/tokens.py; ``?token=NAME``). It fetches nothing and reads only the page.
"""

from __future__ import annotations

import time

from grpokit.store.html_text import script_json, text
from grpokit.store.tokens import TOKEN_SCRIPT

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1200px; color: #222; padding: 0 12px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px; } h4 { margin: 12px 0 4px; }
.meta { color: #666; } .charts { display: flex; flex-wrap: wrap; gap: 12px; }
.chart { background: #fff; border: 1px solid #ddd; border-radius: 4px; }
.chart .title { font-weight: 600; font-size: 13px; } .chart .tick { font-size: 11px; fill: #555; }
.chart .legend { font-size: 11px; fill: #333; } .chart .frame { fill: none; stroke: #bbb; }
.chart .grid { stroke: #eee; } .chart .axis { stroke: #999; }
.sample { border: 1px solid #ddd; border-radius: 4px; margin: 8px 0; padding: 8px 12px; }
.sample.best { border-left: 4px solid #59a14f; } .sample.worst { border-left: 4px solid #e15759; }
.summary dl { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; margin: 8px 0; }
.summary dt { color: #666; } .summary dd { margin: 0; }
.changes { border-collapse: collapse; margin: 8px 0; } .changes td, .changes th { padding: 3px 12px;
  border-bottom: 1px solid #eee; text-align: right; } .changes td:first-child, .changes th:first-child
  { text-align: left; font-family: ui-monospace, monospace; } .at { color: #888; font-size: 12px; }
.good { color: #2e7d32; font-weight: 600; } .bad { color: #c62828; font-weight: 600; }
pre { white-space: pre-wrap; word-break: break-word; margin: 6px 0; font-size: 13px; background: #f7f7f7;
  padding: 6px; } .prompt { color: #555; } .error { color: #b00; }
pre.tool { background: #eef4fb; color: #1f4e79; margin-left: 24px; }
.group { border: 1px solid #ddd; border-radius: 4px; margin: 10px 0; padding: 6px 10px; }
.group.flat { border-left: 4px solid #edc948; } .group-head { font-weight: 600; }
.flag { background: #edc948; color: #222; border-radius: 3px; padding: 0 6px; font-size: 12px; }
.scroll { overflow-x: auto; } table.side, table.grid { border-collapse: collapse; font-size: 13px; }
table.side td, table.side th, table.grid td, table.grid th { border: 1px solid #e4e4e4; padding: 3px 6px;
  vertical-align: top; text-align: right; } table.side td { min-width: 80px; max-width: 320px; }
table.side th[scope=row], table.grid td.p { text-align: left; white-space: nowrap; }
table.side pre { margin: 0; text-align: left; } .pos { color: #2e7d32; } .neg { color: #c62828; }
.s0 { background: #fbe3e3; } .s1 { background: #f9efd9; } .s2 { background: #f3f3d5; } .s3 { background: #e1f0d8; }
.s4 { background: #c9e7c0; }
nav.tabs button, .controls button { margin: 0 4px 4px 0; padding: 4px 10px; border: 1px solid #bbb;
  background: #f6f6f6; border-radius: 4px; cursor: pointer; } nav.tabs button.on, .controls button.on
  { background: #4e79a7; color: #fff; border-color: #4e79a7; } .controls { margin: 8px 0; }
.hide { display: none !important; }
table.heat { border-collapse: collapse; font-size: 12px; } table.heat th, table.heat td { border: 1px solid #eee;
  padding: 1px 4px; text-align: right; } table.heat td.p, table.heat th:first-child {
  text-align: left; white-space: nowrap; }
table.heat td[title] { min-width: 10px; padding: 0; } tr.retired td.p { color: #777; }
.h0 { background: #d73027; } .h1 { background: #fc8d59; } .h2 { background: #fee08b; } .h3 { background: #91cf60; }
.h4 { background: #1a9850; }
.thumbs img { max-height: 96px; max-width: 192px; border: 1px solid #ddd; margin: 4px 6px 0 0;
  image-rendering: pixelated; vertical-align: top; }
.toks { font: 13px/1.9 ui-monospace, monospace; white-space: pre-wrap; word-break: break-word; margin: 6px 0; }
span.tok { border: 1px solid #ddd; border-radius: 2px; padding: 1px 1px; margin-right: 1px; }
"""

# Tabs over the views, the panel filter, the group step picker (?step=N) and the held-out category picker.
SCRIPT = (
    """
(function () {
  const $ = (s, e) => (e || document).querySelector(s), $$ = (s, e) => [...(e || document).querySelectorAll(s)];
  const button = (text, on) => { const b = document.createElement("button"); b.type = "button";
    b.textContent = text; b.addEventListener("click", on); return b; };
  const choose = (buttons, chosen) => buttons.forEach(b => b.classList.toggle("on", b === chosen));
  const views = $$("section.view"), nav = $("nav.tabs"), tabs = [];
  const show = id => { views.forEach(v => v.classList.toggle("hide", v.id !== id));
    choose(tabs, tabs.find(t => t.dataset.view === id)); };
  views.forEach(v => { const t = button($("h2", v).textContent, () => show(v.id)); t.dataset.view = v.id;
    tabs.push(t); nav.appendChild(t); });
  const filter = $("#panel-filter");
  if (filter) { filter.hidden = false; filter.addEventListener("input", () => { const q = filter.value.toLowerCase();
    $$(".charts svg.chart").forEach(c => c.classList.toggle("hide",
      !c.getAttribute("aria-label").toLowerCase().includes(q) &&
      !$$("text.legend", c).some(t => t.textContent.toLowerCase().includes(q)))); }); }
  const blocks = $$(".group-step"), controls = $("#group-controls");
  const wanted = new URLSearchParams(location.search).get("step");
  if (blocks.length && controls) {
    controls.hidden = false;
    const picker = document.createElement("select"), only = document.createElement("input");
    picker.id = "step-picker"; only.type = "checkbox"; only.id = "flat-only";
    blocks.forEach(b => picker.add(new Option("step " + b.dataset.step, b.dataset.step)));
    const label = document.createElement("label"); label.append(only, " zero-variance groups only");
    controls.append("Step ", picker, " ", label);
    const update = () => { blocks.forEach(b => b.classList.toggle("hide", b.dataset.step !== picker.value));
      $$(".group", $("#groups")).forEach(g =>
        g.classList.toggle("hide", only.checked && !g.classList.contains("flat"))); };
    picker.addEventListener("change", update); only.addEventListener("change", update);
    if (wanted !== null && blocks.some(b => b.dataset.step === wanted)) picker.value = wanted;
    else if (wanted !== null) { const p = document.createElement("p"); p.className = "error";
      p.textContent = "step " + wanted + " is not in this page: grpokit report RUN --steps " + wanted + " adds it";
      controls.appendChild(p); }
    update();
  }
  const held = $$("div.heldout");
  if (held.length) { const bar = $("#heldout-controls"); bar.hidden = false; const buttons = [];
    const pick = name => { held.forEach(h => h.classList.toggle("hide", name !== "all" && h.dataset.category !== name));
      choose(buttons, buttons.find(b => b.dataset.category === name)); };
    ["all", "learned", "forgotten", "never solved", "kept"].forEach(name => { const b = button(name, () => pick(name));
      b.dataset.category = name; buttons.push(b); bar.appendChild(b); });
    pick("all"); }
"""
    + TOKEN_SCRIPT
    + """
  const asked = new URLSearchParams(location.search).get("view") || location.hash.slice(1);
  const named = views.find(v => v.id === asked);
  show(named ? asked : wanted !== null && $("#groups") ? "groups" : (views[0] || {}).id);
})();
"""
)


def page(
    title: str,
    run_id: str,
    summary_section: str,
    charts: str,
    data: dict,
    summary: dict,
    views: list[str],
    problems: list[str] = (),
) -> str:
    """The whole page: ``problems`` (lines naming a store's values of the wrong type) and ``summary_section`` first,
    then the Curves view (``charts``, SVG) and the other ``views`` (sections of class "view"); ``data`` ({panel:
    {series: points}}) and ``summary`` are embedded as JSON that no value can end early (html_text.script_json)."""
    data_json = script_json(data, separators=(",", ":"))
    summary_json = script_json(summary)
    warnings = "".join(f'<p class="error">{text(line)}</p>' for line in problems)
    curves = (
        '<section id="curves" class="view"><h2>Curves</h2>'
        '<input id="panel-filter" type="search" placeholder="filter panels (e.g. reward, clip, eval)" hidden>'
        f'<div class="charts">\n{charts or "<p>No metrics logged.</p>"}\n</div></section>'
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>grpokit report: {text(title)}</title>
<style>{STYLE}</style>
<script type="application/json" id="grpokit-data">{data_json}</script>
<script type="application/json" id="grpokit-summary">{summary_json}</script>
</head><body>
<h1>grpokit report: {text(title)}</h1>
<p class="meta">run {text(run_id)} · generated {time.strftime("%Y-%m-%d %H:%M:%S")}</p>
{warnings}
{summary_section}
<nav class="tabs"></nav>
{curves}
{"".join(views)}
<script>{SCRIPT}</script>
</body></html>
"""
