"""OpenAI Batch files: a request file read as the job's rows, and a run's rows written back as
OpenAI's batch output and error files (docs/openai-batch.md).

In: one JSON object a line, `{"custom_id", "method": "POST", "url", "body"}`, `url` one of
ENDPOINTS. `custom_id` is the row's id; the body's fields are checked here (FIELDS: what each
endpoint runs, IGNORED: fields that change no text), so a line with a field we do not run, another
url or method, or a body that is not an object is its own error row naming the field, and nothing
is silently dropped. A good line is a row whose `openai_request` column holds the request as JSON
text (its prompt column is null): the job's preprocess reads it (`request_fields`) as it reads any
row's prompt and settings. The body's `model` is not checked: the job's model runs every line and
each response names it.

Out (`write_outputs`): from the run's Parquet, the store that resume and series read, an output
file with a line per request that succeeded (`response.body` a `chat.completion` or
`text_completion`, a choice per sample of `n`, `usage` with the tokens generated and the
prediction's accepted and rejected tokens) and an error file with a line per request that did
not (`response` null, `error` `{code, message}`), each `custom_id` once, each file written whole.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any
from collections.abc import Iterable, Iterator

from pipeline.config import Config, InputConfig
from pipeline.job.series import REQUEST  # the column that carries a line's request, as JSON text
from pipeline.llm.schema import BAD_INPUT

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
ENDPOINTS = (CHAT, COMPLETIONS)
COMMON = (
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "n",
    "logprobs",
    "frequency_penalty",
    "presence_penalty",
)
# The body fields each endpoint runs.
FIELDS = {
    CHAT: (*COMMON, "messages", "max_completion_tokens", "top_logprobs", "response_format", "prediction"),
    COMPLETIONS: (*COMMON, "prompt"),
}
# Fields that change no text, taken and left aside (stream only where false).
IGNORED = ("user", "metadata", "store", "service_tier", "stream")
# OpenAI's defaults where a body leaves a setting out (max_tokens: sampling.max_new_tokens).
DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "n": 1}


class LineError(ValueError):
    """What is wrong with a request line; the message names the field."""


def is_request_line(row: Any) -> bool:
    """Whether a JSON line has the shape of an OpenAI Batch request."""
    return isinstance(row, dict) and {"custom_id", "method", "url", "body"} <= set(row)


def request_of(row: dict) -> dict:
    """A line's request as the job keeps it, {"url", "body"} with the ignored fields left out; a
    LineError names what is wrong."""
    if not isinstance(row.get("custom_id"), str) or not row["custom_id"]:
        raise LineError("custom_id must be a non-empty string")
    if row.get("method") != "POST":
        raise LineError(f"method must be 'POST', got {row.get('method')!r}")
    url, body = row.get("url"), row.get("body")
    if url not in ENDPOINTS:
        raise LineError(f"url {url!r} is not run here; the job runs {' and '.join(ENDPOINTS)}")
    if not isinstance(body, dict):
        raise LineError(f"body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(FIELDS[url]) - set(IGNORED))
    if unknown:
        raise LineError(f"body.{unknown[0]} is not run here (the job runs {', '.join(FIELDS[url])} on {url})")
    if body.get("stream"):
        raise LineError("body.stream must be false or left out: a batch's responses are written whole")
    check_response_format(body.get("response_format"))
    kept = {key: value for key, value in body.items() if key not in IGNORED}
    if url == CHAT:
        kept["messages"] = text_messages(body.get("messages"))
    elif not isinstance(body.get("prompt"), str) or not body["prompt"]:
        raise LineError("body.prompt must be a non-empty string (token ids and lists of prompts are not run here)")
    return {"url": url, "body": kept}


def text_messages(messages: Any) -> list[dict]:
    """Chat messages as {role, content: text}: a content's text parts joined; any other part (an
    image, audio) is the line's error, as are tool calls."""
    if not isinstance(messages, list) or not messages:
        raise LineError("body.messages must be a non-empty list of messages")
    found = []
    for i, message in enumerate(messages):
        where = f"body.messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise LineError(f"{where} must be an object with a string 'role'")
        unknown = sorted(set(message) - {"role", "content", "name"})
        if unknown:
            raise LineError(f"{where}.{unknown[0]} is not run here (messages of text only)")
        content = message.get("content")
        if isinstance(content, list):
            kinds = sorted(
                {part.get("type") if isinstance(part, dict) else type(part).__name__ for part in content} - {"text"}
            )
            if kinds:
                raise LineError(f"{where}.content: {kinds[0]!r} parts are not run here (text parts only)")
            content = "".join(part.get("text") or "" for part in content)
        if not isinstance(content, str):
            raise LineError(f"{where}.content must be text or a list of text parts")
        found.append({"role": message["role"], "content": content})
    return found


