"""The drafter registry: `drafting.drafter` name -> its factory, and the model tables it drafts from.

The names and what each needs are pipeline/config/drafter_kinds.py's (the config validates against them);
a new drafter is one module in drafters/, one kind there and one factory in FACTORIES here. The
engines build a drafter only through `make_drafter` (one request at a time: the transformers
engine) or `make_batch_drafter` (a batch per call: vLLM's proposer), and the tables a drafter
needs only through `drafter_tables`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from collections.abc import Callable

import numpy as np

from drafters import model_tables
from drafters.base import BatchDrafter, Drafter
from drafters.bigram import BigramDrafter
from drafters.context_ngram import ContextNgramDrafter
from drafters.datastore import Datastore
from drafters.draft_model import DraftModelDrafter, self_draft_model
from drafters.per_request import PerRequestBatchDrafter
from drafters.mixed import MixedDrafter
from drafters.retrieval import RetrievalDrafter, check_vocabulary
from drafters.suffix import BatchSuffixDrafter
from drafters.suffix import Settings as SuffixSettings
from drafters.unigram import UnigramDrafter
from pipeline.config import Config, DraftingConfig, ModelConfig, TransformersConfig
from pipeline.config.drafter_kinds import DRAFTER_KINDS, DRAFTER_NAMES
from pipeline.loading.model import LoadedModel, cache_root, load_model


@dataclass(frozen=True)
class DrafterTables:
    """Read-only arrays shared by every request (and, in the Ray job, by every actor)."""

    unigram: np.ndarray | None = None  # [K] token ids, most likely first
    bigram: np.ndarray | None = None  # [V, K] token ids
    chained: np.ndarray | None = None  # [V, k, w] the bigram's j-th token, then its top-1 chained
    extended: np.ndarray | None = None  # [V, k, w] the bigram's j-th token, then the model's greedy continuation
    build_seconds: dict[str, float] = field(default_factory=dict)
    # drafting.datastore's arrays where the Ray job shares them through the object store (every actor
    # of a node maps the one copy); None: the drafter maps the files itself.
    datastore: Datastore | None = None

    def as_plain_arrays(self) -> DrafterTables:
        """The same tables with memory-mapped arrays as plain ndarrays: Ray copies an np.memmap into
        every reader, but maps a plain array zero-copy (read-only) from the object store."""

        def plain(array):
            return None if array is None else np.ascontiguousarray(array)

        store = self.datastore
        if store is not None:
            store = Datastore(plain(store.tokens), plain(store.suffix_array), store.meta, store.segments)
        return replace(
            self,
            unigram=plain(self.unigram),
            bigram=plain(self.bigram),
            chained=plain(self.chained),
            extended=plain(self.extended),
            datastore=store,
        )


@dataclass(frozen=True)
class DrafterParts:
    """What a factory may draw on: the settings, the tables, the target's pad token, the draft
    model (drafter "draft_model" only) and the target tokenizer's size (checked against a datastore)."""

    config: DraftingConfig
    tables: DrafterTables
    pad_token: int
    draft_model: object = None
    vocab_size: int | None = None


def _context_ngram(parts: DrafterParts) -> Drafter:
    config = parts.config
    return ContextNgramDrafter(config.ngram.max_q, config.ngram.min_q, parts.pad_token)


def _datastore(parts: DrafterParts) -> Datastore:
    """The job's copy in the object store where it gives one (its vocabulary checked once, by the
    task that prepared the model); else the files, memory-mapped (every process on a node shares
    the page cache), checked here."""
    if parts.tables.datastore is not None:
        return parts.tables.datastore
    datastore = Datastore.open(parts.config.datastore)
    if parts.vocab_size is not None:
        check_vocabulary(datastore, parts.vocab_size)
    return datastore


def _retrieval(parts: DrafterParts) -> RetrievalDrafter:
    config = parts.config
    return RetrievalDrafter(
        _datastore(parts),
        parts.pad_token,
        config.retrieval.max_match,
        config.retrieval.min_match,
        config.retrieval.max_occurrences,
        config.retrieval.max_nodes,
    )


