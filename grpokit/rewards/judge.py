"""``reward_model``: a frozen model that scores whole sequences.

The model is either a local folder holding a Hugging Face ``AutoModelForSequenceClassification``
(with its tokenizer), or any ``torch.nn.Module`` mapping token ids [B, L] (and, if its forward
takes it, ``attention_mask`` [B, L]) to one score per sequence [B] or [B, 1], or to class
logits [B, C]. Sequences are right-padded, scored in batches under ``torch.inference_mode``.

:class:`ClassifierReward` is an ``nn.Module`` given directly as a reward function, scored as TRL
scores it: ``logits[:, 0]`` of the prompt + completion text (chat-templated for conversational data).

Both run in the trainer's process (``in_process``): they hold a model, maybe on a GPU, and torch's
kernels release the GIL, so their timeout still works.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from grpokit.rewards.contract import RewardError, is_conversational, text_of
from grpokit.rewards.registry import BUILTINS

OUTPUTS = ("sigmoid", "logit", "prob")
TEXTS = ("prompt+completion", "completion")


def _load_pretrained(path: str, tokenizer: Any):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from grpokit.models.hub import from_pretrained

    model = from_pretrained(AutoModelForSequenceClassification, path, "reward model")
    if tokenizer is None or isinstance(tokenizer, str):
        tokenizer = from_pretrained(AutoTokenizer, tokenizer or path, "reward model's tokenizer")
    if model.config.pad_token_id is None:
        # HF sequence classifiers pool the last non-pad token, so batching needs a pad id.
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad_id is None:
            raise ValueError(
                f"reward model {path!r}: neither the model config nor the tokenizer defines a "
                "pad or eos token, so sequences cannot be batched"
            )
        model.config.pad_token_id = pad_id
    return model, tokenizer


def _accepts_attention_mask(model: torch.nn.Module) -> bool:
    parameters = inspect.signature(model.forward).parameters.values()
    return any(p.name == "attention_mask" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


@BUILTINS.register("reward_model")
class RewardModelReward:
    """Score each (prompt +) completion with a sequence-scoring model.

    ``output``: ``"logit"`` the raw score (for C classes, the logit of ``label``); ``"sigmoid"``
    its sigmoid; ``"prob"`` the softmax probability of ``label`` (for a one-score model, the
    sigmoid, i.e. the probability of the positive class). ``tokenizer`` is a Hugging Face
    tokenizer, a tokenizer folder, or any object with ``encode(str) -> list[int]``; texts are cut
    to ``max_length`` tokens. ``device`` defaults to the model's own.
    """

    name = "reward_model"
    in_process = True

    def __init__(
        self,
        model: str | torch.nn.Module,
        tokenizer: Any = None,
        output: str = "sigmoid",
        label: int = 1,
        batch_size: int = 32,
        device: str | torch.device | None = None,
        text: str = "prompt+completion",
        max_length: int = 512,
    ):
        if output not in OUTPUTS:
            raise ValueError(f"reward_model: output must be one of {OUTPUTS}, got {output!r}")
        if text not in TEXTS:
            raise ValueError(f"reward_model: text must be one of {TEXTS}, got {text!r}")
        if batch_size < 1 or max_length < 1:
            raise ValueError("reward_model: batch_size and max_length must be >= 1")
        if isinstance(model, str):
            model, tokenizer = _load_pretrained(model, tokenizer)
        elif tokenizer is None or isinstance(tokenizer, str):
            raise ValueError("reward_model: a torch module needs a tokenizer object")
        if device is None:
            parameter = next(model.parameters(), None)
            device = parameter.device if parameter is not None else "cpu"
        else:
            model = model.to(device)
        model.eval()
        model.requires_grad_(False)
        self.device = torch.device(device)
        self.model = model
        self.tokenizer = tokenizer
        self.output = output
        self.label = label
        self.batch_size = batch_size
        self.text = text
        self.max_length = max_length
        self._pass_mask = _accepts_attention_mask(model)
        config_pad = getattr(getattr(model, "config", None), "pad_token_id", None)
        tokenizer_pad = getattr(tokenizer, "pad_token_id", None)
        self._pad_id = next((p for p in (config_pad, tokenizer_pad) if p is not None), 0)

    def _encode(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded token ids [B, L] and attention mask [B, L]."""
        ids = [list(self.tokenizer.encode(t))[: self.max_length] for t in texts]
        width = max(1, max(len(row) for row in ids))
        input_ids = torch.full((len(ids), width), self._pad_id, dtype=torch.long)  # [B, L]
        attention_mask = torch.zeros((len(ids), width), dtype=torch.long)  # [B, L]
        for row, tokens in enumerate(ids):
            input_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            attention_mask[row, : len(tokens)] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _scores(self, raw: Any, batch: int) -> torch.Tensor:
        """Model output -> one reward per sequence [B]."""
        if hasattr(raw, "logits"):
            raw = raw.logits
        elif isinstance(raw, (tuple, list)):
            raw = raw[0]
        if raw.dim() == 1:
            raw = raw[:, None]  # [B, 1]
        if raw.dim() != 2 or raw.shape[0] != batch:
            raise RewardError(
                f"reward_model: expected scores [{batch}], [{batch}, 1] or logits [{batch}, C], "
                f"got shape {list(raw.shape)}"
            )
        raw = raw.float()
        if raw.shape[1] == 1:
            score = raw[:, 0]  # [B]
            return score if self.output == "logit" else torch.sigmoid(score)
        if not 0 <= self.label < raw.shape[1]:
            raise RewardError(f"reward_model: label {self.label} is not one of {raw.shape[1]} classes")
        if self.output == "prob":
            return torch.softmax(raw, dim=-1)[:, self.label]  # [B]
        score = raw[:, self.label]  # [B]
        return score if self.output == "logit" else torch.sigmoid(score)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        if self.text == "completion":
            texts = [text_of(c) for c in completions]
        else:
            texts = [_joined(self.tokenizer, p, c) for p, c in zip(prompts, completions, strict=True)]
        rewards: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                input_ids, attention_mask = self._encode(texts[start : start + self.batch_size])
                if self._pass_mask:
                    raw = self.model(input_ids, attention_mask=attention_mask)
                else:
                    raw = self.model(input_ids)
                rewards.extend(self._scores(raw, len(input_ids)).tolist())
        return rewards


