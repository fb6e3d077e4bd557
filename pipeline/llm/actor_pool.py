"""The engine's actor pool joined to a Dataset, for the processor (pipeline/llm/processor.py) and so for the
job: the model prepared where it runs (converted if need be, checked, the drafter tables built and
left in that node's object store), the pool, each actor's resources and threads.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import ray

from drafters.datastore import Datastore
from pipeline.loading.drafters import drafter_tables, needs_datastore
from pipeline.config import Config, RayConfig
from pipeline.engines.build import ModelRefused, check_engine_can_run, concurrent_batches, engine_kind
from pipeline import storage
from pipeline.llm.errors import JobFailed
from pipeline.loading.model import cache_root, load_tokenizer, resolve_model_dir


def local_datastore(config: Config, path: str) -> str:
    """A local directory of the datastore at `path`: one in object storage (a series' store,
    pipeline/job/series_store.py) is copied once per node; each version of a store never changes.
    A store of segments (its meta.json names them, beside it) has each segment copied once per node
    too, whichever versions name it, and linked into the version's copy (Datastore.open finds it there)."""
    cache = cache_root(config.model) / "datastores"
    local = Path(storage.local_copy(path, cache))
    if storage.is_uri(path):
        meta = json.loads((local / "meta.json").read_text())
        for name in meta.get("segments", []):
            segment = storage.local_copy(f"{path.rstrip('/').rsplit('/', 1)[0]}/{name}", cache)
            try:
                (local / name).symlink_to(segment)
            except FileExistsError:  # another process of the node linked it first
                pass
    return str(local)


# Each tokenize-stage actor's CPUs: templating and tokenizing cost a fraction of what generating does.
TOKENIZE_CPUS = 0.25


# --- The model, prepared where it runs --------------------------------------------------------


@ray.remote(num_returns=3)
def prepare_model(config: Config):
    """Runs with the actors' resources: resolves (or converts) the model, checks that the engine
    can run it, and builds the drafter tables. Returns (a small report, the tables or None, the
    engine's tokenizer for the tokenize stage)."""
    started = time.perf_counter()
    model_dir = resolve_model_dir(config.model)[0]
    check_engine_can_run(config, model_dir)
    datastore = None
    if config.drafting.datastore:  # one built with another tokenizer would draft noise in every actor
        from transformers import AutoTokenizer

        from drafters.retrieval import check_vocabulary

        datastore = Datastore.open(local_datastore(config, config.drafting.datastore))
        try:
            check_vocabulary(datastore, len(AutoTokenizer.from_pretrained(model_dir)))
        except ValueError as error:
            raise ModelRefused(str(error)) from error
    tables = drafter_tables(config)
    if needs_datastore(config.drafting):  # shared like the tables: one copy per node, not one per actor
        tables = dataclasses.replace(tables, datastore=datastore)
    tokenizer = load_tokenizer(model_dir, config.model)
    report = {"node": ray.get_runtime_context().get_node_id(), "seconds": round(time.perf_counter() - started, 2)}
    return report, None if tables is None else tables.as_plain_arrays(), tokenizer


def actor_pool(settings: RayConfig, batches: int) -> ray.data.ActorPoolStrategy:
    """The stage's actors; each runs `batches` at once where its engine takes several (the vLLM
    engine runs their requests together and never waits for one batch to drain). Ray Data runs a
    class's __call__ on one thread unless told it may run it on several."""
    return ray.data.ActorPoolStrategy(
        min_size=settings.min_actors,
        max_size=settings.max_actors,
        max_tasks_in_flight_per_actor=batches,
        max_concurrent_calls_per_actor=batches,
        enable_true_multi_threading=batches > 1,
    )


def actor_resources(settings: RayConfig) -> dict:
    """What each actor (and the task that prepares the model) asks Ray for."""
    resources = {"num_cpus": settings.num_cpus_per_actor, "num_gpus": settings.num_gpus_per_actor}
    if settings.accelerator_type:
        resources["accelerator_type"] = settings.accelerator_type
    return resources


def unplaceable(settings: RayConfig) -> JobFailed:
    return JobFailed(
        f"ray: no node could take an actor asking for {actor_resources(settings)} within "
        f"ray.wait_for_actors_s ({settings.wait_for_actors_s:g} s); the cluster has "
        f"{ray.cluster_resources()} (an autoscaler may not offer such a node)"
    )


