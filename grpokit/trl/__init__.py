"""TRL's surface over a built run: :class:`~grpokit.trl.trainer.GRPOTrainer` (builds a Run and delegates) and TRL's
key mapping (:mod:`grpokit.config.trl_keys`), which the config package reads; the trainer is imported lazily so that the
config does not pull in the builders."""

__all__ = ["GRPOTrainer"]


def __getattr__(name: str):
    if name == "GRPOTrainer":
        from grpokit.trl.trainer import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(f"module 'grpokit.trl' has no attribute {name!r}")