def batch_row(row: Any, source: InputConfig, where: str) -> dict:
    """The job's row for a parsed line (`where`: its file and line, for the message): its id, its
    request as JSON text, or the message of what is wrong with it."""
    column = source.prompt_column or source.messages_column
    key = row.get("custom_id") if isinstance(row, dict) and isinstance(row.get("custom_id"), str) else None
    try:
        request = request_of(row if isinstance(row, dict) else {})
    except LineError as error:
        return {source.id_column: key or where, column: None, REQUEST: None, BAD_INPUT: f"{where}: {error}"}
    return {source.id_column: key, column: None, REQUEST: json.dumps(request, sort_keys=True)}


def request_fields(text: str, config: Config) -> dict:
    """A row's request (its `openai_request`) as the processor's columns: the prompt (chat messages
    or a text prompt), sampling_params (vLLM's names, OpenAI's defaults) and the prediction."""
    request = json.loads(text)
    body = request["body"]
    params = {
        "max_tokens": body.get("max_completion_tokens", body.get("max_tokens")) or config.sampling.max_new_tokens,
        **{key: body.get(key, default) for key, default in DEFAULTS.items()},
    }
    for key in ("seed", "stop", "frequency_penalty", "presence_penalty"):
        if body.get(key) is not None:
            params[key] = body[key]
    logprobs = logprobs_asked(request)
    if logprobs is not None:
        params["logprobs"] = logprobs
    structured = structured_outputs(body.get("response_format"))
    if structured is not None:  # a schema as JSON text: one Arrow type for every row's
        params["structured_outputs"] = structured
    prompt = body["messages"] if request["url"] == CHAT else body["prompt"]
    return {
        "prompt": prompt,
        "sampling_params": params,
        "prediction": body.get("prediction"),
        "endpoint": request["url"],
    }


def logprobs_asked(request: dict) -> int | None:
    """vLLM's logprobs (how many of the most likely tokens beside the one drawn) for a request, or None."""
    body = request["body"]
    if request["url"] == CHAT:
        return int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
    return None if body.get("logprobs") is None else int(body["logprobs"])


def structured_outputs(response_format: Any) -> dict | None:
    """OpenAI's response_format (checked by request_of) as vLLM's structured_outputs; None for text."""
    if response_format is None or response_format["type"] == "text":
        return None
    if response_format["type"] == "json_object":
        return {"json_object": True}
    return {"json": json.dumps(response_format["json_schema"]["schema"])}


def check_response_format(response_format: Any) -> None:
    """OpenAI's three kinds: text, json_object, json_schema with its json_schema.schema."""
    if response_format is None:
        return
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    schema = response_format.get("json_schema") if isinstance(response_format, dict) else None
    if kind in ("text", "json_object") or (
        kind == "json_schema" and isinstance(schema, dict) and isinstance(schema.get("schema"), dict)
    ):
        return
    raise LineError(
        "body.response_format must be {'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', "
        "'json_schema': {'name': ..., 'schema': {...}}}"
    )


# --- Out -----------------------------------------------------------------------------------------

OUTPUT_COLUMNS = (
    "id",
    "sample_index",
    "endpoint",
    "generated_text",
    "generated_tokens",
    "finish_reason",
    "num_input_tokens",
    "num_generated_tokens",
    "accepted_prediction_tokens",
    "rejected_prediction_tokens",
    "logprobs",
    "model",
    "error",
)
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


