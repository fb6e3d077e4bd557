"""ray.data.llm's processor API on our engine and drafter. A program written for ray.data.llm runs
with one import changed:

    from pipeline.llm import build_processor, vLLMEngineProcessorConfig   # was: from ray.data.llm

`build_processor(config, preprocess, postprocess)` returns a `Processor`; `processor(ds)` is a lazy
Dataset: the preprocess, one stage of actors each holding our engine (speculative decoding with the
config's drafter), and the postprocess. A row carries `messages` (chat-templated), `prompt` (text,
tokenized as it is) or `tokenized_prompt`, and `sampling_params` (vLLM's names); it comes back with
its own columns, ray.data.llm's (`generated_text`, `generated_tokens`, ...) and ours (the request's
acceptance statistics, `finish_reason`, the drafter that ran).

Errors as ray.data.llm has them: a row that cannot be generated raises (`should_continue_on_error`
False, its default); with True it comes back with `__inference_error__` naming the row and the field,
its generated columns empty ("", [], 0), past the postprocess, and the other rows' postprocess
output gets `__inference_error__` "". `sampling_params` keys our engine cannot run (n > 1,
min_p, ...) are such an error, never ignored.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Mapping

import pyarrow as pa

from pipeline.llm.actor_pool import generation_stage, prepared, tokenize_stage
from pipeline.config import Config
from pipeline.engines.build import checked_config
from pipeline.llm.row_values import rows_table
from pipeline.llm.schema import INFERENCE_ERROR
from pipeline.llm.processor_config import vLLMEngineProcessorConfig
from pipeline.llm.stage import GenerationStage, StageSettings

logger = logging.getLogger(__name__)

# --- The processor ------------------------------------------------------------------------------


def merged(preprocess: Callable) -> Callable:
    """ray.data.llm's preprocess: the row, updated with what the function returns."""

    def apply(row: dict) -> dict:
        return {**row, **preprocess(row)}

    return apply


def rows_postprocess(postprocess: Callable, continue_on_error: bool) -> Callable:
    """ray.data.llm's postprocess of a row, over a block: error rows bypass it, whole; with
    should_continue_on_error the others' output gets `__inference_error__` "" (every row then has
    the column). The block is made as Ray Data's map makes one."""

    def apply(batch: pa.Table) -> pa.Table:
        rows = []
        for row in batch.to_pylist():
            if row.get(INFERENCE_ERROR):
                rows.append(row)
            else:
                out = postprocess(row)
                rows.append({**out, INFERENCE_ERROR: ""} if continue_on_error else out)
        return rows_table(rows)

    return apply


# Ray Data's execution_no_progress_timeout_s for the processor's Dataset: off.
NO_PROGRESS_TIMEOUT = -1