def _batch_suffix(parts: DrafterParts) -> Drafter:
    config = parts.config
    settings = SuffixSettings(
        min_q=config.suffix.min_match,
        max_q=config.ngram.max_q,
        max_match=config.suffix.max_match,
        min_probability=config.suffix.min_probability,
    )
    return BatchSuffixDrafter(
        config.w,
        settings,
        capacity=max(config.suffix.max_tokens, 16),
        store=_datastore(parts) if config.datastore else None,
        pad_token=parts.pad_token,
    )


def _mixed(parts: DrafterParts) -> Drafter:
    retrieval = _retrieval(parts) if parts.config.datastore else None
    return MixedDrafter(
        _context_ngram(parts), BigramDrafter(parts.tables.chained, "bigram"), parts.pad_token, retrieval
    )


def _draft_model(parts: DrafterParts) -> Drafter:
    assert parts.draft_model is not None, "drafter 'draft_model' needs the model from load_draft_model"
    return DraftModelDrafter(parts.draft_model)


# A factory per name of pipeline/config/drafter_kinds.py; None: nothing of ours drafts (plain decoding,
# or a method vLLM runs itself).
FACTORIES: dict[str, Callable[[DrafterParts], Drafter] | None] = {
    "none": None,
    "context_ngram": _context_ngram,
    "unigram": lambda parts: UnigramDrafter(parts.tables.unigram, parts.pad_token),
    "bigram": lambda parts: BigramDrafter(parts.tables.chained, "bigram"),
    "extended_bigram": lambda parts: BigramDrafter(parts.tables.extended, "extended_bigram"),
    "mixed": _mixed,
    "draft_model": _draft_model,
    "rest": _retrieval,
    "batch_suffix": _batch_suffix,
    "vllm_ngram": None,
    "vllm_suffix": None,
    "vllm_ngram_gpu": None,
}
assert tuple(FACTORIES) == DRAFTER_NAMES, (
    "pipeline/loading/drafters.py FACTORIES must name every drafter kind, in order"
)


def needs_model_tables(config: DraftingConfig) -> bool:
    """Whether `config.drafter` drafts from tables built with the model's weights."""
    return bool(DRAFTER_KINDS[config.drafter].tables) and config.w > 0


def needs_datastore(config: DraftingConfig) -> bool:
    """Whether `config.drafter` drafts from the datastore `config.datastore` names."""
    return DRAFTER_KINDS[config.drafter].datastore and bool(config.datastore) and config.w > 0


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def prefix_ids(tokenizer, kind: str) -> list[int]:
    """What the model sees before token x when the bigram table is computed."""
    if kind == "none":
        return []
    if kind == "bos":
        if tokenizer.bos_token_id is None:
            raise ValueError("drafting.bigram.prefix: 'bos' needs a tokenizer with a BOS token; use 'none'")
        return [tokenizer.bos_token_id]
    if kind == "assistant_header":
        if not tokenizer.chat_template:
            raise ValueError("drafting.bigram.prefix: 'assistant_header' needs a chat template; use 'bos' or 'none'")
        messages = [{"role": "user", "content": "Hi"}]
        with_header = chat_ids(tokenizer, messages, add_generation_prompt=True)
        without = chat_ids(tokenizer, messages, add_generation_prompt=False)
        assert with_header[: len(without)] == without, "chat template's generation prompt is not a suffix"
        return with_header[len(without) :]
    raise ValueError(f"drafting.bigram.prefix: unknown {kind!r}")