@dataclasses.dataclass(frozen=True)
class Preparation:
    """The model's preparation (prepare_model) under way for `config`: its report, tables and
    tokenizer, ObjectRefs."""

    config: Config
    report: ray.ObjectRef
    tables: ray.ObjectRef
    tokenizer: ray.ObjectRef


def start_preparing(config: Config, runtime_env: dict | None = None) -> Preparation:
    """Starts preparing the model on a worker like the actors (their resources, and the user's
    runtime_env: a hub cache named in its env_vars is found there too; without one, any idle worker,
    as a worker with its own environment is a process started for it); the tables stay there. A
    caller with other work before its Dataset runs (the job counts its input) starts it first."""
    task = prepare_model.options(**actor_resources(config.ray), runtime_env=runtime_env or None)
    return Preparation(config, *task.remote(config))


def prepared(config: Config, runtime_env: dict | None = None, started: Preparation | None = None) -> Preparation:
    """The model's preparation for `config`, finished: `started` if it is for that config, else one
    started now. A cluster that cannot place it within ray.wait_for_actors_s
    fails the job, naming what it asked for; a model the engine cannot run fails it too."""
    if started is None or started.config != config:
        started = start_preparing(config, runtime_env)
    try:
        ray.get(started.report, timeout=config.ray.wait_for_actors_s)
    except ModelRefused as error:
        raise JobFailed(str(error)) from error
    except ray.exceptions.GetTimeoutError as error:
        ray.cancel(started.report, force=True)
        raise unplaceable(config.ray) from error
    return started


def stage_environment(num_threads: int, runtime_env: dict | None) -> dict | None:
    """The user's runtime_env with the actors' own variables (actor_environment) added; None if empty."""
    environment = dict(runtime_env or {})
    variables = {**environment.get("env_vars", {}), **actor_environment(num_threads).get("env_vars", {})}
    if variables:
        environment["env_vars"] = variables
    return environment or None


def actor_environment(num_threads: int) -> dict:
    """Ray starts a worker with num_cpus < 2 with OMP_NUM_THREADS=1, and OpenMP reads it once, when
    the process starts: vLLM's CPU kernels then ran on one thread (half the tokens/s of the same
    engine in the driver) or failed on a thread-count mismatch. The actors start with
    model.num_threads instead."""
    if not num_threads:
        return {}
    return {"env_vars": {"OMP_NUM_THREADS": str(num_threads)}}


def generation_stage(
    dataset: ray.data.Dataset, config: Config, constructor_kwargs: dict, runtime_env: dict | None = None
) -> ray.data.Dataset:
    """The one place the engine's actor pool joins a Dataset, for the job and for pipeline.llm's
    processor alike: the pool, each actor's resources and threads, batches of ray.batch_size, and
    a lost actor (node gone, process killed) restarted with its batch retried (Ray Data's default for
    actor pools: max_restarts and max_task_retries -1)."""
    from pipeline.llm.stage import GenerationStage

    return dataset.map_batches(
        GenerationStage,
        fn_constructor_kwargs=constructor_kwargs,
        compute=actor_pool(config.ray, concurrent_batches(config)),
        **actor_resources(config.ray),
        batch_size=engine_kind(config.engine.name).batch_size(config),
        batch_format="pyarrow",
        runtime_env=stage_environment(config.model.num_threads, runtime_env),
    )


def tokenize_stage(dataset: ray.data.Dataset, settings: RayConfig, tokenizer: ray.ObjectRef, stage) -> ray.data.Dataset:
    """The processor's tokenize stage (prompts.py's TokenizeStage, with the generation stage's
    settings `stage`) joined to a Dataset: one actor up to one per engine actor, a block at a time."""
    from pipeline.llm.prompts import TokenizeStage

    return dataset.map_batches(
        TokenizeStage,
        fn_constructor_kwargs={"tokenizer": tokenizer, "settings": stage},
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max(1, settings.max_actors)),
        num_cpus=TOKENIZE_CPUS,
        batch_size=None,
        batch_format="pyarrow",
    )
