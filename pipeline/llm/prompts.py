"""The one prompt rule, as ray.data.llm's chat-template and tokenize stages apply it: `messages` are
chat-templated (the generation prompt after a user's last message, the last message continued
otherwise), a text `prompt` is tokenized as it is, `tokenized_prompt` is taken as given; with
`text_as_user_message`, a text prompt is one user message of a chat (where the tokenizer has a chat
template). A text prompt that is empty, or only whitespace, is the row's error.

The job's processor applies it in a tokenize stage of its own (`TokenizeStage`, an actor pool before
the engine's, as ray.data.llm runs one), so the engine's actor spends its time generating; the
generation stage applies it to every other row (a program's processor: all of them) and names the
row's error.
"""

from __future__ import annotations

import pyarrow as pa

from pipeline.engines.errors import RequestError
from pipeline.llm.schema import BAD_INPUT
from pipeline.llm.stage_settings import StageSettings

# The tokenize stage's columns: each row's prompt as the model sees it, and its ids (null where the
# generation stage is to make them). The generation stage takes them off the batch.
ENCODED_TEXT, ENCODED_IDS = "__prompt_text__", "__prompt_ids__"
# What encode_rows reads of a row.
PROMPT_COLUMNS = ("messages", "prompt", "tokenized_prompt", BAD_INPUT)


def messages_of(tokenizer, row: dict, settings: StageSettings, name: str) -> list | None:
    """The row's chat messages, to be templated (None: none, or not templated); a text prompt as
    one user message with text_as_user_message."""
    messages, prompt = row.get("messages"), row.get("prompt")
    if messages is None and settings.text_as_user_message and isinstance(prompt, str) and tokenizer.chat_template:
        messages = [{"role": "user", "content": prompt}]
    if messages is None or not settings.chat_template_enabled:
        return None
    if not (isinstance(messages, list) and messages):
        raise RequestError(f"{name}: messages must be a non-empty list of chat messages")
    for i, message in enumerate(messages):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), (str, list))
        ):
            raise RequestError(f"{name}: message {i} needs a string 'role' and 'content'")
    return messages


def prompt_of(tokenizer, row: dict, settings: StageSettings, name: str) -> tuple[str, list[int]]:
    """The row's text prompt and its ids, by the one prompt rule (the module's docstring), as
    ray.data.llm's chat-template and tokenize stages make them; a RequestError names the row."""
    prompt = templated(tokenizer, row, settings, name)
    if prompt is None:
        return row.get("prompt") or "", [int(t) for t in row["tokenized_prompt"]]
    try:
        ids = list(tokenizer(prompt)["input_ids"])
    except (UnicodeError, ValueError, TypeError) as error:
        raise RequestError(f"{name}: the prompt cannot be encoded: {error}") from error
    if not ids:
        raise RequestError(f"{name}: the prompt is empty")
    return prompt, ids


def templated(tokenizer, row: dict, settings: StageSettings, name: str) -> str | None:
    """The row's text prompt, before tokenizing (prompt_of); None where the row gives its ids."""
    given = row.get("prompt")
    if row.get("tokenized_prompt") is not None:
        return None
    if row.get("messages") is None and isinstance(given, str) and not given.strip():
        raise RequestError(f"{name}: the prompt is empty")
    messages = messages_of(tokenizer, row, settings, name)
    if messages is not None:
        last_is_user = messages[-1]["role"] == "user"
        try:
            prompt = tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=last_is_user,
                continue_final_message=not last_is_user,
                chat_template=settings.chat_template,
                **settings.chat_template_kwargs,
            )
        except Exception as error:  # a template's own errors are of any type
            raise RequestError(f"{name}: messages cannot be chat-templated: {error}") from error
    elif isinstance(given, str):
        prompt = given
    elif given is not None:
        raise RequestError(f"{name}: prompt must be text, got {type(given).__name__}")
    else:
        need = (
            "messages, prompt or tokenized_prompt" if settings.chat_template_enabled else "prompt or tokenized_prompt"
        )
        raise RequestError(f"{name}: the row has no {need}")
    return prompt


def encode_rows(tokenizer, rows: list[dict], settings: StageSettings) -> list[tuple[str, list[int]] | None]:
    """Each row's text prompt and ids (prompt_of's), the texts tokenized in one call (a call per
    row cost 0.3 ms of the tokenizer's own); None for a row whose prompt is made on its own: given
    as ids, or one that fails (prompt_of then names its error)."""
    texts: list[str | None] = []
    for row in rows:
        try:
            texts.append(None if row.get(BAD_INPUT) else templated(tokenizer, row, settings, ""))
        except RequestError:
            texts.append(None)
    wanted = [i for i, text in enumerate(texts) if text is not None]
    try:
        ids = tokenizer([texts[i] for i in wanted])["input_ids"] if wanted else []
    except Exception:  # (a tokenizer's own errors are of any type) each row on its own, its error named
        return [None] * len(rows)
    encoded: list[tuple[str, list[int]] | None] = [None] * len(rows)
    for i, row_ids in zip(wanted, ids):
        encoded[i] = (texts[i], list(row_ids)) if len(row_ids) else None
    return encoded


class TokenizeStage:
    """The processor's tokenize stage: an actor holding the engine's tokenizer (the model's
    preparation made it) that adds each row's encoded prompt to its batch (ENCODED_TEXT, ENCODED_IDS)."""

    def __init__(self, tokenizer, settings: StageSettings):
        import ray

        self.tokenizer = ray.get(tokenizer) if isinstance(tokenizer, ray.ObjectRef) else tokenizer
        self.settings = settings

    def __call__(self, batch: pa.Table) -> pa.Table:
        read = [name for name in PROMPT_COLUMNS if name in batch.column_names]
        encoded = encode_rows(self.tokenizer, batch.select(read).to_pylist(), self.settings)
        texts = pa.array([None if e is None else e[0] for e in encoded], pa.string())
        ids = pa.array([None if e is None else e[1] for e in encoded], pa.list_(pa.int32()))
        return batch.append_column(ENCODED_TEXT, texts).append_column(ENCODED_IDS, ids)


def take_encoded(batch: pa.Table) -> tuple[pa.Table, list[tuple[str, list[int]] | None] | None]:
    """(the batch without the tokenize stage's columns, each row's encoded prompt from them; None
    where the batch did not pass that stage)."""
    if ENCODED_IDS not in batch.column_names:
        return batch, None
    texts, ids = batch.column(ENCODED_TEXT).to_pylist(), batch.column(ENCODED_IDS).to_pylist()
    encoded = [None if row_ids is None else (text, row_ids) for text, row_ids in zip(texts, ids)]
    return batch.drop_columns([ENCODED_TEXT, ENCODED_IDS]), encoded
