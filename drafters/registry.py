"""Maps a `decoder.drafter` name to a drafter, and builds the model tables it needs once."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from drafters import model_tables
from drafters.base import Drafter
from drafters.bigram import BigramDrafter
from drafters.context_ngram import ContextNgramDrafter
from drafters.mixed import MixedDrafter
from drafters.unigram import UnigramDrafter
from pipeline.config import DRAFTER_NAMES, DecoderConfig

NEEDS_UNIGRAM = {"unigram"}
NEEDS_BIGRAM = {"bigram", "extended_bigram", "mixed"}


@dataclass(frozen=True)
class DrafterTables:
    """Read-only arrays shared by every request (and, in the Ray job, by every actor)."""
    unigram: np.ndarray | None = None  # [K] token ids, most likely first
    bigram: np.ndarray | None = None  # [V, K] token ids
    extended: np.ndarray | None = None  # [V, k, w] token ids
    build_seconds: dict[str, float] = field(default_factory=dict)

    def as_plain_arrays(self) -> "DrafterTables":
        """The same tables with memory-mapped arrays as plain ndarrays: Ray copies an np.memmap into
        every reader, but maps a plain array zero-copy (read-only) from the object store."""
        def plain(array):
            return None if array is None else np.ascontiguousarray(array)
        return replace(self, unigram=plain(self.unigram), bigram=plain(self.bigram), extended=plain(self.extended))


def build_tables(model, tokenizer, fingerprint: str, config: DecoderConfig, cache_dir: Path) -> DrafterTables:
    """Builds (or loads from the disk cache) the tables `config.drafter` needs."""
    unigram = bigram = extended = None
    seconds: dict[str, float] = {}
    if config.drafter in NEEDS_UNIGRAM:
        unigram = model_tables.unigram_scores(model).topk(config.bigram_top_k).indices.numpy().astype(np.int32)
    if config.drafter in NEEDS_BIGRAM and config.w > 0:
        prefix = model_tables.prefix_ids(tokenizer, config.bigram_prefix)
        settings = f"prefix={prefix}|top_k={config.bigram_top_k}"
        path = model_tables.table_path(cache_dir, fingerprint, "bigram", settings)
        bigram, seconds["bigram"] = model_tables.cached_table(
            path, lambda: model_tables.compute_bigram_table(model, prefix, config.bigram_top_k, config.bigram_batch_size))
        if config.drafter == "extended_bigram" and config.bigram_extension == "model":
            path = model_tables.table_path(cache_dir, fingerprint, "extended", f"{settings}|k={config.k}|w={config.w}")
            extended, seconds["extended"] = model_tables.cached_table(
                path, lambda: model_tables.model_extension(model, bigram, prefix, config.k, config.w,
                                                           config.bigram_batch_size))
        else:
            extended = model_tables.chain_extension(bigram, config.k, config.w)
    return DrafterTables(unigram=unigram, bigram=bigram, extended=extended, build_seconds=seconds)


def make_drafter(config: DecoderConfig, tables: DrafterTables, pad_token: int) -> Drafter | None:
    """The drafter named by `config.drafter`; None for plain decoding."""
    name = config.drafter
    if name not in DRAFTER_NAMES:
        raise ValueError(f"decoder.drafter: unknown {name!r}; choose one of {', '.join(DRAFTER_NAMES)}")
    if name == "none" or config.w == 0:
        return None
    ngram = ContextNgramDrafter(config.ngram_max_q, config.ngram_min_q, pad_token)
    if name == "context_ngram":
        return ngram
    if name == "unigram":
        return UnigramDrafter(tables.unigram, pad_token)
    fill = BigramDrafter(tables.extended, "bigram" if name == "mixed" else name)
    return MixedDrafter(ngram, fill, pad_token) if name == "mixed" else fill
