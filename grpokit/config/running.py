"""The run sections of the config: run folder, evaluation, distributed, agent (tools); each assembled from the settings
classes of the parts it configures (the ``lora`` and ``reward`` sections are their parts' classes themselves)."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.eval.settings import EvalSettings
from grpokit.rewards.settings import RewardSettings
from grpokit.store.settings import StoreSettings
from grpokit.system.distributed_settings import DistributedSettings
from grpokit.tools.settings import ToolSettings
from grpokit.train.loop_settings import StopSettings
from grpokit.train.rundir.settings import CheckpointSettings, RunFolderSettings
from grpokit.train.tracking_settings import TrackingSettings

__all__ = ["AgentConfig", "DistributedConfig", "EvalConfig", "RewardSettings", "RunConfig"]


@dataclass
class RunConfig(StopSettings, TrackingSettings, CheckpointSettings, RunFolderSettings, StoreSettings):
    pass


@dataclass
class EvalConfig(EvalSettings):
    pass


@dataclass
class DistributedConfig(DistributedSettings):
    pass


@dataclass
class AgentConfig(ToolSettings):
    pass
