"""The transformers engine's settings: what it refuses of the config, and of a model, when the job
starts (pipeline/engines/build.py reads KIND). Its own section is `transformers:`
(pipeline/config/transformers_engine.py, TransformersConfig); these checks are the ones that span sections."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config, ConfigError, DraftingConfig, TransformersConfig
from pipeline.config.drafter_kinds import DRAFTER_KINDS
from pipeline.engines.base import EngineKind
from pipeline.engines.errors import ModelRefused

NAME = "transformers"
BATCH_SIZE = 8  # ray.batch_size auto: rows per call (the decoder runs one batch at a time, a few rows together)


def checked(config: Config) -> Config:
    """`config` as this engine runs it, or a ConfigError naming the first setting it cannot honour."""
    vllm, ray, decoder, own = config.vllm, config.ray, config.drafting, config.transformers
    kind = DRAFTER_KINDS[decoder.drafter]
    require(
        vllm.tensor_parallel_size == 1,
        "vllm.tensor_parallel_size",
        f"1 with engine.name {NAME} (tensor parallelism is vLLM's)",
    )
    require(
        not vllm.engine_args, "vllm.engine_args", f"empty with engine.name {NAME} (they are vLLM's engine arguments)"
    )
    require(
        not kind.vllm_method,
        "drafting.drafter",
        f"one of ours with engine.name {NAME}; {decoder.drafter!r} is vLLM's own (engine.name: vllm)",
    )
    # Its actor sees ray.batch_size rows per call; fewer than max_batch_requests leaves rows idle.
    require(
        batch_size(config) >= own.max_batch_requests,
        "ray.batch_size",
        f"at least transformers.max_batch_requests ({own.max_batch_requests}) with engine.name {NAME}, so every "
        "request row of the decoder has a prompt to take (a multiple of it keeps rows refilled)",
    )
    require(
        ray.max_concurrent_batches <= 1,
        "ray.max_concurrent_batches",
        f"0 (auto) or 1 with engine.name {NAME} (its decoder runs one batch at a time)",
    )
    check_drafter(config.drafting, config.transformers)
    return config


def batch_size(config: Config) -> int:
    """ray.batch_size, or for 0 (auto) BATCH_SIZE."""
    return config.ray.batch_size or BATCH_SIZE


def check_drafter(decoder: DraftingConfig, own: TransformersConfig) -> None:
    """What the drafter asks of this engine's settings (`own`), and refuses."""
    if own.lenience < 1:
        require(
            decoder.drafter == "draft_model",
            "transformers.lenience",
            "1 unless drafting.drafter is 'draft_model' (the only drafter it applies to)",
        )
    if DRAFTER_KINDS[decoder.drafter].draft_probabilities:
        require(
            own.max_batch_requests == 1,
            "transformers.max_batch_requests",
            f"1 with drafter {decoder.drafter!r} (its draft cache follows one request)",
        )
        require(
            not decoder.auto_w,
            "drafting.w",
            f"a number with drafter {decoder.drafter!r} ('auto' chooses among "
            "drafts already proposed, which for a draft model would waste its calls)",
        )
        require(own.k == 1, "transformers.k", f"1 with drafter {decoder.drafter!r} (it proposes one row of w tokens)")
        require(
            own.verify == "batch",
            "transformers.verify",
            f"'batch' with drafter {decoder.drafter!r} (speculative sampling verifies its one row with the "
            "draft's probabilities; there is no tree to merge)",
        )
    if DRAFTER_KINDS[decoder.drafter].tables:  # model tables keep bigram_top_k tokens per entry
        require(
            own.k <= decoder.bigram.top_k,
            "transformers.k",
            f"at most drafting.bigram.top_k ({decoder.bigram.top_k}) with drafter {decoder.drafter!r}",
        )


def check_model(config: Config, model_dir: Path) -> None:
    """Our decoder shows one KV cache to k draft rows and keeps the winner's entries; a
    sliding-window layer drops old entries on its own, which that bookkeeping cannot follow."""
    from transformers import AutoConfig, DynamicCache

    hf_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=config.model.trust_remote_code)
    kinds = sorted({type(layer).__name__ for layer in DynamicCache(config=hf_config).layers} - {"DynamicLayer"})
    if kinds:
        raise ModelRefused(
            f"model.name {config.model.name!r}: engine.name {NAME} cannot decode it: its attention "
            f"layers keep {', '.join(kinds)} caches (sliding-window attention), and speculative "
            "decoding here supports full-attention layers only. Use engine.name: vllm"
        )


def require(ok: bool, name: str, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{name}: must be {allowed}")


KIND = EngineKind(
    NAME,
    sections=("model", "drafting", "sampling", "transformers"),
    checked=checked,
    check_model=check_model,
    batch_size=batch_size,
    concurrent_batches=lambda config: 1,
    drafts_from_predictions=lambda config: False,
    slots=lambda config: config.transformers.max_batch_requests,
    async_drafters=lambda config: (),
)
