"""grpokit computes what TRL's GRPOTrainer computes, on the same model and the same batch.

The benchmark (bench/vs_trl.py) times both libraries on "the same GRPO steps"; this checks that the
steps are the same work. TRL's own code (``GRPOTrainer._get_per_token_logps_and_entropies`` and
``_compute_loss``, TRL pinned in constraints.txt) is run on a batch sampled by grpokit, next to
grpokit's learner functions on a second copy of the model loaded from the same folder:

* per-token log-probs: grpokit's shared-prefix pass through the fused LM head against TRL's full
  forward over [left-padded prompt | completion] (float32, 1e-5);
* the loss and its gradient for each loss type both libraries define (grpo, bnpo, dr_grpo, dapo,
  GSPO's sequence-level ratio, two-sided clipping (delta), cispo, sapo, luspo, vespo, each with settings off
  their defaults), off-policy (old log-probs away from the current ones, so the clipping is active on both
  sides) and with the k3 KL to a reference that differs from the policy, plain (grpokit's default) and
  importance-weighted (``use_bias_correction_kl``, TRL's default);
* the off-policy sequence mask and the high-entropy token mask (``off_policy_mask_threshold``,
  ``top_entropy_quantile``: TRL computes its entropies in ``_compute_loss``, grpokit in its log-prob pass);
* the gradient of a whole ``Learner.update`` over two micro-batches against TRL's two accumulation
  steps on the same halves (the learner's micro-batch scaling against TRL's normalizers), for each
  aggregation and with both masks.

The per-micro-batch checks run TRL in eval mode, where its loss is not divided by the accumulation
steps (grpokit's learner does that division itself, outside ``policy_loss``).
"""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
from shared_helpers import loss_spec, sampling_params, save_tiny_moe

from grpokit.algos import LossSpec, get_loss, high_entropy_mask, policy_loss
from grpokit.models.loading import load_model
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer
from grpokit.train.learning.policy_logprobs import build_batch, completion_logprobs

trl = pytest.importorskip(
    "trl", reason="the TRL parity test needs TRL: pip install 'grpokit[bench]' (make test installs it)"
)
pytestmark = pytest.mark.slow

CPU = torch.device("cpu")
G, T, TEMPERATURE, BETA = 4, 10, 0.7, 0.04
PROMPTS = [[20, 21, 22], [30, 31, 32, 33, 34, 35, 36], [40, 41]]  # ragged: left padding in TRL's layout


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(TRL trainer, its model, grpokit's model, the grpokit batch, the TRL inputs without loss terms)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    folder = tmp_path_factory.mktemp("model")
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(60)])
    build_tiny_causal_lm(folder, tokenizer=tokenizer, arch="qwen2", num_kv_heads=2)
    ours = load_model(str(folder), torch.float32, CPU)
    engine = HFRolloutEngine(ours, list(range(2, 12)), tokenizer.pad_token_id, CPU, seed=5)
    rollouts = engine.generate(PROMPTS, G, sampling_params(max_completion_length=T, temperature=TEMPERATURE))
    assert len(set(rollouts.completion_lengths.tolist())) > 2  # ragged completions: right padding too
    batch = build_batch(ours, rollouts, tokenizer.pad_token_id, CPU)

    checkpointing = {
        "activation_checkpointing"
        if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
        else "gradient_checkpointing": False
    }
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl")),
        use_cpu=True,
        bf16=False,
        **checkpointing,
        per_device_train_batch_size=len(PROMPTS) * G,
        num_generations=G,
        max_completion_length=T,
        temperature=TEMPERATURE,
        beta=BETA,
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(folder),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "w1 w2"}] * 4),
        processing_class=tokenizer,
    )
    theirs = trainer.model.float().eval()
    ours.eval()
    inputs = {
        "prompt_ids": batch.prompt_ids[batch.group_index],  # [N, P] left-padded, one row per completion
        "prompt_mask": batch.prompt_mask[batch.group_index],
        "completion_ids": batch.completion_ids,  # [N, T] right-padded
        "completion_mask": batch.completion_mask.long(),
    }
    return trainer, theirs, ours, batch, inputs


