"""The ``reward_model`` reward: custom torch modules and a tiny saved HF sequence classifier."""

import math

import pytest
import torch

from grpokit.rewards import RewardError, get_reward
from grpokit.rewards.judge import RewardModelReward


class DigitTokenizer:
    """encode: each digit character is a token id (0 is never produced, so it can pad)."""

    def encode(self, text):
        return [int(ch) for ch in text if ch in "123456789"]


class SumModel(torch.nn.Module):
    """Score = sum of token ids, shape [B]; takes no attention_mask (padding with 0 is harmless)."""

    def forward(self, input_ids):
        return input_ids.sum(dim=-1).float()


class LengthModel(torch.nn.Module):
    """Score = number of real tokens, shape [B, 1]: only right if the attention_mask is passed."""

    def forward(self, input_ids, attention_mask=None):
        return attention_mask.sum(dim=-1, keepdim=True).float()


class TwoClassModel(torch.nn.Module):
    """Logits [B, 2] = [0, log(sum)], so softmax p(class 1) = sum / (1 + sum)."""

    def forward(self, input_ids, **kwargs):
        total = input_ids.sum(dim=-1).float()
        return (torch.stack([torch.zeros_like(total), total.log()], dim=-1),)


def test_module_scores_logit_and_sigmoid():
    tokenizer = DigitTokenizer()
    logit = RewardModelReward(SumModel(), tokenizer, output="logit", text="completion")
    # "12" -> 1 + 2 = 3, "9" -> 9, "x" -> no tokens -> 0.
    assert logit(["5", "5", "5"], ["12", "9", "x"]) == [3.0, 9.0, 0.0]
    with_prompt = RewardModelReward(SumModel(), tokenizer, output="logit")
    assert with_prompt(["5", "5"], ["12", "9"]) == [8.0, 14.0]  # prompt "5" adds 5
    sigmoid = get_reward("reward_model", model=SumModel(), tokenizer=tokenizer, text="completion")
    # sigmoid(3) = 1 / (1 + e^-3) = 0.952574...
    assert sigmoid([""], ["12"]) == [pytest.approx(1 / (1 + math.exp(-3)))]


def test_attention_mask_is_passed_and_batches_are_split():
    fn = RewardModelReward(LengthModel(), DigitTokenizer(), output="logit", batch_size=2)
    # Lengths 1, 3, 2 in batches [1, 3] (padded to 3) and [2].
    assert fn(["", "", ""], ["1", "123", "45"]) == [1.0, 3.0, 2.0]


def test_max_length_truncates():
    fn = RewardModelReward(LengthModel(), DigitTokenizer(), output="logit", max_length=3)
    assert fn([""], ["12345"]) == [3.0]


def test_two_class_prob_and_label():
    tokenizer = DigitTokenizer()
    prob = RewardModelReward(TwoClassModel(), tokenizer, output="prob")
    # sums 3 and 1: p = 3/4 and 1/2.
    assert prob(["", ""], ["12", "1"]) == [pytest.approx(0.75), pytest.approx(0.5)]
    negative = RewardModelReward(TwoClassModel(), tokenizer, output="prob", label=0)
    assert negative([""], ["12"]) == [pytest.approx(0.25)]
    logit = RewardModelReward(TwoClassModel(), tokenizer, output="logit")
    assert logit([""], ["12"]) == [pytest.approx(math.log(3))]
    with pytest.raises(RewardError, match="label 2"):
        RewardModelReward(TwoClassModel(), tokenizer, label=2)([""], ["1"])


def test_bad_shapes_and_params():
    class Wrong(torch.nn.Module):
        def forward(self, input_ids):
            return torch.zeros(input_ids.shape[0], 2, 2)

    with pytest.raises(RewardError, match="shape"):
        RewardModelReward(Wrong(), DigitTokenizer())([""], ["1"])
    with pytest.raises(ValueError, match="tokenizer"):
        RewardModelReward(SumModel())
    with pytest.raises(ValueError, match="output"):
        RewardModelReward(SumModel(), DigitTokenizer(), output="softmax")


def test_model_is_frozen_and_in_eval_mode():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Dropout(0.5))
    model.train()
    RewardModelReward(model, DigitTokenizer())
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())


WORDS = ["[PAD]", "[UNK]", "good", "bad", "answer", "is", "the", "four", "five"]


def _save_tiny_classifier(folder, num_labels):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import GPT2Config, GPT2ForSequenceClassification, PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(WORDS),
        n_embd=16,
        n_layer=1,
        n_head=2,
        n_positions=32,
        num_labels=num_labels,
        pad_token_id=0,
    )
    model = GPT2ForSequenceClassification(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


@pytest.mark.parametrize(("num_labels", "output"), [(1, "sigmoid"), (1, "logit"), (3, "prob")])
def test_saved_hf_classifier(tmp_path, num_labels, output):
    model, tokenizer = _save_tiny_classifier(tmp_path, num_labels)
    fn = get_reward("reward_model", model=str(tmp_path), output=output, batch_size=2)
    prompts = ["the answer is ", "the answer is ", "the answer is "]
    completions = ["four", "five good good bad", "bad"]  # different lengths: padding matters
    rewards = fn(prompts, completions)
    # Oracle: each sequence alone (no padding) through the model we saved.
    for prompt, completion, reward in zip(prompts, completions, rewards):
        ids = torch.tensor([tokenizer.encode(prompt + completion)])
        with torch.no_grad():
            logits = model(ids).logits[0]
        if output == "prob":
            expected = torch.softmax(logits, dim=-1)[1]
        else:
            expected = logits[0] if output == "logit" else torch.sigmoid(logits[0])
        assert reward == pytest.approx(expected.item(), abs=1e-5)