@dataclass(frozen=True)
class Processor:
    """A Dataset in, the lazy Dataset of its generated rows out: the preprocess (a row's function,
    its output merged into the row), the stage of actors, the postprocess (a block's function, every
    row in it). build_processor makes one from ray.data.llm's config and functions; the job makes one
    from its own config (pipeline/job/rows.py)."""

    config: Config  # the pipeline's settings: model, engine, drafter, actors
    settings: StageSettings  # how the stage reads and writes rows
    checkpoint: Any = None  # ray.data.checkpoint.CheckpointConfig for the input's pipeline, or None
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    preprocess: Callable | None = None
    postprocess: Callable | None = None
    preprocess_map_kwargs: Mapping[str, Any] = field(default_factory=dict)
    postprocess_map_kwargs: Mapping[str, Any] = field(default_factory=dict)
    progress: Any = None  # a RunProgress actor told of each batch (the job's), or None
    # The model's preparation, started by the caller while it reads its input (actor_pool's
    # start_preparing; used where it is for this config), or None: started when the Dataset is made.
    preparing: Any = None
    # Prompts templated and tokenized by an actor pool of their own before the engine's (prompts.py;
    # the job's, whose tasks all take a fraction of a CPU), or (False) in the engine's actor: a
    # program's preprocess asks a whole CPU by default, which the pool's share could leave no node.
    tokenize: bool = False

    def __call__(self, dataset):
        """The lazy Dataset. The model is checked (and drafter tables built) here, once: a model or
        setting the engine cannot run fails now, not inside the actors. The checkpoint and how long
        the actors may take to start are the Dataset's (its context), not the process's."""
        config = checked_config(self.config)  # (the processor's is already; a program's own Config too)
        if self.checkpoint is not None:
            present, checkpoint = dataset.context.checkpoint_config, self.checkpoint
            if present is not None and (present.id_column, present.checkpoint_path) != (
                checkpoint.id_column,
                checkpoint.checkpoint_path,
            ):
                raise ValueError(
                    f"processor(ds): ds already checkpoints ({present.id_column!r} under "
                    f"{present.checkpoint_path!r}, its context's checkpoint_config); the config's "
                    f"id_column and checkpoint_path would replace it"
                )
            dataset.context.checkpoint_config = checkpoint  # shared by ds's pipeline, its read included
        dataset.context.wait_for_min_actors_s = int(math.ceil(config.ray.wait_for_actors_s))
        # Ray Data fails a Dataset that moves no block for 30 minutes; the stage emits its output
        # block when a task's input block is generated, which at a corpus job's pace takes longer.
        # A stuck engine is the engine's to catch (engine.hang_timeout_s), not this clock's.
        dataset.context.execution_no_progress_timeout_s = NO_PROGRESS_TIMEOUT
        preparation = prepared(config, dict(self.runtime_env), self.preparing)
        if self.preprocess is not None:
            dataset = dataset.map(merged(self.preprocess), **self.preprocess_map_kwargs)
        if self.tokenize:
            dataset = tokenize_stage(dataset, config.ray, preparation.tokenizer, self.settings)
        dataset = generation_stage(
            dataset,
            config,
            {"config": config, "settings": self.settings, "tables": preparation.tables, "progress": self.progress},
            dict(self.runtime_env),
        )
        if self.postprocess is not None:
            dataset = dataset.map_batches(
                self.postprocess, batch_format="pyarrow", batch_size=None, **self.postprocess_map_kwargs
            )
        return dataset

    def list_stage_names(self) -> list[str]:
        """The stages between the preprocess and the postprocess, as ray.data.llm names its own."""
        return ["TokenizeStage"] * self.tokenize + [GenerationStage.__name__]

    def get_stage_by_name(self, name: str) -> StageSettings:
        """The stage's settings."""
        if name in self.list_stage_names():
            return self.settings
        raise ValueError(f"Stage {name} not found (this processor has {self.list_stage_names()})")

    def log_input_column_names(self) -> None:
        """Logs the first stage's input columns, as ray.data.llm's processor does."""
        required, optional = GenerationStage.input_columns()
        message = f"The first stage of the processor is {self.list_stage_names()[0]}."
        message += "\nRequired input columns:\n" + "\n".join(f"\t{k}: {v}" for k, v in required.items())
        message += "\nOptional input columns:\n" + "\n".join(f"\t{k}: {v}" for k, v in optional.items())
        logger.info(message)


def build_processor(
    config: vLLMEngineProcessorConfig,
    preprocess: Callable | None = None,
    postprocess: Callable | None = None,
    preprocess_map_kwargs: dict | None = None,
    postprocess_map_kwargs: dict | None = None,
    builder_kwargs: dict | None = None,
) -> Processor:
    """A processor of ray.data.llm's shape that runs our speculative engine: call it on a Dataset.

    config: the engine, model and Ray settings, by ray.data.llm's names plus ours.
    preprocess / postprocess: a row's function before the stage (its output merged into the row)
    and after it (the generated row in, the caller's row out), as ray.data.llm takes them;
    preprocess_map_kwargs: `Dataset.map`'s arguments; postprocess_map_kwargs: `map_batches`'.
    builder_kwargs: only `chat_template_kwargs` (the template's keyword arguments).
    Returns a Processor; `processor(ds)` is the lazy Dataset of generated rows. A config the
    engine cannot run fails when it is called, before any actor starts.
    """
    if not isinstance(config, vLLMEngineProcessorConfig):
        raise TypeError(
            f"build_processor: config must be pipeline.llm.vLLMEngineProcessorConfig, got {type(config).__name__}"
        )
    unknown = sorted(set(builder_kwargs or {}) - {"chat_template_kwargs"})
    if unknown:
        raise TypeError(
            f"build_processor: builder_kwargs {unknown} are not taken by this processor (it takes chat_template_kwargs)"
        )
    settings = StageSettings(
        **config.chat_template_settings((builder_kwargs or {}).get("chat_template_kwargs")),
        continue_on_error=config.should_continue_on_error,
        seed=config.engine_kwargs.get("seed"),
        id_column=config.id_column,
        statistics=config.statistics(),
        live_metrics=config.log_engine_metrics,
        run_id=f"processor-{uuid.uuid4().hex[:8]}",
    )
    if postprocess is not None:
        postprocess = rows_postprocess(postprocess, config.should_continue_on_error)
    return Processor(
        config=config.pipeline_config(),
        settings=settings,
        checkpoint=config.checkpoint(),
        runtime_env=dict(config.runtime_env or {}),
        preprocess=preprocess,
        postprocess=postprocess,
        preprocess_map_kwargs=dict(preprocess_map_kwargs or {}),
        postprocess_map_kwargs=dict(postprocess_map_kwargs or {}),
    )


__all__ = ["Processor", "build_processor", "vLLMEngineProcessorConfig"]
