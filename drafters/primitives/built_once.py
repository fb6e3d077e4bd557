"""Artifacts built once and kept on disk (the model's drafter tables, a measured step-cost model, a
converted GGUF model): their cache key names the code that builds them, so that a change of that
code builds them again instead of reading what the old code made."""

from __future__ import annotations

import hashlib
import inspect


def code_key(*functions, extra: str = "") -> str:
    """A short hash of the functions' source (and `extra`, e.g. a library's version)."""
    digest = hashlib.sha256(extra.encode())
    for function in functions:
        digest.update(inspect.getsource(function).encode())
    return digest.hexdigest()[:12]
