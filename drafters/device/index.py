"""The device drafter's index kernels: other requests' outputs, on the device. The ring of
finished outputs (and a store loaded at start) with its hash index (`_ingest_kernel`), the index of
running requests' tokens as they are emitted (`_index_kernel`), and the corpus candidate that
kernels.py's finalize draws from them (`_corpus_candidate`). Each key is the 2 or 4 tokens before a
position; a bucket keeps its newest entry (integer atomics: the same index whatever the order of
programs), and every hit is verified and extended against the tokens themselves, so a collision or
an overwritten entry costs a draft, never a wrong one."""

from __future__ import annotations

import triton
import triton.language as tl

from drafters.device import settings

CORPUS = tl.constexpr(settings.CORPUS)
HASH_MUL = tl.constexpr(settings.HASH_MUL)
POS_RADIX = tl.constexpr(1 << settings.POS_BITS)


@triton.jit
def _len_bucket(length):
    return tl.where(length <= 6, length - 1, tl.where(length <= 10, 6, tl.where(length <= 20, 7, 8)))


@triton.jit
def _before(bad, j, SIZE: tl.constexpr):
    """Positions before the first `bad` one (a prefix: a draft holds until its first failure)."""
    return j < tl.min(tl.where(bad, j, SIZE), axis=0)


@triton.jit
def _hash_bucket(hv, NUM_BUCKETS: tl.constexpr):
    return ((hv >> 29) ^ hv) & (NUM_BUCKETS - 1)


