"""What vLLM runs for `drafting.drafter`, on the vLLM installed: one name per drafter, whichever vLLM
runs it.

- vLLM 0.32 (model runner V1, the CPU product): ours is vLLM's `custom_class` proposer (proposer.py),
  vLLM's own methods run as vLLM has them (`vllm_suffix` through arctic-inference).
- vLLM 0.34 (model runner V2, every method on the device, asynchronous): ours is the device speculator
  (v2/, drafters/device/), drafting from the sources its drafter names (DEVICE_SOURCES); vLLM's own
  methods are its V2 speculators (`vllm_suffix` is vLLM's in-tree GPU suffix decoding).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.config import Config
from pipeline.config.drafter_kinds import VLLM_METHODS
from pipeline.engines.vllm.versions import runs_speculator
from pipeline.engines.vllm.v2.plugin import H100_DRAFT_LENGTHS, with_keyed_draws
from pipeline.engines.vllm.v2.plugin import engine_arguments as speculator_arguments

PROPOSER = "pipeline.engines.vllm.proposer.NgrammysProposer"


# Our drafters the device speculator runs, and its sources for each: the request's own context always,
# other requests' outputs (`corpus`), the model's bigram table (`table`), drafting.datastore (`store`).
# A row's prediction drafts first with every one. The others (unigram, bigram, extended_bigram, rest,
# draft_model) have no device form: they fail at start on vLLM 0.34, naming these.
DEVICE_SOURCES = {
    "batch_suffix": {"corpus": True, "table": False, "store": True},
    "mixed": {"corpus": True, "table": True, "store": True},  # N-Grammys' mixed drafter: context, retrieval, table
    "context_ngram": {"corpus": False, "table": False, "store": False},
}


def vllm_arguments(
    config: Config, num_speculative_tokens: int, drafts: bool, ours: bool, table_dir: Path | None
) -> dict:
    """vLLM's engine arguments for the config's mode on the vLLM installed: its speculative config
    where it drafts (`speculative_arguments`), and on vLLM 0.34 the keyed-draw processor in every
    mode (a sampled row is one text for its seed, plain or drafted: v2/keyed_draws.py)."""
    arguments = speculative_arguments(config, num_speculative_tokens, ours, table_dir) if drafts else {}
    return with_keyed_draws(arguments) if runs_speculator() else arguments


def speculative_arguments(config: Config, num_speculative_tokens: int, ours: bool, table_dir: Path | None) -> dict:
    """vLLM's engine arguments (speculative_config, and on 0.34 the prediction processor) for the
    config's drafter at num_speculative_tokens, on the vLLM installed. `table_dir`: where the model's
    bigram table is written for the device speculator to read (`write_bigram_table`)."""
    decoder = config.drafting
    if runs_speculator() and ours:
        sources = DEVICE_SOURCES[decoder.drafter]
        options = {
            "max_depth": min(decoder.suffix.max_match, 127),
            "corpus_tokens": decoder.suffix.max_tokens if sources["corpus"] else 0,
        }
        if sources["store"] and decoder.datastore:
            options["store"] = decoder.datastore
        table = table_dir / BIGRAM_FILE if table_dir is not None else None
        if sources["table"] and table is not None and table.exists():
            options["bigram_table"] = str(table)
        return speculator_arguments(num_speculative_tokens, options, draft_lengths(config, num_speculative_tokens))
    speculative = {
        "method": VLLM_METHODS.get(decoder.drafter, "custom_class"),
        "num_speculative_tokens": num_speculative_tokens,
    }
    if ours:
        speculative["model"] = PROPOSER
    elif decoder.drafter in ("vllm_ngram", "vllm_ngram_gpu"):
        speculative.update(prompt_lookup_min=decoder.ngram.min_q, prompt_lookup_max=decoder.ngram.max_q)
    return {"speculative_config": speculative}


def draft_lengths(config: Config, longest: int) -> list[tuple[int, int, int]] | None:
    """The device speculator's draft length by running requests: `w: auto` on GPU actors runs
    H100_DRAFT_LENGTHS (capped at the longest draft); a fixed w, or a CPU, drafts w at every size."""
    if not (config.drafting.auto_w and config.ray.num_gpus_per_actor > 0):
        return None
    return [(first, last, min(length, longest)) for first, last, length in H100_DRAFT_LENGTHS]


def longest_draft(config: Config, ours: bool) -> int:
    """vLLM's num_speculative_tokens. On 0.32 ours also drafts a row's prediction, up to
    drafting.prediction_w tokens. On 0.34 vLLM's k is one for the batch (a k of prediction_w would
    verify that many slots for every row): w, or under `w: auto` on GPU actors the longest of
    H100_DRAFT_LENGTHS."""
    w = config.drafting.w
    if runs_speculator():
        return longest_scheduled() if draft_lengths(config, w) is not None else w
    return max(w, config.drafting.prediction_w) if ours else w


def longest_scheduled() -> int:
    return max(length for _, _, length in H100_DRAFT_LENGTHS)


BIGRAM_FILE = "bigram.npy"


def write_bigram_table(tables, table_dir: Path) -> Path | None:
    """The model's most likely next token after each token ([vocab] int32), from whichever table the
    drafter's tables hold (bigram [V, K], chained or extended [V, k, w]: their first token), written
    where the device speculator reads it; None where the tables hold none."""
    for name in ("chained", "extended", "bigram"):
        table = getattr(tables, name, None) if tables is not None else None
        if table is not None:
            first = table.reshape(table.shape[0], -1)[:, 0]
            table_dir.mkdir(parents=True, exist_ok=True)
            path = table_dir / BIGRAM_FILE
            np.save(path, np.ascontiguousarray(first, dtype=np.int32), allow_pickle=False)
            return path
    return None
