"""A Ray Data row's values as plain Python, a row's id as text, its prediction as text, and rows
back into an Arrow block as Ray Data makes one."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from pipeline.engines.errors import RequestError


def python_value(value):
    """Arrow/numpy batch values (arrays of dicts, numpy scalars, NaN) as plain Python."""
    if isinstance(value, np.ndarray):
        return [python_value(v) for v in value.tolist()]
    if isinstance(value, list):
        return [python_value(v) for v in value]
    if isinstance(value, dict):
        return {k: python_value(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def request_key(raw) -> str:
    """A row's id as the outputs (and a run's checkpoint, and a seed) name it: its value as text; ""
    when it has none. Ids of any type (int, float, string) resume exactly once under this one name."""
    value = python_value(raw)
    return "" if value is None else str(value)


def rows_table(rows: list[dict]) -> pa.Table:
    """Rows as Ray Data makes a block of them: every column any row has, each converted as Ray Data
    converts it (its object type where the values' types differ)."""
    # How Ray Data turns a column of Python values into Arrow (its own types where it can, else its
    # object extension type), as ray.data.llm's rows get it.
    from ray.data._internal.tensor_extensions.arrow import convert_to_pyarrow_array

    names = list(dict.fromkeys(name for row in rows for name in row))
    return pa.table({name: convert_to_pyarrow_array([row.get(name) for row in rows], name) for name in names})


def prediction_text(value, name: str) -> str:
    """A row's prediction as text: the text itself, or OpenAI's predicted output
    (`{"type": "content", "content": text or [{"type": "text", "text": ...}, ...]}`); "" for none."""
    if value is None or isinstance(value, str):
        return value or ""
    if not isinstance(value, dict) or value.get("type") != "content":
        raise RequestError(
            f"{name}: prediction must be text or OpenAI's {{'type': 'content', 'content': ...}}, got {str(value)[:80]}"
        )
    content = value.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) for part in content
    ):
        return "".join(part["text"] for part in content)
    raise RequestError(
        f"{name}: prediction.content must be text or a list of {{'type': 'text', 'text': ...}} parts, "
        f"got {str(content)[:80]}"
    )