@triton.jit
def _corpus_match(row, n, corpus_ptr, capacity, head, table_ptr, NUM_BUCKETS: tl.constexpr, MAX_DEPTH: tl.constexpr):
    """(match length, absolute ring position after it) of the request's suffix in the ring: the
    newest occurrence of its last 4 tokens, else of its last 2, verified and extended (0: none)."""
    hv = tl.zeros((), tl.int64)
    best_len = tl.zeros((), tl.int64)
    best_pos = tl.zeros((), tl.int64)
    for d in tl.static_range(4):
        hv = (hv ^ tl.load(row + n - 1 - d, mask=n - 1 - d >= 0, other=0).to(tl.int64)) * HASH_MUL
        if d % 2 == 1:  # the keys of 2 and of 4 tokens
            entry = tl.load(table_ptr + (3 - d) // 2 * NUM_BUCKETS + _hash_bucket(hv, NUM_BUCKETS))
            # an entry is live while its position is still in the ring and has a token after it
            live = (entry >= 0) & (entry >= head - capacity + MAX_DEPTH) & (entry < head) & (n >= d + 1)
            length = tl.zeros((), tl.int64)
            going = live
            for t in range(MAX_DEPTH):
                pattern = tl.load(row + n - 1 - t, mask=going & (n - 1 - t >= 0), other=-2)
                found = tl.load(corpus_ptr + ((entry - 1 - t) % capacity + capacity) % capacity, mask=going, other=-1)
                going = going & (n - 1 - t >= 0) & (found == pattern)
                length += going.to(tl.int64)
            take = (length >= d + 1) & (length > best_len)
            best_len = tl.where(take, length, best_len)
            best_pos = tl.where(take, entry, best_pos)
    return best_len, best_pos


@triton.jit
def _corpus_candidate(
    row,
    n,
    ring,
    running,
    j,
    in_k,
    HAS_CORPUS: tl.constexpr,
    NUM_BUCKETS: tl.constexpr,
    RUNNING_BUCKETS: tl.constexpr,
    LEN_BUCKETS: tl.constexpr,
    MAX_DEPTH: tl.constexpr,
    K_PO2: tl.constexpr,
):
    """Other requests' outputs: the tokens after the newest verified occurrence in the ring of
    finished ones (up to the end of its document), or in a running request's tokens where that
    match is longer (up to where it has reached)."""
    length = tl.zeros((), tl.int64)
    valid = in_k & (j < 0)
    tokens = tl.zeros([K_PO2], tl.int64)
    if HAS_CORPUS:
        corpus_ptr, capacity, head_ptr, table_ptr = ring
        head = tl.load(head_ptr)
        length, position = _corpus_match(row, n, corpus_ptr, capacity, head, table_ptr, NUM_BUCKETS, MAX_DEPTH)
        valid = in_k & (j * 0 + length > 0) & (position + j < head)
        tokens = tl.load(corpus_ptr + (position + j) % capacity, mask=valid, other=-1).to(tl.int64)
        valid = valid & _before(tokens < 0, j, K_PO2)
        tokens_ptr, tokens_stride, total_len_ptr, running_ptr, r = running
        r_len, other, r_pos = _running_match(
            row, n, r, tokens_ptr, tokens_stride, total_len_ptr, running_ptr, RUNNING_BUCKETS, MAX_DEPTH
        )
        longer = r_len > length
        r_valid = in_k & (j * 0 + r_len > 0) & (r_pos + j < tl.load(total_len_ptr + other))
        r_tokens = tl.load(tokens_ptr + other * tokens_stride + r_pos + j, mask=r_valid, other=0).to(tl.int64)
        tokens = tl.where(longer, r_tokens, tokens)
        valid = tl.where(longer, r_valid, valid)
        length = tl.maximum(length, r_len)
    return tokens, valid, CORPUS * LEN_BUCKETS + _len_bucket(tl.maximum(length, 1))


@triton.jit
def _running_match(
    row, n, r, tokens_ptr, tokens_stride, total_len_ptr, table_ptr, NUM_BUCKETS: tl.constexpr, MAX_DEPTH: tl.constexpr
):
    """(match length, slot, position after it) of the request's suffix in another running request's
    tokens: the newest indexed occurrence of its last 4 tokens, else of its last 2, verified and
    extended against that request's row (0: none; the request's own slot is its context's)."""
    hv = tl.zeros((), tl.int64)
    best_len = tl.zeros((), tl.int64)
    best_slot = tl.zeros((), tl.int64)
    best_pos = tl.zeros((), tl.int64)
    for d in tl.static_range(4):
        hv = (hv ^ tl.load(row + n - 1 - d, mask=n - 1 - d >= 0, other=0).to(tl.int64)) * HASH_MUL
        if d % 2 == 1:
            entry = tl.load(table_ptr + (3 - d) // 2 * NUM_BUCKETS + _hash_bucket(hv, NUM_BUCKETS))
            slot = (entry // POS_RADIX) % POS_RADIX
            position = entry % POS_RADIX
            live = (entry >= 0) & (slot != r) & (n >= d + 1)
            live = live & (position < tl.load(total_len_ptr + slot, mask=live, other=0))
            other = tokens_ptr + slot * tokens_stride
            length = tl.zeros((), tl.int64)
            going = live
            for t in range(MAX_DEPTH):
                pattern = tl.load(row + n - 1 - t, mask=going & (n - 1 - t >= 0), other=-2)
                found = tl.load(other + position - 1 - t, mask=going & (position - 1 - t >= 0), other=-1)
                going = going & (n - 1 - t >= 0) & (position - 1 - t >= 0) & (found == pattern)
                length += going.to(tl.int64)
            take = (length >= d + 1) & (length > best_len)
            best_len = tl.where(take, length, best_len)
            best_slot = tl.where(take, slot, best_slot)
            best_pos = tl.where(take, position, best_pos)
    return best_len, best_slot, best_pos


@triton.jit(do_not_specialize=["stamp"])
def _index_kernel(
    tokens_ptr,  # *int32 [max_num_reqs, tokens_stride]
    tokens_stride,
    idx_mapping_ptr,  # *int32 [B]
    total_len_ptr,  # *int32 [max_num_reqs]
    prompt_len_ptr,  # *int32 [max_num_reqs]
    indexed_ptr,  # *int64 [max_num_reqs] (in/out): each slot's tokens indexed so far
    table_ptr,  # *int64 [2, NUM_BUCKETS]: newest (stamp, slot, position) after each 4- and 2-token key
    stamp,  # this step's number: a later entry wins
    NUM_BUCKETS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Per request: its tokens since the last step (from its prompt's last 3 on) into the index of
    running outputs, at most BLOCK a step (the rest at the next), each position under the 4 and 2
    tokens before it; atomic_max keeps a bucket's newest entry whatever the order of programs."""
    b = tl.program_id(0).to(tl.int64)
    r = tl.load(idx_mapping_ptr + b).to(tl.int64)
    n = tl.load(total_len_ptr + r).to(tl.int64)
    start = tl.maximum(tl.load(indexed_ptr + r), tl.load(prompt_len_ptr + r).to(tl.int64) - 3)
    p = start + tl.arange(0, BLOCK).to(tl.int64)
    inside = p < n
    row = tokens_ptr + r * tokens_stride
    hv = tl.zeros([BLOCK], tl.int64)
    for d in tl.static_range(4):
        hv = (hv ^ tl.load(row + p - 1 - d, mask=inside & (p - 1 - d >= 0), other=0).to(tl.int64)) * HASH_MUL
        if d % 2 == 1:
            key = (3 - d) // 2 * NUM_BUCKETS + _hash_bucket(hv, NUM_BUCKETS)
            entry = (stamp.to(tl.int64) * POS_RADIX + r) * POS_RADIX + p  # (a host int arrives as int32 on a GPU)
            tl.atomic_max(table_ptr + key, entry, mask=inside & (p >= d + 1))
    tl.store(indexed_ptr + r, tl.minimum(n, start + BLOCK))


@triton.jit
def _ingest_kernel(
    source_ptr,  # *int32 [rows, source_stride]: where the documents' tokens are
    source_stride,
    documents_ptr,  # *int64 [F, 4]: (row, start, end, offset in the ring from head)
    corpus_ptr,  # *int32 [capacity]
    capacity,
    head_ptr,  # *int64 [1]: ring tokens written before these documents
    total_ptr,  # *int64 [1]: the tokens (and separators) these documents write
    table_ptr,  # *int64 [2, NUM_BUCKETS]
    NUM_BUCKETS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Per (document, block): its tokens source[row, start:end] into the ring at head + offset (and
    -1 after them), each position indexed under the 4 and 2 tokens of the document before it.
    atomic_max keeps a bucket's newest position whatever the order of programs; a launch that
    writes more than the ring holds writes its newest `capacity` positions only (no two programs
    write one place: every rank's ring is the same)."""
    f = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1).to(tl.int64)
    row = tl.load(documents_ptr + f * 4)
    start = tl.load(documents_ptr + f * 4 + 1)
    end = tl.load(documents_ptr + f * 4 + 2)
    base = tl.load(head_ptr) + tl.load(documents_ptr + f * 4 + 3)
    size = end - start
    i = block * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    inside = i < size
    oldest = tl.load(head_ptr) + tl.load(total_ptr) - capacity  # positions before it are overwritten
    inside = inside & (base + i >= oldest)
    text = source_ptr + row * source_stride + start
    tl.store(corpus_ptr + (base + i) % capacity, tl.load(text + i, mask=inside, other=0), mask=inside)
    tl.store(corpus_ptr + (base + size) % capacity, -1, mask=(block == 0) & (base + size >= oldest))
    hv = tl.zeros([BLOCK], tl.int64)
    for d in tl.static_range(4):
        hv = (hv ^ tl.load(text + i - 1 - d, mask=inside & (i - 1 - d >= 0), other=0).to(tl.int64)) * HASH_MUL
        if d % 2 == 1:
            key = (3 - d) // 2 * NUM_BUCKETS + _hash_bucket(hv, NUM_BUCKETS)
            tl.atomic_max(table_ptr + key, base + i, mask=inside & (i >= d + 1))
