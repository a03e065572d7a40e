"""FSDP's units of a vision-language model: the vision tower's blocks stay in the root unit (gathered on every forward
call), the language model's decoder layers are units of their own; a text model's units are as before."""

from __future__ import annotations

from grpokit.distributed.fsdp import _vision_tower_modules


def test_the_vision_tower_stays_in_the_root_unit(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    build_tiny_qwen2_vl(tmp_path, words=["red", "colour", "?"], image_side=28)
    model = AutoModelForImageTextToText.from_pretrained(tmp_path)
    kept = _vision_tower_modules(model)
    layer_classes = set(model._no_split_modules)
    units = [type(m).__name__ for m in model.modules() if type(m).__name__ in layer_classes and id(m) not in kept]
    blocks = [m for m in model.model.visual.modules() if type(m).__name__ in layer_classes]
    assert blocks and all(id(m) in kept for m in blocks)  # Qwen2VLVisionBlock: listed, not a unit
    assert units and set(units) == {"Qwen2VLDecoderLayer"}
    assert len(units) == model.config.text_config.num_hidden_layers
    assert _vision_tower_modules(AutoModelForCausalLM.from_pretrained(tiny_model_dir)) == set()
