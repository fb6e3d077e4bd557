"""Maps a `decoder.drafter` name to a drafter, and builds the model tables it needs once."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from drafters import model_tables
from drafters.base import Drafter
from drafters.bigram import BigramDrafter
from drafters.context_ngram import ContextNgramDrafter
from drafters.draft_model import DraftModelDrafter, self_draft_model
from drafters.datastore import Datastore
from drafters.mixed import MixedDrafter
from drafters.retrieval import RetrievalDrafter, check_vocabulary
from drafters.unigram import UnigramDrafter
from pipeline.config import DRAFTER_NAMES, DecoderConfig, ModelConfig

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


def needs_model_tables(config: DecoderConfig) -> bool:
    """Whether `config.drafter` drafts from tables built with the model's weights."""
    return config.drafter in NEEDS_BIGRAM | NEEDS_UNIGRAM and config.w > 0


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


def load_draft_model(config: DecoderConfig, model_config: ModelConfig, target):
    """The draft model of drafter "draft_model": a self-draft of `target` (a LoadedModel), or a
    model directory whose tokenizer must be the target's (speculative sampling compares the two
    models' probabilities token by token)."""
    if config.draft_model == "self":
        return self_draft_model(target.model, config.draft_layers)
    from pipeline.model_loading import load_model

    draft = load_model(replace(model_config, name=config.draft_model))
    if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise ValueError(f"decoder.draft_model: {config.draft_model!r} has a different tokenizer from the target "
                         f"{model_config.name!r}; a draft model must share the target's vocabulary")
    return draft.model


def make_drafter(config: DecoderConfig, tables: DrafterTables, pad_token: int,
                 draft_model=None, vocab_size: int | None = None) -> Drafter | None:
    """The drafter named by `config.drafter`; None for plain decoding. `draft_model` (from
    load_draft_model) is needed by drafter "draft_model" only; `vocab_size`, the target
    tokenizer's, is checked against a datastore's."""
    name = config.drafter
    if name not in DRAFTER_NAMES:
        raise ValueError(f"decoder.drafter: unknown {name!r}; choose one of {', '.join(DRAFTER_NAMES)}")
    if name == "none" or config.w == 0:
        return None
    if name == "draft_model":
        assert draft_model is not None, "drafter 'draft_model' needs the model from load_draft_model"
        return DraftModelDrafter(draft_model)
    retrieval = None
    if config.datastore and name in ("rest", "mixed"):
        # Memory-mapped: every actor (and every process on a node) shares the page cache.
        datastore = Datastore.open(config.datastore)
        if vocab_size is not None:
            check_vocabulary(datastore, vocab_size)
        retrieval = RetrievalDrafter(datastore, pad_token, config.retrieval_max_match,
                                     config.retrieval_min_match, config.retrieval_max_occurrences,
                                     config.retrieval_max_nodes)
    if name == "rest":
        return retrieval
    ngram = ContextNgramDrafter(config.ngram_max_q, config.ngram_min_q, pad_token)
    if name == "context_ngram":
        return ngram
    if name == "unigram":
        return UnigramDrafter(tables.unigram, pad_token)
    fill = BigramDrafter(tables.extended, "bigram" if name == "mixed" else name)
    return MixedDrafter(ngram, fill, pad_token, retrieval) if name == "mixed" else fill
