"""The one place that maps `engine.name` to an engine (pipeline/engines/base.py says what an engine
is): `build_engine` makes it, and what each engine declares of its settings (its KIND: the config
as it runs it, the models it refuses, its batches at once) is read here for everyone above."""

from __future__ import annotations

import importlib
import math
import time
from pathlib import Path
from collections.abc import Sequence

from pipeline.config import Config
from pipeline.loading.drafters import DrafterTables, drafter_tables
from pipeline.engines.base import Engine, EngineKind
from pipeline.engines.errors import ModelRefused
from pipeline.loading.model import LoadedModel, load_model, resolve_model_dir

__all__ = [
    "ModelRefused",
    "build_engine",
    "build_engines",
    "build_timed",
    "check_engine_can_run",
    "checked_config",
    "concurrent_batches",
    "drafts_from_predictions",
    "engine_kind",
    "run_batch_size",
]

# A long run's auto batches grow. Ray Data keeps about 25 KB on the driver for each block a run
# makes, until the run ends, and every batch costs its scheduling, a preprocess and a write
# (docs/measurements/corpus-scale.md): a run makes at most RUN_BATCHES, and no more than
# ACTOR_BATCHES for each of its actors (enough for the speculation mode's windows and an even end).
RUN_BATCHES = 1_000
ACTOR_BATCHES = 200
MAX_AUTO_BATCH = 4_096  # rows: what one batch may hold in an actor when it grows


def engine_kind(name: str) -> EngineKind:
    """What the engine `name` (engine.name, resolved) declares; only its package is imported."""
    if name == "vllm":
        from pipeline.engines.vllm import KIND

        return KIND
    from pipeline.engines.transformers import KIND

    return KIND


def checked_config(config: Config) -> Config:
    """`config` as its engine runs it (its own values resolved), or a ConfigError naming the first
    setting the engine cannot honour: run when the job or the processor starts, and again (it is
    idempotent) by build_engine."""
    return engine_kind(config.engine.name).checked(config)


def check_engine_can_run(config: Config, model_dir: Path) -> None:
    """Refuses, from the model's config alone (no weights loaded), a model the engine cannot run
    (ModelRefused), so a job fails at its start instead of in every actor with every row lost."""
    engine_kind(config.engine.name).check_model(config, model_dir)


def concurrent_batches(config: Config) -> int:
    """Batches one actor works on at once: 1 for an engine that runs one at a time; the vLLM
    engine's is ray.max_concurrent_batches, or auto (pipeline/engines/vllm/settings.py)."""
    return engine_kind(config.engine.name).concurrent_batches(config)


def run_batch_size(batch: int, rows: int, actors: int) -> int:
    """Rows per Ray batch for a run of `rows` on up to `actors` actors whose ray.batch_size is auto:
    the engine's `batch` (EngineKind.batch_size), times what keeps the run within RUN_BATCHES and
    ACTOR_BATCHES per actor (a whole multiple of it, so the engine's slots still fill evenly), up to
    MAX_AUTO_BATCH rows. A batch's size never changes a row's text."""
    most = max(1, MAX_AUTO_BATCH // batch)
    batches = min(RUN_BATCHES, ACTOR_BATCHES * actors)
    return batch * min(most, max(1, math.ceil(rows / (batch * batches))))


def drafts_from_predictions(config: Config) -> bool:
    """Whether a row's `prediction` is drafted from (its `predicted_from` is then set)."""
    return engine_kind(config.engine.name).drafts_from_predictions(config)


def build_engine(config: Config, tables: DrafterTables | None = None, loaded: LoadedModel | None = None) -> Engine:
    """The engine of `config` (checked_config). Drafter tables not given are made here (drafter_tables)."""
    config = checked_config(config)
    if config.engine.name == "vllm":
        from pipeline.engines.vllm import VllmEngine

        model_dir, _ = resolve_model_dir(config.model)
        return VllmEngine(config, str(model_dir), tables if tables is not None else drafter_tables(config))
    from pipeline.engines.transformers import TransformersEngine

    loaded = loaded or load_model(config.model)
    return TransformersEngine(config, loaded, tables if tables is not None else drafter_tables(config, loaded))


def build_timed(config: Config, tables: DrafterTables | None = None) -> tuple[Engine, float]:
    """build_engine's engine and the seconds it took, the engine's library imported before the
    clock starts: what building it again in this process costs (an engine switched or replaced)."""
    importlib.import_module(config.engine.name)  # vllm, or transformers
    started = time.perf_counter()
    return build_engine(config, tables), time.perf_counter() - started


def build_engines(configs: Sequence[Config]) -> list[Engine]:
    """An engine per config, in order (a benchmark's side by side): configs alike in every section
    their engine reads share one engine, and the transformers engines of one model share its weights."""
    built: list[tuple[tuple, Engine]] = []
    models: dict[object, LoadedModel] = {}
    engines = []
    for config in configs:
        config = checked_config(config)
        reads = (
            config.engine.name,
            *(getattr(config, section) for section in engine_kind(config.engine.name).sections),
        )
        engine = next((engine for other, engine in built if other == reads), None)
        if engine is None:
            if config.engine.name == "transformers" and config.model not in models:
                models[config.model] = load_model(config.model)
            engine = build_engine(config, loaded=models.get(config.model))  # (vLLM loads its own)
            built.append((reads, engine))
        engines.append(engine)
    return engines
