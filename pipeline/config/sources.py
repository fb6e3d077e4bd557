"""Where a run's settings come from: a YAML file (only what it changes from the defaults) and
`section.key=value` overrides (`--set`), built into the frozen Config and validated at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pipeline.config.settings import Config
from pipeline.config.typed import ConfigError, build


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parses `section.key=value` (value read as YAML) from a --set argument."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. drafting.w=4")
    key, raw = text.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw)


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Loads a YAML config (or the defaults), applies `section.key=value` overrides, validates."""
    data: dict = {}
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {key!r} is not a section")
        node[keys[-1]] = value
    return build(Config, data)
