"""YAML values checked against a frozen dataclass's type hints (pipeline/config/'s sections),
each error naming the field (`section.field`) and what it takes."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union


class ConfigError(ValueError):
    """A config value that cannot be used; the message names the field."""


def convert(value: Any, hint: Any, name: str) -> Any:
    """Checks one YAML value against a field's type hint; returns it in the field's type."""
    origin = typing.get_origin(hint)
    if hint is type(None):
        if value is not None:
            raise ConfigError(f"{name}: must be null, got {value!r}")
        return None
    if origin in (Union, types.UnionType):  # int | Literal["auto"]: the first type that takes it
        for arm in typing.get_args(hint):
            try:
                return convert(value, arm, name)
            except ConfigError:
                pass
        raise ConfigError(
            f"{name}: must be {' or '.join(describe(arm) for arm in typing.get_args(hint))}, got {value!r}"
        )
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ConfigError(f"{name}: {value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: must be a list of strings, got {value!r}")
        return tuple(convert(v, typing.get_args(hint)[0], f"{name}[{i}]") for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: must be a string, got {value!r}")
        return value
    if hint is dict:
        if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
            raise ConfigError(f"{name}: must be a mapping of names to values, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, name)
    raise TypeError(f"{name}: unsupported config type {hint!r}")


def describe(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return " or ".join(map(repr, typing.get_args(hint)))
    return {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true or false",
        type(None): "unset (null)",
    }.get(hint, str(hint))


def build(cls: type, mapping: Any, prefix: str = ""):
    """Builds dataclass `cls` from a mapping, rejecting unknown keys by name, and a key the class
    lists in its MOVED (old key -> its new `section.key`) naming where it went."""
    where = prefix or "config"
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where}: must be a mapping, got {type(mapping).__name__}")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields if "set_by" not in f.metadata]  # the rest are resolved, not set
    moved = getattr(cls, "MOVED", {})  # old key -> the `section.key` it is now
    for key in mapping:
        if key in moved:
            raise ConfigError(f"{prefix or cls.__name__}.{key} moved to {moved[key]}: set {moved[key]} instead")
        section = getattr(cls, "MOVED_SECTIONS", {}).get(key)
        if section is not None:  # a section that is no more: its first key, and where it is now
            inner = next(iter(mapping[key]), None) if isinstance(mapping[key], dict) else None
            place = section.get(inner) if inner else None
            raise ConfigError(
                f"{key}.{inner} moved to {place}: set {place} instead"
                if place
                else f"{key}: the section is no more; its keys are in "
                f"{', '.join(sorted({place.split('.')[0] for place in section.values()}))} now"
            )
        resolved = next((f for f in fields if f.name == key and "set_by" in f.metadata), None)
        if resolved is not None:
            raise ConfigError(f"{where}.{key} is resolved, not set: set {resolved.metadata['set_by']}")
    unknown = sorted(set(mapping) - set(names))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(names)}")
    kwargs = {key: convert(value, hints[key], f"{prefix}.{key}" if prefix else key) for key, value in mapping.items()}
    return cls(**kwargs)


def require(ok: bool, name: str, allowed: str) -> None:
    """A ConfigError naming the field `name` and what it allows, unless `ok`."""
    if not ok:
        raise ConfigError(f"{name}: must be {allowed}")