def trl_logprobs(trainer, model, inputs):
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    return trainer._get_per_token_logps_and_entropies(model, input_ids, mask, inputs["completion_ids"].size(1))[0]


def loss_terms(trainer, model, inputs, mask, seed):
    """(old, ref, advantages): old log-probs away from the current ones (ratios well beyond 1 +- 0.28, so
    both clip branches are taken), a reference that differs from the policy, advantages of both signs."""
    noise = lambda k: torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed + k))
    with torch.no_grad():
        current = trl_logprobs(trainer, model, inputs)
    return (current + 0.3 * noise(0)) * mask, (current + 0.5 * noise(1)) * mask, torch.linspace(-1.5, 1.5, mask.size(0))


# Each case: (loss_type, importance_sampling_level, settings off the defaults). cispo's cap (epsilon_high) is the
# weight itself: 1.3 caps some of the noisy ratios and not others.
CASES = {
    "grpo": ("grpo", "token", {}),
    "bnpo": ("bnpo", "token", {}),
    "dr_grpo": ("dr_grpo", "token", {}),
    "dapo": ("dapo", "token", {}),
    "gspo": ("grpo", "sequence", {}),
    "delta": ("dapo", "token", {"delta": 1.5}),
    "cispo": ("cispo", "token", {"epsilon_high": 1.3}),
    "cispo_sequence": ("cispo", "sequence", {"epsilon_high": 1.3}),
    "sapo": ("sapo", "token", {"sapo_temperature_pos": 0.9, "sapo_temperature_neg": 1.3}),
    "sapo_sequence": ("sapo", "sequence", {}),
    "luspo": ("luspo", "sequence", {}),
    "luspo_token": ("luspo", "token", {}),
    "vespo": (
        "vespo",
        "token",
        {"vespo_k_pos": 1.5, "vespo_lambda_pos": 2.5, "vespo_k_neg": 2.5, "vespo_lambda_neg": 1.5},
    ),
}
# TRL reads these from its args at every call; the defaults of both libraries
LOSS_SETTINGS = {
    "delta": None,
    "sapo_temperature_pos": 1.0,
    "sapo_temperature_neg": 1.05,
    "vespo_k_pos": 2.0,
    "vespo_lambda_pos": 3.0,
    "vespo_k_neg": 3.0,
    "vespo_lambda_neg": 2.0,
}


def set_trl_loss(trainer, loss_type, level, corrected, settings=None):
    settings = settings or {}
    trainer.loss_type, trainer.importance_sampling_level = loss_type, level
    trainer.epsilon_low, trainer.epsilon_high = 0.2, settings.get("epsilon_high", 0.28)
    trainer.args.use_bias_correction_kl = corrected
    for key, default in LOSS_SETTINGS.items():
        setattr(trainer.args, key, settings.get(key, default))


def our_spec(loss_type, level, corrected, settings=None, **more) -> LossSpec:
    settings = dict(settings or {})
    own = get_loss(loss_type).params  # sapo's and vespo's settings are their loss's own parameters
    own_names = {f.name for f in fields(own)} if own is not None else set()
    params = get_loss(loss_type).make_params({k: settings.pop(k) for k in own_names & set(settings)})
    return loss_spec(
        loss_type=loss_type,
        epsilon=0.2,
        epsilon_high=settings.pop("epsilon_high", 0.28),
        beta=BETA,
        use_bias_correction_kl=corrected,
        importance_sampling_level=level,
        max_completion_length=T,
        params=params,
        **settings,
        **more,
    )


def assert_same_gradients(ours, grads, theirs):
    expected = dict(theirs.named_parameters())
    for (name, _), grad in zip(ours.named_parameters(), grads):
        torch.testing.assert_close(grad, expected[name].grad, atol=1e-6, rtol=1e-4, msg=name)


def test_logprobs_equal_trl(both):
    trainer, theirs, ours, batch, inputs = both
    with torch.no_grad():
        expected = trl_logprobs(trainer, theirs, inputs)  # [N, T]
        got, _ = completion_logprobs(ours, batch, TEMPERATURE)
    mask = batch.completion_mask.bool()
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=0)


