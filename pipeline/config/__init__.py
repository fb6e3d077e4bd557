"""Typed settings and their loading (settings.py; its names are importable from here), the
drafter kinds, vLLM's engine arguments and the data that ships in packages."""

from __future__ import annotations

from pipeline.config.settings import (
    AUTO_MAX,
    CPU_MAX_NUM_SEQS,
    DRAFT_MODEL_W,
    ENGINES,
    Config,
    ConfigError,
    DecoderConfig,
    EngineConfig,
    InputConfig,
    JobConfig,
    ModelConfig,
    RayConfig,
    SamplingConfig,
    TransformersConfig,
    installed_engine,
)
from pipeline.config.typed import build
from pipeline.config.sources import load_config, parse_override

__all__ = [
    "AUTO_MAX",
    "CPU_MAX_NUM_SEQS",
    "DRAFT_MODEL_W",
    "ENGINES",
    "Config",
    "ConfigError",
    "DecoderConfig",
    "EngineConfig",
    "InputConfig",
    "JobConfig",
    "ModelConfig",
    "RayConfig",
    "SamplingConfig",
    "TransformersConfig",
    "build",
    "installed_engine",
    "load_config",
    "parse_override",
]
