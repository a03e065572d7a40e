"""FSDP (``distributed.strategy: fsdp``): parameters, gradients and AdamW states sharded over ranks.

torch's FSDP2 (``torch.distributed.fsdp.fully_shard``): each decoder layer (the classes an HF model
lists in ``_no_split_modules``) is one unit, the root holds the rest (embeddings, final norm, head);
a custom module without that list is one unit. A unit's parameters are all-gathered for its forward
and backward and freed afterwards; gradients are reduce-scattered (averaged over ranks, like DDP).
Runs on CUDA with NCCL and on CPU with gloo.

Loading: no rank but rank 0 ever holds the whole model. Rank 0 loads the weights on the CPU; every other rank builds
the model on the meta device (no memory) (:func:`initial_placement`). :func:`shard_from_rank0` shards both the same
way, gives the meta ranks empty shards on their device, and fills every shard from rank 0's full state dict
(``set_model_state_dict(..., StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))``), buffers
broadcast after. Under mixed precision (:mod:`grpokit.machine.precision`) the units gather parameters in the compute
dtype and reduce gradients in float32 (``MixedPrecisionPolicy``); the sharded master weights and AdamW stay float32.

Weights leaving the learner (:func:`stream_full_parameters`) go one parameter at a time: each is all-gathered, handed
over and dropped before the next, as TRL streams FSDP2 weights into vLLM; the Ray rollout workers' copy is built so.

Every forward call of a sharded model goes through it as it is, sampling included: each decoder layer unit is
all-gathered for its forward and resharded after, so a rank holds at most the root's full parameters (embeddings,
final norm, head) and one layer's (on CUDA, where the next layer's all-gather may start before the last one is
freed, two layers') beyond its shards. All-gathers need every rank to call forward the same number of times;
passes that every rank runs alike (training micro-batches, the reference and old-policy passes) do, sampling does
not (a rank decodes until its own rows finish, and evaluation samples on rank 0 alone). Sampling and evaluation
therefore run inside a :class:`Lockstep` block: before each forward call the ranks agree, with one all_reduce,
whether any of them still has one to make; a rank with none makes a padding call (one token, output discarded)
until every rank is done. grpokit's engine (``generation.engine: hf``) decodes a sharded model through its own
forward, never the fused CPU decoder or packed weights, which copy the weights (:mod:`grpokit.kernels.selection`).

Every function here that gathers is collective: all ranks must call it at the same point.
"""

from __future__ import annotations

import torch


def initial_placement(*, strategy: str, world_size: int, rank: int, plain_load: bool) -> torch.device | None:
    """Where a torchrun rank loads the policy before FSDP shards it: rank 0 on the CPU (its shards then move to its
    GPU), every other rank on the meta device; None (the run's device, as without FSDP) for one process, DDP, or a
    load that cannot start on meta (``plain_load`` False: 4-bit, LoRA, a critic copied from the policy)."""
    if strategy != "fsdp" or world_size <= 1 or not plain_load:
        return None
    return torch.device("cpu" if rank == 0 else "meta")


def shard_model(model: torch.nn.Module, mp_policy=None) -> torch.nn.Module:
    """Shard ``model`` in place (its class becomes an FSDP subclass; parameters become DTensors); ``mp_policy``: a
    ``MixedPrecisionPolicy`` (:func:`grpokit.machine.precision.fsdp_mixed_precision`) or None."""
    from torch.distributed.fsdp import fully_shard

    kw = {} if mp_policy is None else {"mp_policy": mp_policy}
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    in_tower = _vision_tower_modules(model)
    for module in model.modules():
        if type(module).__name__ in layer_classes and id(module) not in in_tower:
            fully_shard(module, **kw)
    fully_shard(model, **kw)
    if not any(p.requires_grad for p in model.parameters()):
        # fully_shard keeps the root's parameters gathered from forward until backward; a frozen model
        # (the reference) has no backward, so they would stay gathered: free them after each forward
        model.set_reshard_after_forward(True)
    return model


def _vision_tower_modules(model: torch.nn.Module) -> set[int]:
    """ids of the modules of a vision-language model's vision tower (none for a text model). They stay in the root
    unit, gathered with it on every forward call: a separate unit of the tower would be all-gathered only by the
    calls that carry images, so a rank decoding text, padding a Lockstep round or evaluating would not join the
    collective another rank's prefill with images makes (gloo: "Received data size doesn't match expected size")."""
    from grpokit.models.vision import is_vision_config, parts

    if not is_vision_config(getattr(model, "config", None)):
        return set()
    tower = parts(model)["tower"]
    return set() if tower is None else {id(m) for m in tower.modules()}