def trl_loss_and_gradients(trainer, theirs, inputs, advantages, old, ref, num_items):
    theirs.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(
        theirs,
        inputs
        | {
            "advantages": advantages,
            "old_per_token_logps": old,
            "ref_per_token_logps": ref,
            "num_items_in_batch": num_items,
        },
    )
    loss.backward()
    return loss


@pytest.mark.parametrize("corrected", [False, True], ids=["k3", "bias_corrected_kl"])
@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_gradients_equal_trl(both, case, corrected):
    trainer, theirs, ours, batch, inputs = both
    loss_type, level, settings = CASES[case]
    mask = batch.completion_mask.float()
    old, ref, advantages = loss_terms(trainer, theirs, inputs, mask, seed=1)
    num_items = mask.sum()
    set_trl_loss(trainer, loss_type, level, corrected, settings)
    trl_loss = trl_loss_and_gradients(trainer, theirs, inputs, advantages, old, ref, num_items)

    ours.zero_grad(set_to_none=True)
    logprobs, _ = completion_logprobs(ours, batch, TEMPERATURE)
    spec = our_spec(loss_type, level, corrected, settings)
    loss, _ = policy_loss(logprobs, old, advantages, mask, spec, ref_logprobs=ref, num_items_in_batch=num_items)
    loss.backward()

    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-5, abs=1e-7)
    assert_same_gradients(ours, [p.grad for p in ours.parameters()], theirs)


@pytest.mark.parametrize("case", ["dapo", "grpo", "cispo", "vespo"])
def test_masks_equal_trl(both, case):
    # off_policy_mask_threshold 0.05 drops some negative-advantage sequences of the noisy old log-probs;
    # top_entropy_quantile 0.5 keeps half of the tokens, chosen by each library's own entropies
    trainer, theirs, ours, batch, inputs = both
    loss_type, level, settings = CASES[case]
    mask = batch.completion_mask.float()
    old, ref, advantages = loss_terms(trainer, theirs, inputs, mask, seed=2)
    num_items = mask.sum()
    set_trl_loss(trainer, loss_type, level, False, settings)
    trainer.off_policy_mask_threshold, trainer.top_entropy_quantile = 0.05, 0.5
    try:
        trl_loss = trl_loss_and_gradients(trainer, theirs, inputs, advantages, old, ref, num_items)
    finally:
        trainer.off_policy_mask_threshold, trainer.top_entropy_quantile = None, 1.0

    ours.zero_grad(set_to_none=True)
    logprobs, entropy = completion_logprobs(ours, batch, TEMPERATURE, with_entropy=True)
    keep = high_entropy_mask(entropy.detach(), mask, 1.0 - 0.5)
    assert 0.3 < keep.sum() / mask.sum() < 0.7
    spec = our_spec(loss_type, level, False, settings, off_policy_mask_threshold=0.05)
    loss, metrics = policy_loss(
        logprobs, old, advantages, mask, spec, ref_logprobs=ref, num_items_in_batch=num_items, token_mask=keep
    )
    assert 0 < metrics["off_policy_mask/dropped_fraction"] < 0.5  # some sequences dropped, not every one
    loss.backward()

    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-5, abs=1e-7)
    assert_same_gradients(ours, [p.grad for p in ours.parameters()], theirs)


class _Capture(torch.optim.Optimizer):
    """Records the gradients it is asked to step with (and changes nothing)."""

    def __init__(self, params):
        super().__init__(params, {"lr": 1.0})
        self.grads = None

    def step(self, closure=None):
        self.grads = [p.grad.clone() for group in self.param_groups for p in group["params"]]


