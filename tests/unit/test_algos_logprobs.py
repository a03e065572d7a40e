import math

import pytest
import torch

from grpokit.algos import entropy_from_logits, selective_logprobs


def _naive_logprobs(logits, token_ids, temperature=1.0):
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # full [N, T, V]
    return logp.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)


def _naive_entropy(logits, temperature=1.0):
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _batch(seed, n=3, t=5, v=11, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(n, t, v, generator=gen)).to(dtype)
    token_ids = torch.randint(0, v, (n, t), generator=gen)
    return logits, token_ids


def test_by_hand():
    # logits [0, ln 3] -> p = [0.25, 0.75]; log p(token 1) = ln 0.75 = -0.287682
    # H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.346574 + 0.215762 = 0.562335
    # uniform over 4 -> log p = -ln 4 = -1.386294, H = ln 4
    logits = torch.tensor([[[0.0, math.log(3.0), -1e4, -1e4], [1.0, 1.0, 1.0, 1.0]]])
    token_ids = torch.tensor([[1, 2]])
    torch.testing.assert_close(selective_logprobs(logits, token_ids), torch.tensor([[-0.287682, -1.386294]]))
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([[0.562335, 1.386294]]))


def test_temperature_by_hand():
    # logits [0, 2 ln 3] at temperature 2 -> [0, ln 3] -> log p(token 0) = ln 0.25 = -1.386294
    logits = torch.tensor([[0.0, 2 * math.log(3.0)]])
    assert selective_logprobs(logits, torch.tensor([0]), temperature=2.0).item() == pytest.approx(-1.386294, abs=1e-6)
    assert entropy_from_logits(logits, temperature=2.0).item() == pytest.approx(0.562335, abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_float32_matches_naive(temperature):
    logits, token_ids = _batch(0)
    torch.testing.assert_close(
        selective_logprobs(logits, token_ids, temperature), _naive_logprobs(logits, token_ids, temperature)
    )
    torch.testing.assert_close(entropy_from_logits(logits, temperature), _naive_entropy(logits, temperature))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_is_computed_in_float32(dtype):
    logits, token_ids = _batch(1, dtype=dtype)
    logprobs = selective_logprobs(logits, token_ids, 0.9)
    assert logprobs.dtype == torch.float32
    # same as the float32 computation on the upcast logits ...
    torch.testing.assert_close(logprobs, _naive_logprobs(logits.float(), token_ids, 0.9))
    torch.testing.assert_close(entropy_from_logits(logits, 0.9), _naive_entropy(logits.float(), 0.9))
    # ... and close to a log_softmax done in the low-precision dtype itself
    low = torch.log_softmax(logits / 0.9, dim=-1).gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logprobs, low.float(), atol=0.1, rtol=0.02)


@pytest.mark.parametrize("chunk_size", [1, 2, 4, 1000])
def test_chunking_gives_identical_results(chunk_size):
    logits, token_ids = _batch(2)
    assert torch.equal(
        selective_logprobs(logits, token_ids, chunk_size=chunk_size), selective_logprobs(logits, token_ids)
    )
    assert torch.equal(entropy_from_logits(logits, chunk_size=chunk_size), entropy_from_logits(logits))


def test_gradients_match_naive():
    logits, token_ids = _batch(3)
    weights = torch.randn(3, 5)
    ours = logits.clone().requires_grad_(True)
    naive = logits.clone().requires_grad_(True)
    (selective_logprobs(ours, token_ids, 0.8, chunk_size=4) * weights).sum().backward()
    (_naive_logprobs(naive, token_ids, 0.8) * weights).sum().backward()
    torch.testing.assert_close(ours.grad, naive.grad)

    ours.grad, naive.grad = None, None
    (entropy_from_logits(ours, 0.8, chunk_size=4) * weights).sum().backward()
    (_naive_entropy(naive, 0.8) * weights).sum().backward()
    torch.testing.assert_close(ours.grad, naive.grad)


def test_bf16_gradients_flow_in_input_dtype():
    logits, token_ids = _batch(4, dtype=torch.bfloat16)
    logits.requires_grad_(True)
    selective_logprobs(logits, token_ids).sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    reference = logits.detach().float().requires_grad_(True)
    _naive_logprobs(reference, token_ids).sum().backward()
    torch.testing.assert_close(logits.grad.float(), reference.grad, atol=1e-2, rtol=1e-2)


def test_gradcheck_float64():
    logits, token_ids = _batch(5, n=2, t=3, v=6, dtype=torch.float64)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: selective_logprobs(x, token_ids, 0.7, chunk_size=2), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, 0.7, chunk_size=2), (logits,))


def test_arbitrary_leading_dims_and_errors():
    logits, token_ids = _batch(6)
    flat = selective_logprobs(logits.reshape(15, 11), token_ids.reshape(15))
    torch.testing.assert_close(flat.view(3, 5), selective_logprobs(logits, token_ids))
    with pytest.raises(ValueError, match="does not match"):
        selective_logprobs(logits, token_ids[:, :4])
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(logits, chunk_size=0)


def test_non_contiguous_and_4d_logits():
    # model logits [N, L, V] sliced to the positions that predict completion tokens
    full, token_ids = _batch(7, t=6)
    full.requires_grad_(True)
    logits = full[:, :-1]  # [3, 5, 11], not contiguous
    assert not logits.is_contiguous()
    ours = selective_logprobs(logits, token_ids[:, :5], chunk_size=3)
    torch.testing.assert_close(ours, _naive_logprobs(logits, token_ids[:, :5]))
    ours.sum().backward()
    assert torch.equal(full.grad[:, -1], torch.zeros(3, 11))  # the dropped position gets no gradient
    # d log p(token) / d logits = onehot - softmax, which sums to 0 over the vocabulary
    torch.testing.assert_close(full.grad[:, :-1].sum(-1), torch.zeros(3, 5), atol=1e-6, rtol=0)

    four_d = full.detach().view(3, 2, 3, 11)
    torch.testing.assert_close(entropy_from_logits(four_d, chunk_size=2), _naive_entropy(full.detach()).view(3, 2, 3))
    with pytest.raises(ValueError, match="logits"):
        entropy_from_logits(torch.zeros(4))
