"""A checkpoint of a run sampling ahead holds its queued rollouts' prompts as plain id lists (weights_only loads
them); the resumed run gives them back the pixel inputs it encoded for the same prompts, or stops in one line when
its dataset no longer encodes them to the saved ids."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from grpokit.data.prompts import DataError
from grpokit.models.vision_inputs import VisionPrompt, plain, reattach
from grpokit.rollout.types import Rollouts
from grpokit.train.experience.sources import AheadRollouts, _saved


def vision(ids, hash_="h"):
    return VisionPrompt(ids, {}, {"pixel_values": torch.ones(4, 3)}, [hash_])


def rollouts(prompt_ids):
    n = 2 * len(prompt_ids)
    return Rollouts(
        prompt_ids=prompt_ids, completion_ids=torch.zeros(n, 1, dtype=torch.long), completion_mask=torch.ones(n, 1),
        logprobs=torch.zeros(n, 1), finish_reasons=["stop"] * n, num_generations=2, policy_version=1,
    )  # fmt: skip


def test_plain_ids_survive_a_weights_only_checkpoint(tmp_path):
    saved = _saved(rollouts([vision([5, 6, 7]), [8, 9]]))
    assert saved["prompt_ids"] == [[5, 6, 7], [8, 9]] and all(type(p) is list for p in saved["prompt_ids"])
    torch.save({"queue": [saved]}, tmp_path / "states.pt")
    loaded = torch.load(tmp_path / "states.pt", weights_only=True)["queue"][0]
    assert Rollouts.from_dict(loaded).prompt_ids == [[5, 6, 7], [8, 9]]


def test_reattach_gives_back_the_datasets_vision_prompts():
    fresh = [vision([1, 2]), [3], vision([4], "g")]
    found = reattach([[1, 2], [3], [4]], fresh)
    assert found[0] is fresh[0] and found[2] is fresh[2] and found[1] == [3]
    assert reattach([[1, 2], [3]], [[1, 2], [3]]) == [[1, 2], [3]]  # text only: as saved
    assert reattach([[1, 2], [3], [5]], fresh) is None  # another prompt at the same index
    assert reattach([[1, 2]], fresh) is None  # another batch size
    assert plain(fresh) == [[1, 2], [3], [4]]


def test_a_resume_whose_dataset_encodes_other_ids_stops_in_one_line():
    prompts = SimpleNamespace(ids=[vision([1, 2]), vision([3, 4])])
    source = AheadRollouts(
        SimpleNamespace(prompts=prompts), last_step=4, max_staleness=1, score_ahead=False
    )  # fmt: skip
    entry = {"step": 3, "indices": [1, 0], "reward_state": None}
    good = dataclasses.asdict(rollouts([[3, 4], [1, 2]]))
    assert source.load_state_dict(None, {"queue": [{**entry, "rollouts": good}]})
    restored = source._restored[3][2].prompt_ids
    assert restored[0] is prompts.ids[1] and restored[1] is prompts.ids[0]  # pixel inputs back, in the batch's order
    bad = dataclasses.asdict(rollouts([[3, 9], [1, 2]]))
    with pytest.raises(DataError) as stopped:
        source.load_state_dict(None, {"queue": [{**entry, "rollouts": bad}]})
    source.producer.close()  # its thread
    assert "\n" not in str(stopped.value) and "step 3" in str(stopped.value)
