"""Model loading errors are one clear message, not a transformers traceback."""

import pytest
import torch

from grpokit.modeling import load_model, load_tokenizer


def test_unreachable_hub_id_names_the_model_and_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="cannot load the model 'nosuchorg/nosuchmodel'.*give the local folder"):
        load_model("nosuchorg/nosuchmodel", torch.float32, torch.device("cpu"))
    with pytest.raises(FileNotFoundError, match="cannot load the tokenizer 'nosuchorg/nosuchmodel'"):
        load_tokenizer("nosuchorg/nosuchmodel")


def test_missing_local_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(str(tmp_path / "absent"), torch.float32, torch.device("cpu"))
