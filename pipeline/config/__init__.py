"""Typed settings and their loading (settings.py; its names are importable from here), the
drafter kinds and registry, model loading and the data that ships in packages."""

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
    TransformersConfig,
    build,
    installed_engine,
    load_config,
    parse_override,
)

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
    "TransformersConfig",
    "build",
    "installed_engine",
    "load_config",
    "parse_override",
]
