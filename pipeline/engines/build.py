"""`build_engine` makes the engine `engine.name` names (pipeline/engines/base.py says what an engine is)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.config import Config, ConfigError
from pipeline.drafter_registry import DrafterTables, drafter_tables
from pipeline.engines.base import Engine
from pipeline.model_loading import LoadedModel, load_model, resolve_model_dir


class ModelRefused(ValueError):
    """`engine.name` cannot run this model; the message names the model and the reason."""


def check_engine_can_run(config: Config, model_dir: Path) -> None:
    """Refuses, from the model's config alone (no weights loaded), a model the engine cannot run,
    so a job fails at its start instead of in every actor with every row lost."""
    from transformers import AutoConfig, DynamicCache

    hf_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=config.model.trust_remote_code)
    name = f"model.name {config.model.name!r}"
    if config.engine.name == "transformers":
        # Our decoder shows one KV cache to k draft rows and keeps the winner's entries; a
        # sliding-window layer drops old entries on its own, which that bookkeeping cannot follow.
        kinds = sorted({type(layer).__name__ for layer in DynamicCache(config=hf_config).layers} - {"DynamicLayer"})
        if kinds:
            raise ModelRefused(f"{name}: engine.name transformers cannot decode it: its attention layers keep "
                               f"{', '.join(kinds)} caches (sliding-window attention), and speculative decoding here "
                               "supports full-attention layers only. Use engine.name: vllm")
        return
    from pipeline.engines.vllm import check_vllm_version

    check_vllm_version()  # a vLLM this package does not support fails the job here, naming the supported ones
    from vllm import ModelRegistry

    architectures = getattr(hf_config, "architectures", None) or []
    supported = set(ModelRegistry.get_supported_archs())
    if not any(arch in supported for arch in architectures):
        raise ModelRefused(f"{name}: engine.name vllm has no implementation of {architectures or 'its architecture'} "
                           "(vLLM's ModelRegistry); use engine.name: transformers if transformers can run it")
    check_tensor_parallel(config, hf_config, name)
    check_vllm_args(config, model_dir)


def check_vllm_args(config: Config, model_dir: Path) -> None:
    """engine.vllm_args as vLLM takes them: an unknown name, or a value vLLM's own configuration
    refuses for this model (vLLM's message), fails here in the driver, not in every actor."""
    if not config.engine.vllm_args:
        return
    from vllm.engine.arg_utils import EngineArgs

    names = {f.name for f in dataclasses.fields(EngineArgs)}
    for key in config.engine.vllm_args:
        if key not in names:
            raise ModelRefused(f"engine.vllm_args.{key}: not one of vLLM's engine arguments "
                               "(vllm.engine.arg_utils.EngineArgs)")
    try:
        EngineArgs(model=str(model_dir), **config.engine.vllm_args).create_engine_config()
    except Exception as error:  # noqa: BLE001 - whatever vLLM raises names the problem
        raise ModelRefused(f"engine.vllm_args: vLLM refuses them for {config.model.name!r}: {error}") from error


def check_tensor_parallel(config: Config, hf_config, name: str) -> None:
    """vLLM splits attention heads over the ranks (key/value heads are split, or copied when fewer
    than the ranks); on a CPU each rank needs cores of its own."""
    ranks = config.engine.tensor_parallel_size
    if ranks == 1:
        return
    text = getattr(hf_config, "get_text_config", lambda: hf_config)()
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    if heads is None or heads % ranks or (kv_heads % ranks if kv_heads >= ranks else ranks % kv_heads):
        raise ModelRefused(f"{name}: engine.tensor_parallel_size {ranks} cannot split its {heads} attention heads "
                           f"({kv_heads} key/value heads) evenly over the ranks")
    import torch

    if not torch.cuda.is_available():
        from pipeline.engines.vllm import cpu_binding

        try:
            cpu_binding(config)
        except ConfigError as error:
            raise ModelRefused(str(error)) from error


def build_engine(config: Config, tables: DrafterTables | None = None, loaded: LoadedModel | None = None) -> Engine:
    """The engine of `config`. Drafter tables not given are made here (drafter_tables)."""
    if config.engine.name == "vllm":
        from pipeline.engines.vllm import VllmEngine

        model_dir, _ = resolve_model_dir(config.model)
        return VllmEngine(config, str(model_dir), tables if tables is not None else drafter_tables(config))
    from pipeline.engines.transformers import TransformersEngine

    loaded = loaded or load_model(config.model)
    return TransformersEngine(config, loaded, tables if tables is not None else drafter_tables(config, loaded))
