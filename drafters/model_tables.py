"""Drafter tables derived from the model's own weights (N-Grammys §4.1), built once and cached.

- unigram ranking: p(x) ∝ exp(-||u_x - ū||_V), u_x the output embedding of token x, ū their
  mean, ||z||_V = sqrt(zᵀ VᵀV z) with V the input-embedding matrix;
- bigram table: the top-K tokens of p_M(·|prefix, x) for every token x, from batched forwards;
- extended bigram: [V, k, w] rows, the bigram's j-th choice continued greedily (by chaining the
  bigram's top-1, or by the model itself).

Tables are saved as .npy under the cache directory, keyed by the model fingerprint and the
settings, and loaded memory-mapped with allow_pickle=False.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache

from drafters.primitives.built_once import code_key
from drafters.primitives.forward import expanded_copy, prefill


def vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


@torch.no_grad()
def unigram_scores(model) -> torch.Tensor:  # [V]
    """log p(x) up to a constant: -||u_x - ū||_V."""
    output_emb = model.get_output_embeddings().weight.float()  # [V, d]
    input_emb = model.get_input_embeddings().weight.float()  # [V, d]
    centered = output_emb - output_emb.mean(dim=0)  # [V, d]
    gram = input_emb.T @ input_emb  # [d, d] = VᵀV
    squared_norm = ((centered @ gram) * centered).sum(dim=1).clamp_min(0)  # [V]
    return -squared_norm.sqrt()


@torch.no_grad()
def compute_bigram_table(model, prefix: list[int], top_k: int, batch_size: int) -> np.ndarray:  # [V, K]
    vocab = vocab_size(model)
    table = np.empty((vocab, top_k), dtype=np.int32)
    prefix_cache = prefill(model, prefix)
    for start in range(0, vocab, batch_size):
        tokens = torch.arange(start, min(vocab, start + batch_size))[:, None]  # [b, 1]
        cache = expanded_copy(prefix_cache, tokens.shape[0]) if prefix else None
        position_ids = torch.full_like(tokens, len(prefix))
        logits = model(
            input_ids=tokens, past_key_values=cache, position_ids=position_ids, use_cache=bool(prefix)
        ).logits
        table[start : start + tokens.shape[0]] = logits[:, -1].float().topk(top_k, dim=-1).indices.numpy()
    return table


def chain_extension(bigram: np.ndarray, k: int, w: int) -> np.ndarray:  # [V, k, w]
    """Row j of token x: the bigram's j-th next token, then repeatedly the top-1 next token."""
    extended = np.empty((bigram.shape[0], k, w), dtype=np.int32)
    extended[:, :, 0] = bigram[:, :k]
    for position in range(1, w):
        extended[:, :, position] = bigram[extended[:, :, position - 1], 0]
    return extended


@torch.no_grad()
def model_extension(model, bigram: np.ndarray, prefix: list[int], k: int, w: int, batch_size: int) -> np.ndarray:
    """Row j of token x: the bigram's j-th next token, then the model's greedy continuation.

    Costs V·k sequences of w forward positions: minutes for a tiny model, hours for SmolLM2 on a CPU.
    """
    vocab = bigram.shape[0]
    starts = np.stack([np.repeat(np.arange(vocab), k), bigram[:, :k].reshape(-1)], axis=1)  # [V*k, 2]
    extended = np.empty((vocab * k, w), dtype=np.int32)
    prefix_cache = prefill(model, prefix)
    for begin in range(0, len(starts), batch_size):
        batch = torch.from_numpy(starts[begin : begin + batch_size]).long()  # [b, 2]
        cache = expanded_copy(prefix_cache, batch.shape[0]) if prefix else DynamicCache()
        positions = torch.arange(len(prefix), len(prefix) + 2).expand(batch.shape[0], -1)
        logits = model(input_ids=batch, past_key_values=cache, position_ids=positions, use_cache=True).logits
        columns = [batch[:, 1]]
        for step in range(1, w):
            columns.append(logits[:, -1].argmax(-1))
            if step < w - 1:
                position = torch.full((batch.shape[0], 1), len(prefix) + 1 + step)
                logits = model(
                    input_ids=columns[-1][:, None], past_key_values=cache, position_ids=position, use_cache=True
                ).logits
        extended[begin : begin + batch.shape[0]] = torch.stack(columns, dim=1).numpy()
    return extended.reshape(vocab, k, w)


# The code each table is built by: its cache key names it (a change of it builds the table again).
BUILT_BY = {
    "bigram": code_key(compute_bigram_table, prefill, expanded_copy),
    "extended": code_key(compute_bigram_table, model_extension, prefill, expanded_copy),
}


def table_path(cache_dir: Path, fingerprint: str, name: str, settings: str) -> Path:
    key = hashlib.sha256(f"{fingerprint}|{settings}|{BUILT_BY.get(name, '')}".encode()).hexdigest()[:16]
    return cache_dir / "tables" / f"{name}-{key}.npy"


def cached_table(path: Path, build) -> tuple[np.ndarray, float]:
    """Loads `path` memory-mapped, or builds and saves it first; returns (table, build seconds)."""
    seconds = 0.0
    if not path.exists():
        started = time.perf_counter()
        table = build()
        seconds = time.perf_counter() - started
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{time.time_ns()}.partial.npy")
        np.save(partial, table, allow_pickle=False)
        partial.replace(path)  # atomic: a killed build never leaves a truncated table
    return np.load(path, mmap_mode="r", allow_pickle=False), seconds
