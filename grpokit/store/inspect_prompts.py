"""`grpokit inspect RUN --prompts`: each training prompt's history (the store's prompt_history table) as a table or
JSON: its pass rate, mean reward and reward variance over its recent completions, how often it was sampled, and
when first and last."""

from __future__ import annotations

from collections.abc import Callable

from grpokit.store.store import RolloutStore

COLUMNS = (
    "prompt_index",
    "pass_rate",
    "mean_reward",
    "reward_var",
    "recent_samples",
    "samples",
    "steps_sampled",
    "first_step",
    "last_step",
    "solved_streak",
    "prompt_hash",
)
# The table's columns and their headers (--json gives every column by its name): short, so 100 columns hold them.
SHOWN = {
    "prompt_index": "prompt",
    "pass_rate": "pass rate",
    "mean_reward": "mean",
    "reward_var": "variance",
    "samples": "samples",
    "steps_sampled": "steps",
    "first_step": "first",
    "last_step": "last",
    "solved_streak": "streak",
}
SORTS = ("prompt", "pass_rate", "last_step", "samples")


def prompts_rows(store: RolloutStore, sort: str = "prompt") -> list[dict]:
    """The history's rows (without the recent rewards themselves), sorted by ``sort`` (:data:`SORTS`: the prompt
    index, the pass rate ascending, the last step or the samples descending; the prompt index breaks ties)."""
    if sort not in SORTS:
        raise ValueError(f"--sort {sort!r}; valid choices: {', '.join(SORTS)}")
    rows = [{name: row[name] for name in COLUMNS} for row in store.prompt_history()]
    if sort == "pass_rate":
        rows.sort(key=lambda r: (r["pass_rate"], r["prompt_index"]))
    elif sort != "prompt":
        rows.sort(key=lambda r: (-r[sort], r["prompt_index"]))
    return rows


def prompts_text(store: RolloutStore, title: str, as_json: bool, render: Callable, sort: str = "prompt") -> str:
    """What ``--prompts`` prints (``render(columns, rows, as_json, title)``: inspect's table or JSON)."""
    rows = prompts_rows(store, sort)
    if not rows and not as_json:
        return (
            "no prompt history in this store: no step written yet, or a run from before grpokit kept it (a resume "
            "with `grpokit train CONFIG resume_from=latest` builds it from the stored rollouts)\n"
        )
    if as_json:
        return render(list(COLUMNS), rows, as_json, title)
    shown = [{header: row[name] for name, header in SHOWN.items()} for row in rows]
    return render(list(SHOWN.values()), shown, as_json, title)
