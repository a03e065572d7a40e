"""Model loading errors are one clear message, not a transformers traceback."""

import pytest
import torch

from grpokit.models.loading import load_model, load_tokenizer


def test_unreachable_hub_id_names_the_model_and_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        FileNotFoundError,
        match=r"cannot load the model 'nosuchorg/nosuchmodel'; HF_HUB_OFFLINE is set, so nothing is downloaded, "
        r"and it is not in the local cache .*; unset HF_HUB_OFFLINE to download it, or give a local folder\.$",
    ):
        load_model("nosuchorg/nosuchmodel", torch.float32, torch.device("cpu"))
    with pytest.raises(FileNotFoundError, match="cannot load the tokenizer 'nosuchorg/nosuchmodel'"):
        load_tokenizer("nosuchorg/nosuchmodel")


def test_missing_local_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(str(tmp_path / "absent"), torch.float32, torch.device("cpu"))


def test_four_bit_config_is_nf4_with_double_quantisation_in_the_run_dtype():
    pytest.importorskip("bitsandbytes")
    from grpokit.models.loading import four_bit_config

    config = four_bit_config(torch.float32)
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4" and config.bnb_4bit_use_double_quant
    assert config.bnb_4bit_compute_dtype == torch.float32


def test_missing_bitsandbytes_names_the_qlora_extra(monkeypatch):
    import sys

    from grpokit.models.loading import four_bit_config

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import bitsandbytes raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'grpokit\[qlora\]'"):
        four_bit_config(torch.float32)


def test_old_bitsandbytes_is_refused_naming_the_version(monkeypatch):
    import sys
    import types

    from grpokit.models.loading import four_bit_config

    monkeypatch.setitem(sys.modules, "bitsandbytes", types.SimpleNamespace(__version__="0.45.5"))
    with pytest.raises(ImportError, match=r"bitsandbytes >= 0\.48 .* but 0\.45\.5 is installed"):
        four_bit_config(torch.float32)