def trl_two_accumulation_steps(trainer, theirs, inputs, mask, terms, sync=None) -> None:
    """TRL's _compute_loss in train mode on rows 0-5, then 6-11 (two accumulation steps, ``terms``: old, ref and
    advantages), each backward, the gradients summed in ``theirs``; ``sync(last)`` before each (the accelerator's
    sync_gradients)."""
    old, ref, advantages = terms
    trainer.current_gradient_accumulation_steps = trainer.args.steps_per_generation = 2
    theirs.zero_grad(set_to_none=True)
    theirs.train()
    try:
        for rows in (slice(0, 6), slice(6, 12)):
            part = {k: v[rows] for k, v in inputs.items()} | {
                "advantages": advantages[rows],
                "old_per_token_logps": old[rows],
                "ref_per_token_logps": ref[rows],
                "num_items_in_batch": mask.sum(),
            }
            if sync is not None:
                sync(rows.start == 6)
            trainer._compute_loss(theirs, part).backward()
    finally:
        theirs.eval()


def two_micro_batches(loss_type, level, settings, **more):
    """grpokit's config of the same update: micro-batches of 6 rows, 2 of them a step, TRL's clip (0.2, 0.28 high
    unless ``settings`` says), no gradient clipping; ``more`` added."""
    from grpokit.config import GRPOConfig

    loss = dict(
        loss_type=loss_type, importance_sampling_level=level, epsilon=0.2, **({"epsilon_high": 0.28} | settings)
    )
    sampling = dict(max_completion_length=T, temperature=TEMPERATURE, max_grad_norm=0.0)
    batches = dict(num_generations=G, per_device_train_batch_size=6, gradient_accumulation_steps=2)
    return GRPOConfig(**batches, beta=BETA, **loss, **sampling, **more)


