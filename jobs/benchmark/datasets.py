"""The benchmark's prompts: the job's named inputs (humaneval, gsm8k), ShareGPT's first human
turns, the corpus tasks (jobs/benchmark/corpus_tasks.py) or a JSONL file; and a prompt's token ids
by the stage's one prompt rule (pipeline/llm/stage.py), as a job's row gets them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator

from jobs.benchmark.corpus_tasks import corpus_texts
from pipeline.config.package_data import BUILTIN_DATASETS, builtin_prompts, json_list_records, sharegpt_path
from pipeline.llm.prompts import prompt_of
from pipeline.llm.stage import StageSettings

AS_THE_JOB = StageSettings(text_as_user_message=True)


@dataclass(frozen=True)
class Prompt:
    request_id: str
    prompt: str | list[dict]  # plain text, or chat messages [{"role": ..., "content": ...}]


def encode_prompt(tokenizer, prompt: str | list[dict], request_id: str) -> list[int]:
    """The prompt's ids as the job's stage makes them: a text prompt is one user message of a chat
    where the tokenizer has a chat template, messages are templated; errors name the request."""
    row = {"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt}
    return prompt_of(tokenizer, row, AS_THE_JOB, f"request {request_id!r}")[1]


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


def jsonl_prompts(path: str) -> list[Prompt]:
    prompts = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        if not isinstance(record.get("prompt"), str):
            raise ValueError(f"{path} line {number}: needs a text 'prompt' field")
        prompts.append(Prompt(str(record.get("id", f"line-{number}")), record["prompt"]))
    return prompts


def load_prompts(dataset: str, limit: int = 0) -> list[Prompt]:
    """'humaneval', 'gsm8k', 'sharegpt', a corpus task (corpus-extract-json, corpus-rewrite-code,
    corpus-edit-text, corpus-summarize) or a JSONL path with a 'prompt' per line."""
    if dataset == "sharegpt":
        return list(sharegpt_prompts(limit))
    if dataset.startswith("corpus-"):
        return [Prompt(request_id, prompt) for request_id, prompt in corpus_texts(dataset, limit)]
    if dataset in BUILTIN_DATASETS:
        prompts = [Prompt(request_id, prompt) for request_id, prompt in builtin_prompts(dataset)]
    else:
        prompts = jsonl_prompts(dataset)
    return prompts[:limit] if limit else prompts
