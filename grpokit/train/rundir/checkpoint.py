"""Atomic, exactly-resumable checkpoints.

``RUN/checkpoints/step-N/`` holds the policy weights (safetensors; when some parameters are frozen,
as with LoRA, only the trainable ones: the frozen base is loaded from the source on resume), the
reference weights when the reference is resynced, optimizer and scheduler states, RNG states and the
trainer state (step, data position, counters) with the grpokit version; :class:`RunState` gathers them from
a run's parts. Each folder is written under
a temporary name and renamed into place, and renamed away before it is deleted, so a folder named
step-N is always complete, even after a kill at any moment. Its last file is ``manifest.json`` (``rundir/manifest.py``:
each file's size and SHA-256, and what the store and metrics.jsonl held), which a resume checks before loading.
A write that fails (a full disk) removes the temporary folder and raises one :class:`CheckpointError` naming the
file and the cause; the checkpoints before it are untouched.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

from grpokit.system.processes import is_sharded
from grpokit.train.rundir.manifest import ManifestError, verify_folder, write_manifest
from grpokit.version import __version__

if TYPE_CHECKING:
    from grpokit.train.learning.reference_settings import ReferenceSettings
    from grpokit.train.rundir.settings import CheckpointSettings

STEP_DIR = re.compile(r"^step-(\d+)$")
# safetensors metadata of a model.safetensors that holds the trainable parameters only (names as in named_parameters)
TRAINABLE_ONLY = {"format": "pt", "grpokit_weights": "trainable-only"}


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used, with what to do about it."""


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def resolve_resume(run_dir: str | Path, resume_from: str) -> Path | None:
    """The checkpoint folder for ``resume_from`` (latest | a path); None when latest finds nothing."""
    if resume_from == "latest":
        found = list_checkpoints(run_dir)
        return found[-1] if found else None
    path = Path(resume_from)
    if not (path / "trainer_state.json").is_file():
        raise CheckpointError(
            f"resume_from={resume_from!r} is not a checkpoint folder (no trainer_state.json); give "
            "RUN/checkpoints/step-N or 'latest'."
        )
    return path


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model,
    optimizer,
    scheduler,
    trainer_state: dict,
    rng_states: dict,
    reference_model=None,
    save_total_limit: int | None = None,
    pending_rollouts: dict | None = None,
    critic=None,
    run_record: dict | None = None,
) -> Path | None:
    """Write ``step-N`` atomically, its manifest last (``run_record``: what the store and metrics.jsonl hold,
    :meth:`RunLog.seal`). ``pending_rollouts``: async mode's rollouts of step N+1, sampled
    before the checkpoint (a dict of tensors and lists, kept in states.pt). ``critic``: PPO's
    ``train.learning.critic.Critic``: its weights in critic.safetensors (the trainable ones only when its trunk has
    LoRA adapters), its optimizer and scheduler in states.pt.

    With an FSDP-sharded ``model`` every rank calls this: the full weights and optimizer state are
    gathered to rank 0, which writes them (other ranks return None), in the same files as an
    unsharded run."""
    gathered = _gathered(model, optimizer, reference_model)
    if gathered is None:  # FSDP: rank 0 writes
        return None
    weights, optimizer_state, trainable = gathered
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".*-step-*"):  # left by a run killed while saving or deleting
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    writing = tmp
    try:
        tmp.mkdir()
        for name, value in weights.items():
            if value is not None:
                writing = tmp / f"{name}.safetensors"
                _save_weights(value, writing, trainable_only=value is trainable)
        states = {"optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "rng": rng_states}
        if pending_rollouts is not None:
            states["pending_rollouts"] = pending_rollouts
        if critic is not None:
            critic_model, states["critic"] = critic.state()
            critic_trainable = trainable_parameters(critic_model)
            writing = tmp / "critic.safetensors"
            _save_weights(
                critic_model if critic_trainable is None else critic_trainable,
                writing,
                trainable_only=critic_trainable is not None,
            )
        writing = tmp / "states.pt"
        with open(writing, "wb") as f:  # a Python file: a failed write keeps its OSError (torch's own writer does not)
            torch.save(states, f)
        state = dict(trainer_state, step=step, grpokit_version=__version__)
        writing = tmp / "trainer_state.json"
        writing.write_text(json.dumps(state, indent=2))
        writing = tmp / "manifest.json"
        write_manifest(tmp, run_record)  # fsyncs every file; written last
        fsync_dir(tmp)
    except Exception as exc:
        cause = _os_error(exc, tmp)
        if cause is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # the partial files would only hold on to the space
        earlier = [p.name for p in list_checkpoints(run_dir)]
        kept = f"checkpoint {earlier[-1]} and the earlier steps are intact" if earlier else "nothing was lost"
        raise CheckpointError(
            f"cannot write checkpoint {final}: {cause} while writing {writing.name}; {kept}: "
            "fix that, then resume with resume_from=latest."
        ) from None
    _publish(tmp, final, run_dir, step, save_total_limit)
    return final


def _gathered(model, optimizer, reference_model):
    """(weights by file name, the optimizer's state, the trainable parameters or None) to save; under FSDP the full
    ones, gathered to rank 0 (None on the other ranks)."""
    if is_sharded(model):  # FSDP + LoRA is refused by the config: a sharded model is saved whole
        from grpokit.distributed.fsdp import full_optimizer_state, full_state_dict

        weights = {
            "model": full_state_dict(model),
            "reference": None if reference_model is None else full_state_dict(reference_model),
        }
        optimizer_state = full_optimizer_state(model, optimizer)
        return None if torch.distributed.get_rank() != 0 else (weights, optimizer_state, None)
    trainable = trainable_parameters(model)
    weights = {"model": model if trainable is None else trainable, "reference": reference_model}
    return weights, optimizer.state_dict(), trainable


def _publish(tmp: Path, final: Path, run_dir, step: int, save_total_limit: int | None) -> None:
    """Rename the written ``tmp`` folder to ``final`` (replacing an older try of the step), then drop the
    checkpoints over ``save_total_limit``."""
    if final.exists():
        _remove(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if save_total_limit is not None:  # folders of later steps (an older try of this run) are not counted
        done = [p for p in list_checkpoints(run_dir) if step_of(p) <= step]
        for old in done[:-save_total_limit]:
            _remove(old)


def step_of(folder: Path) -> int:
    """N of a ``step-N`` folder."""
    return int(STEP_DIR.match(folder.name).group(1))


def _os_error(exc: BaseException, folder: Path) -> str | None:
    """'No space left on device (ENOSPC)' for a write that failed with an OS error, found in the exception (an
    OSError, or one torch or safetensors wrapped), else by a full filesystem; None when the cause is not the OS."""
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return _errno_text(seen.errno)
        found = re.search(r"os error (\d+)", str(seen))  # safetensors: "... (os error 28)"
        if found:
            return _errno_text(int(found.group(1)))
        seen = seen.__cause__ or seen.__context__
    if not isinstance(exc, RuntimeError):
        return None
    try:
        stats = os.statvfs(folder.parent)
    except OSError:
        return None
    if stats.f_bavail * stats.f_frsize < 1 << 20:  # torch's writer loses the errno; a full disk explains it
        return _errno_text(errno.ENOSPC)
    return None


def _errno_text(code: int) -> str:
    return f"{os.strerror(code)} ({errno.errorcode.get(code, code)})"


class RunState:
    """Everything a checkpoint saves and a resume restores: the policy weights (``model``, unwrapped), the
    ``learner``'s optimizer, LR scheduler and resynced reference weights, the data position (``data``, the
    training PromptSource), the rollout scheduler's state (``rollouts``: policy version, async mode's pending
    step), the stop rules' counters, the learner's KL controller (beta), and the RNG streams (torch's and the
    sampling engine's generator), and of the transformers ``TrainerState`` (``trainer_state``, a callable returning
    the run's ``trainer.state``) what TRL's checkpoints restore: ``log_history`` and ``num_input_tokens_seen``.
    ``spec``: save_total_limit; ``resync``: a resynced reference's weights are saved too.
    ``saved_step``: the newest checkpoint on disk (0: none). ``is_main``: rank 0, which writes (under FSDP the other
    ranks join in to gather)."""

    def __init__(
        self,
        spec: CheckpointSettings,
        resync: ReferenceSettings,
        *,
        model,
        learner,
        data,
        rollouts,
        stop_rules,
        is_main: bool,
        trainer_state=None,
    ):
        self.save_reference = resync.ref_model_sync_steps > 0  # resynced: no longer the starting weights
        self.spec, self.model, self.data, self.rollouts, self.stop_rules = spec, model, data, rollouts, stop_rules
        self.trainer_state = trainer_state
        self.optimizer, self.scheduler, self.reference = learner.optimizer, learner.scheduler, learner.reference
        self.kl_controller = learner.kl_controller
        terms = getattr(learner, "terms", None)
        self.entropy = terms.entropy if terms is not None and terms.entropy.adaptive else None  # its adapted coef
        self.critic = learner.critic
        self.is_main = is_main
        self.saved_step = 0

    def save(self, run_dir: Path, step: int, run_record: dict | None = None) -> bool:
        """Write ``step-N`` (:func:`save_checkpoint`; ``run_record``: rank 0's :meth:`RunLog.seal`); False on a rank
        that takes no part (not rank 0, not sharded)."""
        if not (self.is_main or is_sharded(self.model)):
            return False
        reference = self.reference.model if self.reference is not None else None  # None: LoRA's adapters off
        scheduled, pending = self.rollouts.state_dict()
        state = {"data": self.data.state_dict(), "counters": self.stop_rules.counters, **scheduled}
        state["kl_controller"] = self.kl_controller.state_dict()  # the adaptive beta
        if self.entropy is not None:
            state["entropy_controller"] = self.entropy.state_dict()  # TRL's entropy_coef and last_world_entropy
        if self.trainer_state is not None:  # TRL's trainer_state.json fields a resumed trainer.state starts from
            trainer = self.trainer_state()
            state["num_input_tokens_seen"] = trainer.num_input_tokens_seen
            state["log_history"] = [
                {k: v for k, v in entry.items() if _is_json_number(v)} for entry in trainer.log_history
            ]
        rng = {"torch": torch.get_rng_state(), "sampler": self.rollouts.engine.generator.get_state()}
        save_checkpoint(
            run_dir,
            step,
            self.model,
            self.optimizer,
            self.scheduler,
            state,
            rng,
            reference_model=reference if self.save_reference else None,  # unsynced: the starting weights
            save_total_limit=self.spec.save_total_limit,
            pending_rollouts=pending,
            critic=self.critic,
            run_record=run_record,
        )
        self.saved_step = step
        return True

    def load(self, path: str | Path, verified: bool = False) -> int:
        """Restore everything from the checkpoint folder ``path`` (:func:`load_checkpoint`; ``verified``: its manifest
        was checked already); returns its step."""
        reference = self.reference.model if self.reference is not None else None
        state, rng = load_checkpoint(
            path, self.model, self.optimizer, self.scheduler, reference, critic=self.critic, verified=verified
        )
        self.saved_step = int(state["step"])
        self.data.load_state_dict(state["data"])
        self.rollouts.load_state_dict(state, state["pending_rollouts"])
        self.stop_rules.counters = dict(state["counters"])
        if "kl_controller" in state:  # absent from checkpoints older than the KL controller: a fixed beta then
            self.kl_controller.load_state_dict(state["kl_controller"])
        elif self.kl_controller.adaptive:
            raise CheckpointError(f"{path} holds no KL controller state; resume it with kl_controller: fixed.")
        if self.entropy is not None and "entropy_controller" in state:
            self.entropy.load_state_dict(state["entropy_controller"])
        torch.set_rng_state(rng["torch"])
        self.rollouts.engine.generator.set_state(rng["sampler"])
        if self.trainer_state is not None:  # absent from older checkpoints: the history starts empty then
            trainer = self.trainer_state()
            trainer.num_input_tokens_seen = state.get("num_input_tokens_seen", 0)
            trainer.log_history = list(state.get("log_history", []))
        return self.saved_step


def _is_json_number(value) -> bool:
    """A value trainer_state.json can hold as JSON: an int or a finite float (NaN and inf are not JSON)."""
    return isinstance(value, int) or (isinstance(value, float) and value == value and abs(value) != float("inf"))


def save_final_model(folder: Path, model, tokenizer, is_main: bool, merged: bool = False) -> None:
    """The final model in ``folder`` (RUN/final): ``save_pretrained`` model and tokenizer, or model.safetensors
    for a custom module; with ``merged`` (LoRA, ``merge_on_save``) also the merged model in ``folder/merged``.
    Rank 0 writes; an FSDP-sharded model is first gathered there, so then every rank calls this. Written under a
    temporary name and renamed, so RUN/final is whole or absent; a failed write (a full disk) is one CheckpointError."""
    state = _gathered_state(model)
    if not is_main:
        return
    tmp = folder.with_name(f".tmp-{folder.name}")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while writing it
    try:
        _write_model(tmp, model, tokenizer, state, merged)
    except Exception as exc:
        cause = _os_error(exc, tmp)
        if cause is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"cannot write the final model {folder}: {cause}; the checkpoints are intact: fix that, then resume with "
            "resume_from=latest."
        ) from None
    if folder.exists():
        _remove(folder)
    os.replace(tmp, folder)


def save_model_files(folder: Path, model, tokenizer, is_main: bool) -> None:
    """TRL's ``trainer.save_model(folder)``: the model and tokenizer written into ``folder`` as ``save_pretrained``
    writes them (LoRA: the adapter; a custom module: model.safetensors), beside what the folder holds already (a
    run folder keeps its config, store and checkpoints). Rank 0 writes; under FSDP every rank calls this."""
    state = _gathered_state(model)
    if is_main:
        _write_model(folder, model, tokenizer, state)


def _gathered_state(model) -> dict | None:
    """An FSDP-sharded model's full state dict, gathered to rank 0 (every rank calls it); None: the module's own."""
    if not is_sharded(model):
        return None
    from grpokit.distributed.fsdp import full_state_dict

    return full_state_dict(model)


def _write_model(folder: Path, model, tokenizer, state: dict | None, merged: bool = False) -> None:
    """``save_pretrained`` model (``state``: gathered weights, or None) and tokenizer in ``folder``, or
    model.safetensors for a custom module; with ``merged`` (LoRA) also the merged model in ``folder/merged``."""
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(folder, state_dict=state)
        if merged:
            copy.deepcopy(model).merge_and_unload().save_pretrained(folder / "merged")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        if state is None:
            save_model(model, str(folder / "model.safetensors"))
        else:
            save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(folder)
    from grpokit.models.vision import processor_of

    processor = processor_of(tokenizer)  # a vision-language model's: its image processor too, so the folder loads
    if processor is not None:
        processor.image_processor.save_pretrained(folder)


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The trainable parameters by name when some parameters are frozen (LoRA), else None (the whole model is saved)."""
    params = dict(model.named_parameters())
    trainable = {name: p.detach().cpu().contiguous() for name, p in params.items() if p.requires_grad}
    return trainable if trainable and len(trainable) < len(params) else None


def _save_weights(value, file: Path, trainable_only: bool = False) -> None:
    """A module (tied weights written once), a gathered full state dict (FSDP) or the trainable parameters (LoRA)."""
    if isinstance(value, torch.nn.Module):
        save_model(value, str(file))
    else:
        save_file(value, str(file), metadata=TRAINABLE_ONLY if trainable_only else {"format": "pt"})


def _remove(folder: Path) -> None:
    """Rename, then delete: a kill midway leaves a hidden leftover, never a half-deleted step-N."""
    doomed = folder.with_name(f".del-{folder.name}")
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def verify_checkpoint(path: str | Path) -> dict:
    """Check every file of the checkpoint folder ``path`` against its manifest; returns the manifest, or raises a
    CheckpointError naming the damaged file."""
    try:
        return verify_folder(Path(path))
    except ManifestError as exc:
        raise CheckpointError(f"checkpoint {path} is damaged: {exc}") from None


def load_checkpoint(
    path: str | Path, model, optimizer, scheduler, reference_model=None, critic=None, verified: bool = False
) -> tuple[dict, dict]:
    """Restore weights and optimizer/scheduler in place (and ``critic``'s, PPO); return (trainer_state, rng_states).
    The folder is checked against its manifest first, unless the caller did (``verified``).

    trainer_state gets ``pending_rollouts`` from states.pt (None when none were saved)."""
    path = Path(path)
    if not verified:
        try:
            verify_checkpoint(path)
        except CheckpointError as exc:
            raise CheckpointError(f"{exc}; resume from another checkpoint folder.") from None
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{path}: trainer_state.json is missing or corrupt ({exc}); resume from an earlier checkpoint folder."
        ) from None
    if state.get("grpokit_version") != __version__:
        raise CheckpointError(
            f"{path} was written by grpokit {state.get('grpokit_version')!r}, this is {__version__}; "
            "resume it with that version, or start a new run from its weights (model.safetensors; with LoRA, the "
            "adapters only)."
        )
    reference_file = path / "reference.safetensors"
    try:
        states = torch.load(path / "states.pt", weights_only=True, map_location="cpu")
        sharded = is_sharded(model)  # then every rank reads the full state and keeps its shard (collective)
        _load_weights(model, path / "model.safetensors", *((optimizer, states["optimizer"]) if sharded else ()))
        if reference_model is not None and reference_file.is_file():
            _load_weights(reference_model, reference_file)
        if not sharded:
            optimizer.load_state_dict(states["optimizer"])
        scheduler.load_state_dict(states["scheduler"])
        if critic is not None:
            if "critic" not in states:
                raise CheckpointError(
                    f"{path} holds no critic (it was saved by a run without one); resume it with the algorithm it "
                    "was trained with."
                )
            _load_weights(critic.model, path / "critic.safetensors")
            critic.load_states(states["critic"])
    except CheckpointError:
        raise
    except Exception as exc:  # truncated or foreign files surface as many different errors
        raise CheckpointError(
            f"{path}: cannot read the checkpoint ({type(exc).__name__}: {exc}); it may be truncated. Resume from an "
            "earlier step-N folder."
        ) from None
    state["pending_rollouts"] = states.get("pending_rollouts")
    return state, states["rng"]


def _load_weights(model, file: Path, optimizer=None, optimizer_state: dict | None = None) -> None:
    """Weights into ``model``; for a sharded model also ``optimizer_state`` (FSDP loads both together)."""
    try:
        if _is_trainable_only(file):
            return _load_trainable(model, file)
        if is_sharded(model):
            from grpokit.distributed.fsdp import load_full_state

            missing, unexpected = load_full_state(model, load_file(str(file)), optimizer, optimizer_state)
        else:
            _check_shapes(model, file)
            missing, unexpected = load_model(model, str(file), strict=False)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"{file}: cannot load weights ({type(exc).__name__}: {exc}); the file may be truncated or from another "
            "model."
        ) from None
    if missing or unexpected:
        raise CheckpointError(
            f"{file} does not match the model (missing {list(missing)[:3]}, unexpected {list(unexpected)[:3]}); resume "
            "with the same model."
        )


def _check_shapes(model: torch.nn.Module, file: Path) -> None:
    """One clear line for weights of another model (torch would list every mismatched tensor)."""
    own = model.state_dict()
    with safe_open(str(file), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
            saved = list(f.get_slice(name).get_shape())
            if name in own and saved != list(own[name].shape):
                raise CheckpointError(
                    f"{file} holds the weights of another model: {name} has shape {saved} there "
                    f"and {list(own[name].shape)} in this model; resume with the model the run was "
                    "trained from."
                )


def _is_trainable_only(file: Path) -> bool:
    with safe_open(str(file), framework="pt") as f:
        return (f.metadata() or {}).get("grpokit_weights") == TRAINABLE_ONLY["grpokit_weights"]


@torch.no_grad()
def _load_trainable(model: torch.nn.Module, file: Path) -> None:
    """The trainable parameters (LoRA adapters) into a model whose frozen base came from the source."""
    saved = load_file(str(file))
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    missing, unexpected = sorted(params.keys() - saved.keys()), sorted(saved.keys() - params.keys())
    if missing or unexpected:
        raise CheckpointError(
            f"{file} holds the trainable parameters only (LoRA adapters) and they do not match this model's "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}); resume with the same model and lora settings "
            "(r, target_modules)."
        )
    for name, p in params.items():
        if saved[name].shape != p.shape:
            raise CheckpointError(
                f"{file}: {name} has shape {list(saved[name].shape)} in the checkpoint and {list(p.shape)} in this "
                "model; resume with the same model and lora settings (r, target_modules)."
            )
    for name, p in params.items():
        p.copy_(saved[name])


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