def _joined(tokenizer: Any, prompt: Any, completion: Any) -> str:
    """Prompt + completion as one text: chat messages through the tokenizer's chat template when it
    has one (as TRL does), else their contents."""
    if is_conversational(prompt) and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt + completion, tokenize=False)
    return text_of(prompt) + text_of(completion)


def load_sequence_classifier(name: str, device: str | torch.device | None = None, **kwargs: Any) -> torch.nn.Module:
    """The reward model a string names in ``reward_funcs`` (TRL's reading): an ``AutoModelForSequenceClassification``
    with one output (``num_labels=1``) from a local folder or a Hub id, moved to ``device``. ``kwargs`` go to
    ``from_pretrained`` (``dtype``, ``trust_remote_code``). A ValueError names the string when it does not load."""
    from transformers import AutoModelForSequenceClassification

    try:
        model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=1, **kwargs)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"reward {name!r} names a reward model (a folder or a Hub id owner/name) that cannot be loaded: {first}. "
            "Give an existing folder holding an AutoModelForSequenceClassification, a Hub id in the local cache (or "
            "online), a built-in name, or a function as module:function or file.py:function."
        ) from exc
    return model if device is None else model.to(device)


class ClassifierReward:
    """An ``nn.Module`` sequence classifier as a reward, as TRL's GRPOTrainer uses one: the
    ``processing_class`` tokenizes prompt + completion (right padding, no special tokens added) and
    the reward is ``model(**inputs).logits[:, 0]``. Without a ``processing_class``, the tokenizer is
    loaded from the model's ``config._name_or_path``; a tokenizer without a pad token pads with eos."""

    in_process = True

    def __init__(self, model: torch.nn.Module, processing_class: Any = None, batch_size: int = 32):
        config = getattr(model, "config", None)
        if processing_class is None:
            path = getattr(config, "_name_or_path", None)
            if not path:
                raise ValueError(
                    f"reward {type(model).__name__}: an nn.Module reward needs its tokenizer; "
                    "pass reward_processing_classes=[tokenizer]"
                )
            from transformers import AutoTokenizer

            from grpokit.models.hub import from_pretrained

            processing_class = from_pretrained(AutoTokenizer, path, "reward model's tokenizer")
        if processing_class.pad_token_id is None:
            processing_class.pad_token = processing_class.eos_token
        if config is not None:
            config.pad_token_id = processing_class.pad_token_id
        self.model = model.eval().requires_grad_(False)
        self.processing_class = processing_class
        self.batch_size = batch_size
        path = getattr(config, "_name_or_path", None)
        self.name = path.rstrip("/").split("/")[-1] if path else type(model).__name__

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        texts = [_joined(self.processing_class, p, c) for p, c in zip(prompts, completions, strict=True)]
        device = next(self.model.parameters()).device
        rewards: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                inputs = self.processing_class(
                    text=texts[start : start + self.batch_size],
                    return_tensors="pt",
                    padding=True,
                    padding_side="right",
                    add_special_tokens=False,
                )
                logits = self.model(**{k: v.to(device) for k, v in inputs.items()}).logits  # [B, C]
                rewards.extend(logits[:, 0].float().tolist())
        return rewards