def captured_update(ours, cfg):
    """A Learner on ``ours`` whose optimizer only keeps the gradients it is asked to step with."""
    from grpokit.compose.specs import learner_spec
    from grpokit.train.learning.learner import Learner

    optimizer = _Capture(ours.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    ours.zero_grad(set_to_none=True)
    return Learner(ours, None, optimizer, scheduler, learner_spec(cfg)), optimizer


@pytest.mark.parametrize("masks", [False, True], ids=["", "masks"])
@pytest.mark.parametrize("case", ["grpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
def test_accumulated_update_equals_trl(both, case, masks):
    # Learner.update over 2 micro-batches of 6 rows against TRL's _compute_loss in train mode on the same
    # two halves with 2 accumulation steps: the summed gradients (grpokit divides by the micro-batch count,
    # except a batch-normalised loss (dapo's aggregation), normalised by the whole batch's tokens; TRL the same
    # through its normalizers). With masks: the off-policy mask and the high-entropy mask of each micro-batch.
    trainer, theirs, ours, batch, inputs = both
    loss_type, level, settings = CASES[case]
    mask = batch.completion_mask.float()
    old, ref, advantages = loss_terms(trainer, theirs, inputs, mask, seed=3)
    set_trl_loss(trainer, loss_type, level, False, settings)
    mask_settings = {"off_policy_mask_threshold": 0.05, "top_entropy_quantile": 0.5} if masks else {}
    for key, value in mask_settings.items():
        setattr(trainer, key, value)
    try:
        trl_two_accumulation_steps(trainer, theirs, inputs, mask, (old, ref, advantages))
    finally:
        trainer.off_policy_mask_threshold, trainer.top_entropy_quantile = None, 1.0

    learner, optimizer = captured_update(ours, two_micro_batches(loss_type, level, settings, **mask_settings))
    try:
        learner.update(batch, advantages, batch.completion_mask, ref, old_logprobs=old)
    finally:
        ours.eval()
    assert_same_gradients(ours, optimizer.grads, theirs)


@pytest.mark.parametrize("adaptive", [False, True], ids=["static", "adaptive"])
@pytest.mark.parametrize("case", ["grpo", "dapo", "luspo"])
def test_entropy_bonus_update_equals_trl(both, case, adaptive):
    # TRL's entropy bonus (entropy_coef; Skywork-OR1's adaptive control) in _compute_loss over two accumulation
    # steps against Learner.update over two micro-batches: the same gradients (so the same L_policy - c x H per
    # micro-batch / accumulation steps, whatever the loss type's normalisation), and the adaptive coefficient
    # moved once, by the same rule, from the same window entropy.
    trainer, theirs, ours, batch, inputs = both
    loss_type, level, settings = CASES[case]
    mask = batch.completion_mask.float()
    old, ref, advantages = loss_terms(trainer, theirs, inputs, mask, seed=4)
    set_trl_loss(trainer, loss_type, level, False, settings)
    trainer.entropy_coef, trainer.use_adaptive_entropy, trainer._entropy_bonus_enabled = 0.3, adaptive, True
    trainer._last_world_entropy, trainer._entropy_window_stats = 0.0, None  # adaptive: the bonus applies this step
    trainer.args.entropy_target, trainer.args.entropy_coef_delta = 100.0, 0.05  # under the target: up by 0.05
    trainer.args.entropy_coef_min, trainer.args.entropy_coef_max = 0.0, 1.0
    state = trainer.accelerator.gradient_state
    try:  # the optimizer step ends with the second micro-batch
        trl_two_accumulation_steps(trainer, theirs, inputs, mask, (old, ref, advantages), state._set_sync_gradients)
    finally:
        state._set_sync_gradients(True)
        trl_coef = trainer.entropy_coef
        trainer.entropy_coef, trainer.use_adaptive_entropy, trainer._entropy_bonus_enabled = 0.0, False, False

    entropy = dict(entropy_coef=0.3, use_adaptive_entropy=adaptive, entropy_target=100.0, entropy_coef_delta=0.05)
    learner, optimizer = captured_update(ours, two_micro_batches(loss_type, level, settings, **entropy))
    learner.terms.entropy.last_entropy = 0.0  # as TRL's _last_world_entropy above
    try:
        learner.update(batch, advantages, batch.completion_mask, ref, old_logprobs=old)
    finally:
        ours.eval()
    assert_same_gradients(ours, optimizer.grads, theirs)
    assert learner.terms.entropy.coef == pytest.approx(trl_coef) == pytest.approx(0.35 if adaptive else 0.3)


def test_router_loss_equals_trl(both, tmp_path):
    # A mixture-of-experts policy: grpokit's forward with router logits (train.loss_terms.policy_forward) against
    # TRL's _get_per_token_logps_and_entropies(compute_aux_loss=True) on the same batch: the same load-balancing
    # loss and log-probs; and both libraries read the coefficient from the model's config (aux_loss_enabled).
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpokit.kernels import Kernels
    from grpokit.train.learning.loss_terms import LossTerms, policy_forward
    from grpokit.train.learning.terms_settings import LossTermsSettings

    _, _, _, batch, inputs = both
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(60)])  # the fixture's ids
    save_tiny_moe(tmp_path / "moe", tokenizer, router_aux_loss_coef=0.02, seed=1)
    trainer = GRPOTrainer(
        model=str(tmp_path / "moe"),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=GRPOConfig(
            output_dir=str(tmp_path / "trl"),
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=len(PROMPTS) * G,
            num_generations=G,
            max_completion_length=T,
            temperature=TEMPERATURE,
            report_to="none",
            disable_tqdm=True,
        ),
        train_dataset=Dataset.from_list([{"prompt": "w1 w2"}] * 4),
        processing_class=tokenizer,
    )
    theirs = trainer.model.float().eval()
    ours = load_model(str(tmp_path / "moe"), torch.float32, CPU).eval()
    terms = LossTerms(LossTermsSettings(), ours)  # the settings' defaults: bonus off, the model's router coefficient
    assert (
        (terms.aux_enabled, terms.aux_coef)
        == (trainer.aux_loss_enabled, trainer.router_aux_loss_coef)
        == (
            True,
            0.02,
        )
    )
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        trl_logprobs, _, trl_aux = trainer._get_per_token_logps_and_entropies(
            theirs, input_ids, attention, T, compute_aux_loss=True
        )
        logprobs, _, aux, _ = policy_forward(ours, batch, TEMPERATURE, Kernels.select(CPU), router_aux=True)
    mask = batch.completion_mask.bool()
    torch.testing.assert_close(logprobs[mask], trl_logprobs[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(aux, trl_aux, atol=1e-5, rtol=1e-5)