def shard_from_rank0(model: torch.nn.Module, *, is_main: bool, device: torch.device, mp_policy=None) -> torch.nn.Module:
    """Shard ``model`` and load every rank's shard from rank 0's weights (collective). Rank 0's ``model`` holds the
    weights (on the CPU or its device); the others' may be on the meta device (:func:`initial_placement`) or hold
    anything (they are overwritten). Tied weights stay tied (one parameter, sharded once)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    full = dict(model.state_dict()) if is_main else {}
    shard_model(model, mp_policy)
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        model.to_empty(device=device)
    set_model_state_dict(model, full, options=_options(broadcast_from_rank0=True))
    del full
    with torch.no_grad():
        for buffer in model.buffers():  # not in the state dict when non-persistent (rotary inv_freq)
            dist.broadcast(buffer, src=0)
    return model


def stream_full_parameters(model: torch.nn.Module, names: set[str] | None = None):
    """``(name, full tensor)`` of each parameter of a sharded ``model`` (those in ``names``, default all), one at a
    time: each is all-gathered when the consumer asks for it and free once the consumer lets it go, so no rank holds
    more than one whole parameter beyond its shards (collective: every rank iterates to the end)."""
    for name, param in model.named_parameters():
        if names is not None and name not in names:
            continue
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        yield name, full.detach()


def flag_device(backend: str, device: torch.device) -> torch.device:
    """Where a collective's small flag tensor lives for a process group on ``backend`` (``dist.get_backend()``):
    the CPU when the group has gloo (alone, or "cpu:gloo,cuda:nccl", grpokit's group on CUDA), else ``device`` (an
    NCCL-only group has no CPU backend)."""
    return torch.device("cpu") if "gloo" in backend else device


class Lockstep:
    """A block in which every rank calls a sharded ``model``'s forward the same number of times (collective).

    Each forward call of the root is preceded by one round: every rank adds 1 ("I call forward now") or 0 ("my
    block is over") to an all_reduce; while the sum is above 0 every rank makes one forward call, a rank with no
    call of its own a padding one (one token, output discarded). A rank leaving the block (``__exit__``) pads
    until a round sums to 0: every rank's block is then over. Each unit thus all-gathers its parameters the same
    number of times on every rank, whatever each rank samples. After the block the root's parameters are freed
    too. An exception leaves the block without padding (the rank stops; torchrun stops the others).

    ``forwards``: this rank's own forward calls in the block; ``padding``: its padding calls.
    """

    def __init__(self, model: torch.nn.Module):
        import torch.distributed as dist

        self.model = model
        self.device = next(model.parameters()).device
        self.flag_device = flag_device(str(dist.get_backend()), self.device)
        self.forwards = self.padding = 0
        self._hook = None
        self._padding = False

    def __enter__(self) -> Lockstep:
        # prepend: before FSDP's own pre-forward hook, whose all-gather of the root must come after the round
        self._hook = self.model.register_forward_pre_hook(self._before_forward, prepend=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._hook.remove()
        if exc_type is not None:
            return
        if self._round(0):
            was_training = self.model.training
            self.model.eval()
            try:
                while True:
                    self._pad()
                    if not self._round(0):
                        break
            finally:
                self.model.train(was_training)
        self.model.reshard()  # the root's parameters (its units resharded after each forward)

    def _before_forward(self, module, args) -> None:
        if self._padding:
            return
        self.forwards += 1
        self._round(1)

    def _round(self, mine: int) -> int:
        """How many ranks call forward in this round (all_reduce of each rank's 0 or 1)."""
        import torch.distributed as dist

        flag = torch.tensor([mine], dtype=torch.int32, device=self.flag_device)
        dist.all_reduce(flag)
        return int(flag.item())

    @torch.no_grad()
    def _pad(self) -> None:
        self.padding += 1
        self._padding = True
        try:
            self.model(torch.zeros((1, 1), dtype=torch.long, device=self.device))
        finally:
            self._padding = False


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0's CPU, {} on other ranks (collective)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(cpu_offload=True))


def full_optimizer_state(model: torch.nn.Module, optimizer) -> dict:
    """The optimizer state with full tensors keyed by parameter name, on rank 0's CPU, {} elsewhere (collective)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))


def load_full_state(
    model: torch.nn.Module, state: dict[str, torch.Tensor], optimizer=None, optimizer_state: dict | None = None
) -> tuple[list[str], list[str]]:
    """Load a full state dict (and optimizer state) that every rank holds into the sharded model, each
    rank keeping its shard (collective). Returns (missing keys, unexpected keys); the optimizer state
    is loaded only when both match."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    result = set_model_state_dict(model, state, options=_options(strict=False))
    if result.missing_keys or result.unexpected_keys:
        return list(result.missing_keys), list(result.unexpected_keys)
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=_options())
    return [], []