def response_lines(rows: list[dict], run_id: str, created: int) -> Iterator[tuple[bool, str]]:
    """(succeeded, the line) per request among `rows` (each request's sample rows together)."""
    requests: dict[str, list[dict]] = {}
    for row in rows:
        requests.setdefault(row["id"], []).append(row)
    for key, samples in requests.items():
        samples.sort(key=lambda row: row.get("sample_index") or 0)
        ident = hashlib.sha256(f"{run_id}\0{key}".encode()).hexdigest()[:24]
        failed = next((row["error"] for row in samples if row.get("error")), None)
        if failed is not None or samples[0].get("endpoint") not in ENDPOINTS:
            error = {"code": "invalid_request", "message": failed or "the row is no OpenAI Batch request"}
            yield False, json.dumps({"id": f"batch_req_{ident}", "custom_id": key, "response": None, "error": error})
            continue
        body = response_body(samples, ident, created)
        yield (
            True,
            json.dumps(
                {
                    "id": f"batch_req_{ident}",
                    "custom_id": key,
                    "response": {"status_code": 200, "request_id": ident, "body": body},
                    "error": None,
                }
            ),
        )


def response_body(samples: list[dict], ident: str, created: int) -> dict:
    """The `chat.completion` or `text_completion` of a request's samples."""
    chat = samples[0]["endpoint"] == CHAT
    choices = []
    for index, row in enumerate(samples):
        logprobs = choice_logprobs(row, chat) if row.get("logprobs") is not None else None
        choice = {"index": index, "finish_reason": FINISH.get(row["finish_reason"], "stop"), "logprobs": logprobs}
        if chat:
            choice["message"] = {"role": "assistant", "content": row["generated_text"], "refusal": None}
        else:
            choice["text"] = row["generated_text"]
        choices.append(choice)
    completion = sum(row["num_generated_tokens"] or 0 for row in samples)
    prompt = samples[0]["num_input_tokens"] or 0
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if chat:
        usage["completion_tokens_details"] = {
            "accepted_prediction_tokens": sum(row["accepted_prediction_tokens"] or 0 for row in samples),
            "rejected_prediction_tokens": sum(row["rejected_prediction_tokens"] or 0 for row in samples),
            "reasoning_tokens": 0,
            "audio_tokens": 0,
        }
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{ident}",
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": samples[0]["model"],
        "choices": choices,
        "usage": usage,
    }


def choice_logprobs(row: dict, chat: bool) -> dict | None:
    """OpenAI's logprobs of a sample from the row's (per position: the token drawn and the most
    likely ones, each {token_id, token, logprob, rank})."""
    positions = row.get("logprobs") or []
    drawn = row.get("generated_tokens") or []
    tokens = []
    for token_id, entries in zip(drawn, positions):
        entries = entries or []
        own = next((e for e in entries if e["token_id"] == token_id), None)
        top = sorted((e for e in entries if e["rank"] is not None), key=lambda e: e["rank"])
        tokens.append((own, [e for e in top if e["rank"] <= len(entries)]))
    if chat:
        return {
            "content": [{**token_entry(own), "top_logprobs": [token_entry(e) for e in top]} for own, top in tokens],
            "refusal": None,
        }
    return {
        "tokens": [own["token"] if own else "" for own, _ in tokens],
        "token_logprobs": [own["logprob"] if own else None for own, _ in tokens],
        "top_logprobs": [{e["token"]: e["logprob"] for e in top} for _, top in tokens],
        "text_offset": [],
    }


def token_entry(entry: dict | None) -> dict:
    token = entry["token"] if entry else ""
    return {"token": token, "logprob": entry["logprob"] if entry else -9999.0, "bytes": list(token.encode())}


def write_outputs(run_dir: str, run_id: str, rows: Iterable[list[dict]]) -> dict:
    """Writes `run_dir`/openai/output.jsonl and errors.jsonl from the run's rows (blocks of
    OUTPUT_COLUMNS, a request's samples in one block), each whole; returns their paths and counts."""
    from pipeline import storage

    created, counts = int(time.time()), {True: 0, False: 0}
    paths = {
        True: storage.join(run_dir, "openai", "output.jsonl"),
        False: storage.join(run_dir, "openai", "errors.jsonl"),
    }
    with storage.WholeFile(paths[True]) as output, storage.WholeFile(paths[False]) as errors:
        for block in rows:
            for succeeded, line in response_lines(block, run_id, created):
                (output if succeeded else errors).write(line + "\n")
                counts[succeeded] += 1
    return {"output": paths[True], "errors": paths[False], "requests": counts[True], "failed_requests": counts[False]}
