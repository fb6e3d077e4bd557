"""How the generation stage reads and writes rows: the settings its actors and the tokenize stage share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StageSettings:
    """How the stage reads and writes rows (the processor's, from vLLMEngineProcessorConfig; the
    job's, pipeline/job/rows.py)."""

    chat_template_enabled: bool = True  # template `messages` (False: a row needs prompt or tokenized_prompt)
    chat_template: str | None = None  # a Jinja template instead of the tokenizer's
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # apply_chat_template's keywords
    text_as_user_message: bool = False  # a text prompt is one user message of a chat (templated)
    continue_on_error: bool = False  # a bad row is an error row (False: it raises)
    seed: int | None = None  # rows without a seed sample with one derived from it and their id
    id_column: str | None = None  # names rows in errors and seeds them; a row without one is an error
    statistics: tuple[str, ...] | None = None  # which of STATISTICS a row gets (None: all)
    live_metrics: bool = False  # Ray metrics from each actor (pipeline/llm/metrics.py), tagged run_id
    run_id: str = ""
    # The requests (rows, and their samples) the run will generate, where it knows them: each
    # actor's share decides whether its work pays for measuring the speculation modes.
    expected_rows: int | None = None
    # Whether the rows carry predictions, as far as the run knows at its start (a series rerun, an
    # input with a prediction column): the speculation rule's first choice reads it.
    predictions: bool = False
