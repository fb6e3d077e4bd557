"""Typed settings, a module per section (settings.py composes them; every name is importable from
here), their loading, the drafter kinds, vLLM's engine arguments and the data that ships in packages."""

from __future__ import annotations

from pipeline.config.drafting import AUTO_MAX, DRAFT_MODEL_W, DraftingConfig
from pipeline.config.engine import ENGINES, EngineConfig, installed_engine
from pipeline.config.input import InputConfig
from pipeline.config.job import JobConfig
from pipeline.config.model import ModelConfig
from pipeline.config.ray_actors import RayConfig
from pipeline.config.sampling import SamplingConfig
from pipeline.config.settings import Config
from pipeline.config.transformers_engine import TransformersConfig
from pipeline.config.vllm_engine import CPU_MAX_NUM_SEQS, VllmConfig
from pipeline.config.typed import ConfigError, build
from pipeline.config.sources import load_config, parse_override

__all__ = [
    "AUTO_MAX",
    "CPU_MAX_NUM_SEQS",
    "DRAFT_MODEL_W",
    "ENGINES",
    "Config",
    "ConfigError",
    "DraftingConfig",
    "EngineConfig",
    "InputConfig",
    "JobConfig",
    "ModelConfig",
    "RayConfig",
    "SamplingConfig",
    "TransformersConfig",
    "VllmConfig",
    "build",
    "installed_engine",
    "load_config",
    "parse_override",
]
