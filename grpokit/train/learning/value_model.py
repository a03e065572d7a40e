"""The critic of PPO: a transformer trunk and a scalar head, giving V(s_t) for every completion token.

``values[:, t]`` is read at the position whose logits give the policy's ``logprobs[:, t]`` (the last
prompt token for t = 0, completion token t-1 after that): the value of the state before token t is
emitted, as in verl's critic and TRL's former PPOTrainer. The trunk runs through the same code as the
policy's log-prob passes (``train/learning/policy_logprobs.completion_features``: prompts once per group with a shared
KV cache, or the full [prompt | completion] forward under DDP/FSDP or activation checkpointing), so a
``Batch`` built for the policy serves the critic too. Hugging Face models only (the Batch's HF layout).

Where the trunk comes from: a copy of the policy's (``from_policy``), or a model folder or hub id
(``from_pretrained``, the ``value_model_name_or_path`` of the PPO config): a causal LM (the head is new)
or a saved ``*ForTokenClassification`` value model with one label (its head is kept). LoRA on the trunk
with ``add_lora`` (peft); the head always trains.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from grpokit.kernels import Kernels
from grpokit.models.loading import is_hf_model, model_source
from grpokit.train.learning.policy_logprobs import Batch, completion_features

# attribute names of the one-label head in transformers' *ForTokenClassification models
HEAD_NAMES = ("score", "classifier")


class ValueModel(torch.nn.Module):
    """V(s_t) = head(trunk(prompt, completion[:t]))[t]: ``forward(batch) -> values [n, T]`` (0 at padding).

    ``trunk``: a transformers base model (``LlamaModel``, ``Qwen2Model``, ...: hidden states, no LM
    head), or a peft wrapper of one. ``head``: ``Linear(hidden, 1)``. No dropout is applied before the
    head (values are regression targets' estimates; transformers' token classifiers drop out there).
    """

    def __init__(self, trunk: torch.nn.Module, head: torch.nn.Linear):
        super().__init__()
        if not is_hf_model(trunk):
            raise ValueError(
                f"the value model's trunk must be a Hugging Face model, got {type(trunk).__name__}; "
                "custom modules have no hidden-state interface to put a value head on."
            )
        if not isinstance(head, torch.nn.Linear) or head.out_features != 1:
            raise ValueError(f"the value head must be a Linear(hidden, 1), got {head}")
        self.trunk = trunk
        self.head = head

    @classmethod
    def from_policy(cls, policy: torch.nn.Module) -> ValueModel:
        """A critic on a copy of ``policy``'s trunk (LoRA adapters merged into the copy) with a new head.

        The head is initialised as transformers initialises a token classifier: weights N(0, initializer_range),
        bias 0; it sits on the trunk's device and dtype.
        """
        if not is_hf_model(policy):
            raise ValueError(f"from_policy needs a Hugging Face policy, got {type(policy).__name__}")
        if hasattr(policy, "merge_and_unload"):  # peft: the adapters' current weights belong to the trunk
            policy = copy.deepcopy(policy).merge_and_unload()
            trunk = policy.get_decoder()
        else:
            trunk = copy.deepcopy(policy.get_decoder())
        return cls(trunk, _new_head(trunk))

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        trust_remote_code: bool = False,
    ) -> ValueModel:
        """A critic loaded with ``AutoModelForTokenClassification`` (``num_labels=1``) from a folder or hub id.

        From a causal LM the trunk is its weights and the head is new; from a saved one-label token
        classifier (a trained value model) both are loaded.
        """
        from transformers import AutoModelForTokenClassification

        from grpokit.models.hub import from_pretrained

        source = model_source(name_or_path)
        model = from_pretrained(  # a message, within seconds, when it cannot be loaded (grpokit/models/hub.py)
            AutoModelForTokenClassification,
            source,
            "value model (a causal LM or a one-label token classifier)",
            num_labels=1,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
        )
        head = next((getattr(model, name) for name in HEAD_NAMES if hasattr(model, name)), None)
        if head is None:
            raise ValueError(f"{type(model).__name__} has no value head named {' or '.join(HEAD_NAMES)}")
        return cls(model.base_model, head).to(device)

    def add_lora(self, peft_config) -> None:
        """Train LoRA adapters (a peft ``LoraConfig``) on the trunk instead of its weights; the head still trains."""
        try:
            from peft import get_peft_model
        except ImportError:
            raise ImportError("LoRA on the value model needs peft: pip install 'grpokit[lora]'.") from None
        if peft_config.task_type is None:
            peft_config = copy.deepcopy(peft_config)
            peft_config.task_type = "FEATURE_EXTRACTION"  # the trunk returns hidden states
        self.trunk = get_peft_model(self.trunk, peft_config)

    def forward(self, batch: Batch, kernels: Kernels | None = None) -> torch.Tensor:
        """Values [n, T] (float32) of the completion tokens of ``batch``, 0 at padding (and past the longest).
        ``kernels``: the run's kernels (default: chosen for the trunk's device, no autocast)."""
        if batch.prompt_ids is None:
            raise ValueError(
                "the value model needs the Hugging Face batch layout (prompt_ids); build the batch for a "
                "Hugging Face policy."
            )
        T = batch.completion_ids.size(1)
        width = max(int(batch.completion_mask.sum(1).max()), 1)
        trunk = self.trunk.get_base_model() if hasattr(self.trunk, "get_base_model") else self.trunk
        if kernels is None:
            kernels = Kernels.select(self.head.weight.device, None)
        hidden = completion_features(trunk, self.head, batch, width, kernels)  # [n, w, H]
        values = self.head(hidden.to(self.head.weight.dtype)).squeeze(-1).float()  # [n, w, 1] -> [n, w]
        values = values * batch.completion_mask[:, :width].to(values.dtype)  # [n, w]
        return F.pad(values, (0, T - width))  # [n, T]


def _new_head(trunk: torch.nn.Module) -> torch.nn.Linear:
    config = trunk.config
    hidden_size = config.get_text_config().hidden_size
    weight = next(trunk.parameters())
    head = torch.nn.Linear(hidden_size, 1, device=weight.device, dtype=weight.dtype)
    torch.nn.init.normal_(head.weight, std=getattr(config, "initializer_range", 0.02))
    torch.nn.init.zeros_(head.bias)
    return head