def build_tables(
    model, tokenizer, fingerprint: str, config: DraftingConfig, cache_dir: Path, rows: int = 1
) -> DrafterTables:
    """Builds (or loads from the disk cache) the tables `config.drafter` needs, for drafts of up
    to `rows` rows of config.w tokens."""
    needed = set(DRAFTER_KINDS[config.drafter].tables) if config.w > 0 else set()
    unigram = bigram = chained = extended = None
    seconds: dict[str, float] = {}
    if "unigram" in needed:
        unigram = model_tables.unigram_scores(model).topk(config.bigram.top_k).indices.numpy().astype(np.int32)
    if needed & {"bigram", "chained", "extended"}:
        prefix = prefix_ids(tokenizer, config.bigram.prefix)
        settings = f"prefix={prefix}|top_k={config.bigram.top_k}"
        path = model_tables.table_path(cache_dir, fingerprint, "bigram", settings)
        bigram, seconds["bigram"] = model_tables.cached_table(
            path,
            lambda: model_tables.compute_bigram_table(model, prefix, config.bigram.top_k, config.bigram.batch_size),
        )
        if "chained" in needed:
            chained = model_tables.chain_extension(bigram, rows, config.w)
        if "extended" in needed:
            path = model_tables.table_path(cache_dir, fingerprint, "extended", f"{settings}|k={rows}|w={config.w}")
            extended, seconds["extended"] = model_tables.cached_table(
                path,
                lambda: model_tables.model_extension(model, bigram, prefix, rows, config.w, config.bigram.batch_size),
            )
    return DrafterTables(unigram, bigram, chained, extended, seconds)


def drafter_tables(config: Config, loaded: LoadedModel | None = None) -> DrafterTables:
    """The tables config.drafting drafts from: read from the cache, or built with the model (`loaded`,
    else loaded here, only when a table needs it). The one way tables are made, for every engine
    and for the task that prepares a job's model."""
    if not needs_model_tables(config.drafting):
        return DrafterTables()
    loaded = loaded or load_model(config.model)
    # Rows per draft: transformers.k (the vLLM engine drafts one row, and refuses another k).
    return build_tables(
        loaded.model,
        loaded.tokenizer,
        loaded.fingerprint,
        config.drafting,
        cache_root(config.model),
        config.transformers.k,
    )


def load_draft_model(settings: TransformersConfig, model_config: ModelConfig, target):
    """The draft model of drafter "draft_model" (transformers.draft_model): a self-draft of `target`
    (a LoadedModel), or a model directory whose tokenizer must be the target's (speculative
    sampling compares the two models' probabilities token by token)."""
    if settings.draft_model == "self":
        return self_draft_model(target.model, settings.draft_layers)
    draft = load_model(replace(model_config, name=settings.draft_model))
    if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise ValueError(
            f"transformers.draft_model: {settings.draft_model!r} has a different tokenizer from the target "
            f"{model_config.name!r}; a draft model must share the target's vocabulary"
        )
    return draft.model


def make_drafter(
    config: DraftingConfig,
    tables: DrafterTables | None,
    pad_token: int,
    draft_model=None,
    vocab_size: int | None = None,
) -> Drafter | None:
    """The drafter named by `config.drafter`; None for plain decoding (or a method vLLM runs itself)."""
    if config.drafter not in FACTORIES:
        raise ValueError(f"drafting.drafter: unknown {config.drafter!r}; choose one of {', '.join(DRAFTER_NAMES)}")
    make = FACTORIES[config.drafter]
    if make is None or config.w == 0:
        return None
    return make(DrafterParts(config, tables or DrafterTables(), pad_token, draft_model, vocab_size))


def make_batch_drafter(
    config: DraftingConfig,
    tables: DrafterTables | None,
    pad_token: int,
    vocab_size: int | None = None,
    model_vocab_size: int | None = None,
) -> BatchDrafter | None:
    """The drafter `config.drafter` names as a BatchDrafter (what vLLM's proposer holds): a batched
    one as it is, any other adapted by drafters/per_request.py (its drafts checked to be ids below
    `model_vocab_size`, else `vocab_size`, the tokenizer's); None for plain decoding (or a method
    vLLM runs itself)."""
    drafter = make_drafter(config, tables, pad_token, None, vocab_size)
    kind = DRAFTER_KINDS[config.drafter]
    if drafter is None or kind.batched:
        return drafter
    return PerRequestBatchDrafter(drafter, config.w, config.ngram.max_q, model_vocab_size or vocab_size)
