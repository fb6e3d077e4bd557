"""ray.data.llm's vLLMEngineProcessorConfig, with its keywords and meanings, read into the pipeline's
Config (`pipeline_config`) and the stage's settings; pipeline/llm/processor.py builds the processor
from it. Every keyword is checked when the config is made: one our engine cannot run fails there,
naming the keyword."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping, Sequence

from pipeline.llm.checkpoint import checkpoint_config
from pipeline.config import ENGINES, Config, ConfigError, build
from pipeline.engines.build import checked_config, concurrent_batches
from pipeline.config.vllm_arguments import VLLM_ARGUMENTS
from pipeline.llm.schema import STATISTICS

# ray.data.llm's ChatTemplateStageConfig fields.
CHAT_TEMPLATE_STAGE_KEYS = (
    "enabled",
    "model_source",
    "chat_template",
    "chat_template_kwargs",
    "batch_size",
    "concurrency",
    "runtime_env",
    "num_cpus",
    "memory",
)
# A user's speculative_config: vLLM's learning-free methods, run as vLLM has them (our drafters
# vllm_ngram and vllm_suffix), with its keys -> ours (drafting.<key>, or a subsection's key).
SPECULATIVE_METHODS = {"ngram": "vllm_ngram", "suffix": "vllm_suffix"}
SPECULATIVE_KEYS = {
    "method": None,
    "num_speculative_tokens": "w",
    "prompt_lookup_min": "ngram.min_q",
    "prompt_lookup_max": "ngram.max_q",
}


@dataclass(frozen=True)
class vLLMEngineProcessorConfig:  # noqa: N801 - ray.data.llm's name, kept so one import changes
    """ray.data.llm's keywords with its meanings, plus ours (after `task_type`)."""

    model_source: str
    batch_size: int = 32
    concurrency: int | tuple[int, int] = 1
    accelerator_type: str | None = None
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    runtime_env: Mapping[str, Any] | None = None
    max_pending_requests: int | None = None
    max_concurrent_batches: int = 8
    should_continue_on_error: bool = False
    # True, False (`messages` are not templated: a row needs prompt or tokenized_prompt), or as Ray's
    # ChatTemplateStageConfig (or a dict of its fields): enabled, chat_template (a Jinja template
    # instead of the tokenizer's), chat_template_kwargs (for apply_chat_template). Its actor pool's
    # keys (batch_size, concurrency, num_cpus, ...) are accepted: our actor templates in its process.
    chat_template_stage: Any = True
    # Accepted, and the same either way: our actor tokenizes and detokenizes in the engine's
    # process, with no stage of its own (ray.data.llm runs each as an actor pool).
    tokenize_stage: bool = True
    detokenize_stage: bool = True
    placement_group_config: Mapping[str, Any] | None = None
    # Live metrics from every actor, through Ray's metrics (Ray's dashboard, Prometheus): the job's
    # counters (pipeline/llm/metrics.py: rows, tokens, target calls, accepted drafts, engine steps and
    # occupancy), tagged run_id "processor-<id>".
    log_engine_metrics: bool = True
    task_type: str = "generate"
    # Ours: drafting.* settings as in a job's config (our default drafter when empty), the engine,
    # and the transformers engine's own transformers.* settings (k, verify, ...; refused on vLLM
    # where they would change what runs).
    drafting: Mapping[str, Any] = field(default_factory=dict)
    decoder: Mapping[str, Any] | None = None  # the old name of `drafting`: refused, naming it
    engine: str = "vllm"
    transformers: Mapping[str, Any] = field(default_factory=dict)
    # Ours: which of our columns a row gets (None: all of STATISTICS; () none, ray.data.llm's only).
    statistics_columns: Sequence[str] | None = None
    # Ours: the rows' id column. Errors name a row by its id, a row without one fails (raises, or is
    # an error row with should_continue_on_error), and a row without its own seed samples with one
    # derived from engine_kwargs' seed and its id: the same text for the same id and seed, however
    # the rows were batched (the job's rule). With checkpoint_path too, resume: processor(ds) turns
    # on Ray Data's checkpointing for ds's pipeline (ds.context.checkpoint_config): writing the
    # Dataset records each id under checkpoint_path, kept after success, and running it again
    # generates only the ids no earlier run wrote (ids compared as text: 1 and "1" are one id).
    id_column: str | None = None
    checkpoint_path: str | None = None

    def __post_init__(self):
        check(
            isinstance(self.model_source, str) and self.model_source,
            "model_source",
            "a model directory, a .gguf file, a Hugging Face hub id in the local cache or 'smollm2-135m-instruct'",
        )
        check(isinstance(self.batch_size, int) and self.batch_size >= 1, "batch_size", "an integer >= 1")
        check(self.task_type == "generate", "task_type", "'generate' (embed, classify and score are not ours)")
        check(self.max_concurrent_batches >= 1, "max_concurrent_batches", "an integer >= 1")
        check(
            self.max_pending_requests is None or self.max_pending_requests >= 1,
            "max_pending_requests",
            "an integer >= 1 or None",
        )
        check(self.engine in ENGINES, "engine", " or ".join(map(repr, ENGINES)))
        check(self.decoder is None, "decoder", "left out: it is `drafting` now (drafting={...})")
        self.actors()
        self.statistics()
        self.chat_template_settings()
        for name in ("id_column", "checkpoint_path"):
            value = getattr(self, name)
            check(value is None or (isinstance(value, str) and value), name, "a non-empty string or None")
        check(
            self.checkpoint_path is None or self.id_column is not None,
            "checkpoint_path",
            "set with id_column (the checkpoint records each row's id), or None",
        )
        for key, value in self.engine_kwargs.items():
            check(isinstance(key, str), "engine_kwargs", "a mapping of vLLM's engine argument names to values")
            argument = VLLM_ARGUMENTS.get(key)
            if argument is not None and argument.only is not None:
                check(
                    value == argument.only,
                    f"engine_kwargs.{key}",
                    f"{argument.only!r} (the only value this engine runs)",
                )
            check(
                argument is None or argument.field or argument.only is not None or key == "speculative_config",
                f"engine_kwargs.{key}",
                f"left out: {argument.where() if argument else ''}",
            )
        self.pipeline_config()  # its own checks and the engine's, naming the section.field they fail on

    def chat_template_settings(self, fallback_kwargs: Mapping[str, Any] | None = None) -> dict:
        """chat_template_stage as GenerationStage's settings: enabled, template, template_kwargs
        (the stage's own chat_template_kwargs, else build_processor's)."""
        stage = self.chat_template_stage
        if isinstance(stage, bool):
            stage = {"enabled": stage}
        elif hasattr(stage, "model_dump"):  # ray.data.llm's ChatTemplateStageConfig
            stage = stage.model_dump()
        check(
            isinstance(stage, Mapping),
            "chat_template_stage",
            "True, False, a ChatTemplateStageConfig or a dict of its fields",
        )
        unknown = sorted(set(stage) - set(CHAT_TEMPLATE_STAGE_KEYS))
        check(
            not unknown,
            f"chat_template_stage.{unknown[0] if unknown else ''}",
            f"one of {list(CHAT_TEMPLATE_STAGE_KEYS)}",
        )
        check(
            stage.get("model_source") in (None, self.model_source),
            "chat_template_stage.model_source",
            "model_source or None (the engine's tokenizer templates the rows)",
        )
        template, kwargs = stage.get("chat_template"), stage.get("chat_template_kwargs") or fallback_kwargs or {}
        check(
            template is None or isinstance(template, str),
            "chat_template_stage.chat_template",
            "a Jinja template string or None",
        )
        check(isinstance(kwargs, Mapping), "chat_template_stage.chat_template_kwargs", "a mapping or None")
        return {
            "chat_template_enabled": bool(stage.get("enabled", True)),
            "chat_template": template,
            "chat_template_kwargs": dict(kwargs),
        }

    def actors(self) -> tuple[int, int]:
        """(min, max) actors, as ray.data.llm reads `concurrency`: n is an autoscaling pool of 1 to n."""
        concurrency = self.concurrency
        if isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1:
            return 1, concurrency
        check(
            isinstance(concurrency, (tuple, list))
            and len(concurrency) == 2
            and all(isinstance(n, int) for n in concurrency)
            and 1 <= concurrency[0] <= concurrency[1],
            "concurrency",
            "an integer >= 1 or (min, max) with 1 <= min <= max",
        )
        return tuple(concurrency)

    def statistics(self) -> tuple[str, ...]:
        """Our columns a row gets, in the output's order."""
        if self.statistics_columns is None:
            return tuple(f.name for f in STATISTICS)
        chosen = self.statistics_columns
        check(
            not isinstance(chosen, str) and all(isinstance(name, str) for name in chosen),
            "statistics_columns",
            "a list of column names or None",
        )
        known = [f.name for f in STATISTICS]
        for name in chosen:
            check(name in known, f"statistics_columns ({name!r})", f"one of {known}")
        return tuple(name for name in known if name in chosen)

    def checkpoint(self):
        """Ray Data's checkpointing for these keywords (checkpoint_path set), or None."""
        if self.checkpoint_path is None:
            return None
        return checkpoint_config(self.id_column, self.checkpoint_path)

    def resources(self) -> dict[str, float]:
        """One actor's resources: the placement group's bundles summed (ray.data.llm places one per
        replica; our engine's ranks are the actor's own processes, so they are on its node), a CPU
        where they name none. Without bundles, ray.data.llm's default: a GPU per tensor-parallel rank."""
        ranks = self.engine_kwargs.get("tensor_parallel_size", 1)
        check(isinstance(ranks, int) and ranks >= 1, "engine_kwargs.tensor_parallel_size", "an integer >= 1")
        bundles = (self.placement_group_config or {}).get("bundles") or [{"GPU": 1}] * ranks
        check(
            all(isinstance(bundle, dict) for bundle in bundles),
            "placement_group_config.bundles",
            "a list of resource mappings, e.g. [{'CPU': 1}] or [{'GPU': 1}]",
        )
        gpus = sum(bundle.get("GPU", 0) for bundle in bundles)
        check(
            gpus in (0, ranks),
            "placement_group_config.bundles",
            f"no GPU (a CPU engine) or one GPU per tensor-parallel rank ({ranks}), not {gpus}",
        )
        return {"CPU": sum(bundle.get("CPU", 0) for bundle in bundles) or 1.0, "GPU": gpus}

    def pipeline_config(self) -> Config:
        """The pipeline's settings, as the engine runs them (pipeline/engines/build.checked_config)."""
        resources = self.resources()
        # On a CPU the engine's threads are the CPUs the actor reserved (Ray starts it with one otherwise).
        threads = 0 if resources["GPU"] else max(1, int(resources["CPU"]))
        # The job's default drafter (pipeline/config/'s defaults) unless `drafting` names another.
        # Each engine's per-request record on (ray.data.llm's `metrics`), where it keeps one.
        sections: dict[str, dict] = {
            "model": {"name": self.model_source, "num_threads": threads},
            "engine": {"name": self.engine},
            "vllm": {"request_metrics": True},
            "drafting": dict(self.drafting),
            "sampling": {},  # a row's own sampling_params; engine_kwargs' seed the rows' default
            "transformers": dict(self.transformers),
        }
        vllm_args = {}
        for key, value in self.engine_kwargs.items():
            argument = VLLM_ARGUMENTS.get(key)
            if key == "speculative_config":
                sections["drafting"].update(self.drafting_settings(value))
            elif key in OUR_ENGINE_KWARGS:  # ours, not vLLM's: a failed engine's restarts, the speculation mode
                sections[OUR_ENGINE_KWARGS[key]][key] = value
            elif argument is None:
                vllm_args[key] = value
            elif argument.field:
                section, name = argument.field.split(".")
                sections[section][name] = argument.convert(value)
        sections["vllm"]["engine_args"] = vllm_args
        if "max_batch_requests" not in self.transformers:
            # the transformers engine's requests per forward call come from one batch: no more than it holds
            default = build(Config, {"drafting": sections["drafting"], "transformers": sections["transformers"]})
            sections["transformers"]["max_batch_requests"] = min(
                default.transformers.max_batch_requests, self.batch_size
            )
        low, high = self.actors()
        sections["ray"] = {
            "min_actors": low,
            "max_actors": high,
            "batch_size": self.batch_size,
            "max_concurrent_batches": self.max_concurrent_batches,
            "num_cpus_per_actor": resources["CPU"],
            "num_gpus_per_actor": resources["GPU"],
            "accelerator_type": self.accelerator_type or "",
        }
        config = build(Config, sections)
        batches = concurrent_batches(config)  # the engine's (the transformers engine: one at a time)
        if self.max_pending_requests:
            batches = max(1, min(batches, math.ceil(self.max_pending_requests / self.batch_size)))
        return checked_config(
            dataclasses.replace(config, ray=dataclasses.replace(config.ray, max_concurrent_batches=batches))
        )

    def drafting_settings(self, spec: Any) -> dict:
        """A user's engine_kwargs.speculative_config as our drafting settings: vLLM's own method runs."""
        name = "engine_kwargs.speculative_config"
        check(isinstance(spec, Mapping), name, "a mapping such as {'method': 'suffix', 'num_speculative_tokens': 16}")
        check(not self.drafting, name, "left out when `drafting` is set (one or the other names the drafter)")
        check(
            spec.get("method") in SPECULATIVE_METHODS,
            f"{name}.method",
            f"one of {sorted(SPECULATIVE_METHODS)}: vLLM's learning-free methods (a draft model or an EAGLE "
            "head is not run here; our drafters are `drafting`)",
        )
        unknown = sorted(set(spec) - set(SPECULATIVE_KEYS))
        check(not unknown, f"{name}.{unknown[0] if unknown else ''}", f"one of {sorted(SPECULATIVE_KEYS)}")
        settings: dict = {"drafter": SPECULATIVE_METHODS[spec["method"]]}
        for key, value in spec.items():
            if SPECULATIVE_KEYS[key]:
                *sub, field_name = SPECULATIVE_KEYS[key].split(".")
                (settings.setdefault(sub[0], {}) if sub else settings)[field_name] = value
        return settings


# engine_kwargs that are ours, not vLLM's -> the section that holds each: an engine's restarts after
# a failure (engine, pipeline/llm/stage.py), and whether it drafts (drafting, pipeline/engines/speculation.py).
OUR_ENGINE_KWARGS = {
    **dict.fromkeys(("hang_timeout_s", "max_restarts", "restart_window_s"), "engine"),
    **dict.fromkeys(("speculation", "speculation_window_s"), "drafting"),
}


def check(ok: bool, name: str, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"vLLMEngineProcessorConfig.{name}: must be {allowed}")
