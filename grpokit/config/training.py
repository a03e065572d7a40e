"""The training sections of the config: model, data, algo, generation, optim.

Each section is assembled from the settings classes of the parts it configures (each beside its part, with every
field's default, type and doc line, and its own ``check()``); the config adds only ``imports``. Field names are unique
across all sections, so a bare key names one field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpokit.algos.loss_params import SapoParams, VespoParams
from grpokit.algos.settings import (
    AdvantageSettings,
    KLControlSettings,
    OffPolicySettings,
    PolicyLossSettings,
    SamplerCorrectionSettings,
)
from grpokit.data.curriculum_settings import CurriculumSettings
from grpokit.data.image_settings import ImageDataSettings
from grpokit.data.settings import PromptSettings
from grpokit.models.settings import ModelSettings
from grpokit.models.vision_settings import VisionModelSettings
from grpokit.rollout.sampling_settings import EngineSettings, SamplingSettings
from grpokit.rollout.vllm.settings import VLLMSettings
from grpokit.train.experience.settings import DynamicSamplingSettings
from grpokit.train.learning.critic_settings import CriticSettings
from grpokit.train.learning.optimizer_settings import OptimizerSettings
from grpokit.train.learning.reference_settings import ReferenceSettings
from grpokit.train.learning.terms_settings import LossTermsSettings
from grpokit.train.learning.update_settings import UpdateSettings
from grpokit.train.loop_settings import LengthSettings
from grpokit.train.teacher.settings import DistillSettings


@dataclass
class ModelConfig(VisionModelSettings, ModelSettings):
    pass


@dataclass
class DataConfig(CurriculumSettings, ImageDataSettings, PromptSettings):
    pass


@dataclass
class AlgoConfig(  # the losses' params, the extra loss terms', PPO's critic's, the teacher's ...
    DistillSettings,
    DynamicSamplingSettings,
    KLControlSettings,
    ReferenceSettings,
    OffPolicySettings,
    PolicyLossSettings,
    AdvantageSettings,
    CriticSettings,
    SapoParams,
    VespoParams,
    LossTermsSettings,
):
    imports: list = field(default_factory=list)
    """Python modules imported before the config is checked, each a dotted name or a path/to/file.py: one that
    registers a loss (grpokit.algos.register_loss) makes its name a valid loss_type."""


@dataclass
class GenerationConfig(SamplerCorrectionSettings, EngineSettings, SamplingSettings, VLLMSettings):
    pass


@dataclass
class OptimConfig(LengthSettings, UpdateSettings, OptimizerSettings):
    pass
