"""Build offline the VLM stand-ins that TRL's ``TestGRPOTrainerVLM`` and ``test_train_with_tools_multimodal_response``
load, into ``$TRL_SUITE_FIXTURES`` (``../shared/trl_suite/conftest.py`` redirects ``trl-internal-testing/<name>`` to
``models/<name>`` and datasets to ``datasets/<name>/<config>``).

    python scripts/build_vlm_fixtures.py [OUT_DIR] [--only NAME ...] [--force]

OUT_DIR defaults to ``$TRL_SUITE_FIXTURES`` or ``$TMPDIR/trl_suite_fixtures`` (as run.sh). A model folder that
already holds a stand-in built by these sources (its stamp) is kept unless ``--force``. Models: see
vlm_fixture_families.py; datasets: ``zen-image`` and ``zen-multi-image`` (vlm_fixture_datasets.py). The text
stand-ins (``zen``, the causal LMs, the reward model) are the suite's own build_fixtures.py, which run.sh runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from vlm_fixture_datasets import build_datasets
from vlm_fixture_families import NotBuilt, gemma3, gemma4, llava_next, qwen2_vl, qwen3_5

MODELS = {
    "tiny-Gemma3ForConditionalGeneration": gemma3,
    "tiny-Gemma4ForConditionalGeneration": gemma4,
    "tiny-LlavaNextForConditionalGeneration": llava_next,
    "tiny-Qwen2_5_VLForConditionalGeneration": lambda: qwen2_vl("2.5"),
    "tiny-Qwen2VLForConditionalGeneration": lambda: qwen2_vl("2"),
    "tiny-Qwen3_5ForConditionalGeneration-NoThink": lambda: qwen3_5("dense"),
    "tiny-Qwen3_5MoeForConditionalGeneration-3.6": lambda: qwen3_5("moe"),
}


def recipe_stamp() -> str:
    """A hash of this builder's sources: a stand-in built by another version of them is rebuilt."""
    import hashlib

    here = Path(__file__).resolve().parent
    sources = [here / f for f in ("build_vlm_fixtures.py", "vlm_fixture_families.py", "vlm_fixture_tokenizers.py")]
    return hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]


def default_out() -> Path:
    tmp = os.environ.get("TMPDIR", "/tmp")
    return Path(os.environ.get("TRL_SUITE_FIXTURES", os.path.join(tmp, "trl_suite_fixtures")))


def smoke_test(model, processor) -> tuple[int, ...]:
    """TRL's smoke test: two image conversations through the processor's chat template and one forward, no NaN."""
    from PIL import Image

    messages = [
        [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (24, 24), "red")},
                                      {"type": "text", "text": "What is this?"}]}],
        [{"role": "user", "content": [{"type": "text", "text": "Is it blue?"},
                                      {"type": "image", "image": Image.new("RGB", (24, 24), "blue")}]}],
    ]  # fmt: skip
    inputs = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt", padding=True
    )
    model.eval()
    with torch.no_grad():
        logits = model(**inputs).logits
    if torch.isnan(logits).any():
        raise RuntimeError(f"{type(model).__name__}: NaN in the smoke test's logits")
    return tuple(logits.shape)


def build_model(name: str, out: Path, force: bool = False) -> Path:
    folder = out / "models" / name
    stamp = folder / "build_vlm_fixtures.stamp"
    if (folder / "config.json").exists() and stamp.exists() and stamp.read_text() == recipe_stamp() and not force:
        print(f"kept  {name} ({folder})")
        return folder
    torch.manual_seed(0)
    model, processor, generation_config = MODELS[name]()
    model = model.to(dtype=torch.bfloat16)
    for module in model.modules():  # Qwen3.5 keeps A_log and the linear attention's norm in float32, as TRL does
        if hasattr(module, "A_log") and name.endswith("-NoThink"):
            module.A_log.data, module.norm.weight.data = module.A_log.data.float(), module.norm.weight.data.float()
    folder.mkdir(parents=True, exist_ok=True)
    shape = smoke_test(model, processor)
    processor.save_pretrained(folder)
    model.save_pretrained(folder)
    if generation_config is not None:
        generation_config.save_pretrained(folder)
    stamp.write_text(recipe_stamp())
    print(f"built {name}: {type(model).__name__}, {type(processor).__name__}, vocab {len(processor.tokenizer)}, "
          f"smoke logits {shape}")  # fmt: skip
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=None, help="fixtures folder (default: as run.sh)")
    parser.add_argument("--only", nargs="*", choices=sorted(MODELS), help="build only these models")
    parser.add_argument("--no-datasets", action="store_true", help="skip zen-image and zen-multi-image")
    parser.add_argument("--force", action="store_true", help="rebuild models that are already there")
    args = parser.parse_args(argv)
    out = args.out or default_out()
    for name in args.only if args.only is not None else sorted(MODELS):
        try:
            build_model(name, out, force=args.force)
        except NotBuilt as reason:
            print(f"skip  {name}: {reason}")
    if not args.no_datasets:
        for line in build_datasets(out / "datasets"):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
