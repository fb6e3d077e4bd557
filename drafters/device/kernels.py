"""The device drafter's Triton kernels: one step drafts for every running request on the device,
with no host synchronization (drafter.py launches them; tests/drafters/device/reference.py states the
same rules in plain Python and the tests hold the kernels to it, under Triton's CPU interpreter).

A step, per request b (its slot r = idx_mapping[b], its tokens tokens[r, :n], n = total_len[r]):
- `_scan_kernel`, gridded over (request, block of positions): the longest match of the request's
  suffix (at most MAX_DEPTH tokens) ending at each position of a text, packed as one int64 score per
  block. Run twice: over the request's own history (the `context` source; later positions win ties)
  and over its prediction (the `prediction` source; where the answer's generated tokens reach into
  it, the occurrence nearest where the answer is expected wins ties, and a match within NEAR of it
  counts as a full one).
- `_finalize_kernel`, one program per request: the best context and prediction matches from the
  scans; the `corpus` candidate (other requests' outputs, finished and running, and a store loaded
  at start: index.py); the `bigram` candidate (the model's own table
  chained from the last token: N-Grammys' extended bigram). Each candidate's tokens are rated by
  acceptance rates learned online per (source, match-length bucket, position); the candidate with
  the most expected accepted tokens is the draft, and the slots past it are filled by chaining the
  bigram table from its last token (rated as bigram drafts) rather than repeating a token.
- `_observe_kernel`: the target's verdict on each request's last draft, folded into the rates.
index.py's kernels keep the corpus: `_ingest_kernel` (finished outputs, a store) and `_index_kernel`
(running requests' tokens as they are emitted).
"""

from __future__ import annotations

import triton
import triton.language as tl

from drafters.device import settings
from drafters.device.index import _before, _corpus_candidate, _len_bucket

# The settings' constants, as the kernels must see globals (constexpr).
PREDICTION = tl.constexpr(settings.PREDICTION)
CONTEXT = tl.constexpr(settings.CONTEXT)
CORPUS = tl.constexpr(settings.CORPUS)
BIGRAM = tl.constexpr(settings.BIGRAM)
NEAR = tl.constexpr(settings.NEAR)
POS_RADIX = tl.constexpr(1 << settings.POS_BITS)  # scores pack fields by radix (every score is >= 0)
DEPTH_RADIX = tl.constexpr(1 << settings.DEPTH_BITS)


@triton.jit
def _scan_kernel(
    tokens_ptr,  # *int32 [max_num_reqs, tokens_stride]: each slot's tokens (the pattern's source)
    tokens_stride,
    text_ptr,  # *int32 [max_num_reqs, text_stride]: the text searched (tokens itself, or predictions)
    text_stride,
    text_len_ptr,  # *int32 [max_num_reqs]: the text's length per slot
    idx_mapping_ptr,  # *int32 [B]: batch row -> slot
    total_len_ptr,  # *int32 [max_num_reqs]
    prompt_len_ptr,  # *int32 [max_num_reqs]
    reached_ptr,  # *int64 [max_num_reqs, 2]: where the last prediction draft ended, at which answer length
    scratch_ptr,  # *int64 [B, num_blocks] (output): the block's best packed score, 0 none
    num_blocks,
    IS_PREDICTION: tl.constexpr,
    MAX_DEPTH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Per (request, block of text positions e): the number of the request's last tokens that the
    text repeats right before e, e a position with a token after it. The context's own scan stops
    short of the suffix itself; the prediction's counts generated tokens only (the answer aligns
    with the prediction's start). Score: match length, then (context) the later e, or (prediction)
    the e nearest the expected position, a near match taking full depth."""
    b = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1).to(tl.int64)
    r = tl.load(idx_mapping_ptr + b).to(tl.int64)
    n = tl.load(total_len_ptr + r).to(tl.int64)
    text_len = tl.load(text_len_ptr + r).to(tl.int64)
    generated = n - tl.load(prompt_len_ptr + r).to(tl.int64)
    depth = tl.minimum(n, MAX_DEPTH)
    if IS_PREDICTION:
        depth = tl.minimum(depth, generated)
    row = tokens_ptr + r * tokens_stride
    text = text_ptr + r * text_stride
    if block * BLOCK >= text_len:  # past the text: no occurrence here
        tl.store(scratch_ptr + b * num_blocks + block, tl.zeros((), tl.int64))
        return
    e = block * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    alive = (e >= 1) & (e < text_len)
    length = tl.zeros([BLOCK], dtype=tl.int64)
    for t in range(MAX_DEPTH):
        pattern = tl.load(row + n - 1 - t, mask=t < depth, other=-2)
        found = tl.load(text + e - 1 - t, mask=alive & (e - 1 - t >= 0), other=-1)
        alive = alive & (e - 1 - t >= 0) & (found == pattern) & (e * 0 + t < depth)
        length += alive.to(tl.int64)
    if IS_PREDICTION:
        expected = tl.load(reached_ptr + r * 2) + generated - tl.load(reached_ptr + r * 2 + 1)
        distance = tl.minimum(tl.abs(e - expected), POS_RADIX - 1)
        full = tl.where(distance <= NEAR, MAX_DEPTH, length)
        near = full * POS_RADIX + (POS_RADIX - 1 - distance)
        score = tl.where(length > 0, (near * DEPTH_RADIX + length) * POS_RADIX + e, 0)
    else:
        score = tl.where(length > 0, length * POS_RADIX + e, 0)
    tl.store(scratch_ptr + b * num_blocks + block, tl.max(score, axis=0))


@triton.jit
def _best(scratch_ptr, b, num_blocks, NB_PO2: tl.constexpr):
    blocks = tl.arange(0, NB_PO2).to(tl.int64)
    return tl.max(tl.load(scratch_ptr + b * num_blocks + blocks, mask=blocks < num_blocks, other=0), axis=0)


@triton.jit
def _rates(stats_ptr, bucket, positions, valid, K: tl.constexpr):
    """Per position: the rate at which such a draft token was accepted, given the ones before it
    were (Laplace-smoothed), 0 where not valid."""
    stat = stats_ptr + (bucket * K + positions) * 2
    accepted = tl.load(stat, mask=valid, other=0).to(tl.float32)
    observed = tl.load(stat + 1, mask=valid, other=0).to(tl.float32)
    return tl.where(valid, (accepted + 1.0) / (observed + 2.0), 0.0)


@triton.jit
def _expected(rates, j):
    """Expected accepted tokens of a draft whose tokens hold at these conditional rates: the sum of
    their prefix products (as a [K, K] sum of logs: no scan)."""
    logs = tl.log(tl.maximum(rates, 1e-30))
    prefix = tl.sum(tl.where(j[None, :] <= j[:, None], logs[None, :], 0.0), axis=1)
    return tl.sum(tl.exp(prefix) * (rates > 0).to(tl.float32), axis=0)


@triton.jit
def _finalize_kernel(
    tokens_ptr,  # *int32 [max_num_reqs, tokens_stride]
    tokens_stride,
    idx_mapping_ptr,  # *int32 [B]
    total_len_ptr,  # *int32 [max_num_reqs]
    prompt_len_ptr,  # *int32 [max_num_reqs]
    num_sampled_ptr,  # *int32 [B]
    context_scratch_ptr,  # *int64 [B, context_blocks]
    context_blocks,
    prediction_ptr,  # *int32 [max_num_reqs, prediction_stride]
    prediction_stride,
    prediction_len_ptr,  # *int32 [max_num_reqs]
    prediction_scratch_ptr,  # *int64 [B, prediction_blocks]
    prediction_blocks,
    reached_ptr,  # *int64 [max_num_reqs, 2] (in/out): where the last prediction draft ended, at which n
    corpus_ptr,  # *int32 [capacity]: the ring (-1 between documents)
    capacity,
    head_ptr,  # *int64 [1]: ring tokens written so far (absolute)
    table_ptr,  # *int64 [2, NUM_BUCKETS]: newest absolute position after each 4- and 2-token key
    running_ptr,  # *int64 [2, RUNNING_BUCKETS]: the index of running requests' tokens (_index_kernel's)
    bigram_ptr,  # *int32 [vocab]: the model's most likely next token after each token
    vocab,
    stats_ptr,  # *int64 [4 * NUM_LEN_BUCKETS, K, 2]: (accepted, observed) per source, bucket, position
    drafts_ptr,  # *int64 [B, K] (output)
    confidence_ptr,  # *fp32 [B, K] (output): each position's conditional rate
    last_code_ptr,  # *int32 [max_num_reqs, K] (output): each position's stats row (bucket * K + position)
    last_valid_ptr,  # *int32 [max_num_reqs] (output): positions the next observe may judge
    source_ptr,  # *int32 [B] (output): the draft's source
    length_ptr,  # *int32 [B] (output): the source's tokens in the draft (the rest: bigram fill)
    min_confidence,  # a position rated below this ends the draft (its confidence 0: trimmed)
    HAS_CORPUS: tl.constexpr,
    HAS_BIGRAM: tl.constexpr,
    NUM_BUCKETS: tl.constexpr,
    RUNNING_BUCKETS: tl.constexpr,
    LEN_BUCKETS: tl.constexpr,
    MAX_DEPTH: tl.constexpr,
    K: tl.constexpr,
    K_PO2: tl.constexpr,
    CONTEXT_NB_PO2: tl.constexpr,
    PREDICTION_NB_PO2: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    r = tl.load(idx_mapping_ptr + b).to(tl.int64)
    n = tl.load(total_len_ptr + r).to(tl.int64)
    generated = n - tl.load(prompt_len_ptr + r).to(tl.int64)
    row = tokens_ptr + r * tokens_stride
    j = tl.arange(0, K_PO2).to(tl.int64)
    in_k = j < K
    drafting = tl.load(num_sampled_ptr + b) > 0
    last = tl.load(row + n - 1).to(tl.int64)

    # Candidates: tokens [K_PO2], valid [K_PO2], stats bucket.
    context = _context_candidate(row, n, context_scratch_ptr, b, context_blocks, j, in_k, LEN_BUCKETS, CONTEXT_NB_PO2)
    prediction = prediction_ptr + r * prediction_stride
    p_size = tl.load(prediction_len_ptr + r)
    p_tokens, p_valid, p_bucket, p_end = _prediction_candidate(
        prediction, p_size, prediction_scratch_ptr, b, prediction_blocks, j, in_k, LEN_BUCKETS, PREDICTION_NB_PO2
    )
    ring = (corpus_ptr, capacity, head_ptr, table_ptr)
    running = (tokens_ptr, tokens_stride, total_len_ptr, running_ptr, r)
    corpus = _corpus_candidate(
        row, n, ring, running, j, in_k, HAS_CORPUS, NUM_BUCKETS, RUNNING_BUCKETS, LEN_BUCKETS, MAX_DEPTH, K_PO2
    )
    b_tokens, b_valid = _bigram_chain(bigram_ptr, vocab, last, j, in_k, HAS_BIGRAM, K, K_PO2)
    bigram = (b_tokens, b_valid, BIGRAM * LEN_BUCKETS)
    source, tokens, valid, rates, bucket = _choose(
        (p_tokens, p_valid, p_bucket), context, corpus, bigram, stats_ptr, j, K
    )

    # The draft: the candidate's valid prefix, cut before its first position rated below min_confidence.
    keep = _before(~valid | (rates < min_confidence), j, K_PO2)
    length = tl.sum(keep.to(tl.int64), axis=0)
    expected = tl.load(reached_ptr + r * 2) + generated - tl.load(reached_ptr + r * 2 + 1)
    # the answer's place in the prediction: where a prediction match ends (the next token's place)
    anchored = tl.max(p_valid.to(tl.int32), axis=0) > 0
    tl.store(reached_ptr + r * 2, tl.where(anchored, p_end, expected))
    tl.store(reached_ptr + r * 2 + 1, generated)
    draft = (tokens, tl.where(keep, bucket * K + j, -1), tl.where(keep, rates, 0.0), length, last)
    bigram_rates = _rates(stats_ptr, BIGRAM * LEN_BUCKETS, j, in_k, K)
    tokens, code, confidence = _fill(
        draft, (bigram_ptr, vocab), bigram_rates, min_confidence, j, HAS_BIGRAM, LEN_BUCKETS, K
    )
    # A position is judged only while the ones before it are confident.
    live = _before(confidence <= 0, j, K_PO2)
    confidence = tl.where(live, confidence, 0.0)
    tl.store(drafts_ptr + b * K + j, tokens, mask=in_k)
    tl.store(confidence_ptr + b * K + j, tl.where(drafting, confidence, 0.0), mask=in_k)
    tl.store(last_code_ptr + r * K + j, tl.where(live & drafting, code, -1).to(tl.int32), mask=in_k)
    tl.store(last_valid_ptr + r, tl.sum((live & in_k & drafting).to(tl.int32), axis=0))
    tl.store(source_ptr + b, tl.where(drafting, source, -1).to(tl.int32))
    tl.store(length_ptr + b, tl.where(drafting, length, 0).to(tl.int32))


@triton.jit
def _choose(prediction, context, corpus, bigram, stats_ptr, j, K: tl.constexpr):
    """(source, tokens, valid, rates, bucket) of the candidate (tokens, valid, bucket) with the most
    expected accepted tokens at the rates learned for it; ties go to the earlier source."""
    p_tokens, p_valid, p_bucket = prediction
    c_tokens, c_valid, c_bucket = context
    g_tokens, g_valid, g_bucket = corpus
    b_tokens, b_valid, b_bucket = bigram
    p_rates = _rates(stats_ptr, p_bucket, j, p_valid, K)
    c_rates = _rates(stats_ptr, c_bucket, j, c_valid, K)
    g_rates = _rates(stats_ptr, g_bucket, j, g_valid, K)
    b_rates = _rates(stats_ptr, b_bucket, j, b_valid, K)
    p_gain = _expected(p_rates, j)
    c_gain = _expected(c_rates, j)
    g_gain = _expected(g_rates, j)
    best = tl.maximum(tl.maximum(p_gain, c_gain), tl.maximum(g_gain, _expected(b_rates, j)))
    use_p = (p_gain == best) & (p_gain > 0)
    use_c = (~use_p) & (c_gain == best) & (c_gain > 0)
    use_g = (~use_p) & (~use_c) & (g_gain == best) & (g_gain > 0)
    source = tl.where(use_p, PREDICTION, tl.where(use_c, CONTEXT, tl.where(use_g, CORPUS, BIGRAM)))
    tokens = tl.where(use_p, p_tokens, tl.where(use_c, c_tokens, tl.where(use_g, g_tokens, b_tokens)))
    valid = tl.where(use_p, p_valid, tl.where(use_c, c_valid, tl.where(use_g, g_valid, b_valid)))
    rates = tl.where(use_p, p_rates, tl.where(use_c, c_rates, tl.where(use_g, g_rates, b_rates)))
    bucket = tl.where(use_p, p_bucket, tl.where(use_c, c_bucket, tl.where(use_g, g_bucket, b_bucket)))
    return source, tokens, valid, rates, bucket


@triton.jit
def _context_candidate(row, n, scratch_ptr, b, num_blocks, j, in_k, LEN_BUCKETS: tl.constexpr, NB_PO2: tl.constexpr):
    """The tokens after the request's own best earlier match (the context scan's). Past the end of
    its tokens the match repeats with its period n - end, as the host drafter drafts it: a line
    that repeats goes on repeating."""
    score = _best(scratch_ptr, b, num_blocks, NB_PO2)
    length = score // POS_RADIX
    end = score % POS_RADIX
    valid = in_k & (j * 0 + length > 0)
    period = tl.maximum(n - end, 1)
    tokens = tl.load(row + end + j % period, mask=valid, other=0).to(tl.int64)
    return tokens, valid, CONTEXT * LEN_BUCKETS + _len_bucket(tl.maximum(length, 1))


@triton.jit
def _prediction_candidate(
    prediction, size, scratch_ptr, b, num_blocks, j, in_k, LEN_BUCKETS: tl.constexpr, NB_PO2: tl.constexpr
):
    """The prediction's tokens after its best match (of 2 tokens at least, or near where the
    answer is expected), and where that match ends."""
    score = _best(scratch_ptr, b, num_blocks, NB_PO2)
    end = score % POS_RADIX
    length = (score // POS_RADIX) % DEPTH_RADIX
    distance = POS_RADIX - 1 - (score // (POS_RADIX * DEPTH_RADIX)) % POS_RADIX
    ok = (length >= 2) | ((length > 0) & (distance <= NEAR))
    valid = in_k & (j * 0 + ok.to(tl.int64) > 0) & (end + j < size)
    tokens = tl.load(prediction + end + j, mask=valid, other=0).to(tl.int64)
    return tokens, valid, PREDICTION * LEN_BUCKETS + _len_bucket(tl.maximum(length, 1)), end


@triton.jit
def _bigram_chain(bigram_ptr, vocab, last, j, in_k, HAS_BIGRAM: tl.constexpr, K: tl.constexpr, K_PO2: tl.constexpr):
    """The model's bigram table chained from the last token (N-Grammys' extended bigram)."""
    tokens = tl.zeros([K_PO2], tl.int64)
    previous = last
    for i in tl.static_range(K):
        if HAS_BIGRAM:
            previous = tl.load(bigram_ptr + tl.minimum(tl.maximum(previous, 0), vocab - 1)).to(tl.int64)
        tokens = tl.where(j == i, previous, tokens)
    if HAS_BIGRAM:
        valid = in_k
    else:
        valid = j < 0
    return tokens, valid


@triton.jit
def _fill(
    draft, table, bigram_rates, min_confidence, j, HAS_BIGRAM: tl.constexpr, LEN_BUCKETS: tl.constexpr, K: tl.constexpr
):
    """The slots past the draft's `length` (draft: tokens, codes, confidences, length, the last token):
    the bigram table (pointer, vocab) chained on from its last token, each rated as a bigram draft's
    position (without a table: the last token, rated 0)."""
    tokens, code, confidence, length, last = draft
    bigram_ptr, vocab = table
    fill_rates = tl.where(bigram_rates >= min_confidence, bigram_rates, 0.0)
    for i in tl.static_range(K):
        at = (j == i) & (i >= length)
        previous = tl.where(i == 0, last, tl.sum(tl.where(j == i - 1, tokens, 0), axis=0))
        if HAS_BIGRAM:
            fill = tl.load(bigram_ptr + tl.minimum(tl.maximum(previous, 0), vocab - 1)).to(tl.int64)
            fill_rate = tl.sum(tl.where(j == i - length, fill_rates, 0.0), axis=0)
            code = tl.where(at, BIGRAM * LEN_BUCKETS * K + i - length, code)
        else:
            fill = last
            fill_rate = 0.0
        tokens = tl.where(at, fill, tokens)
        confidence = tl.where(at, fill_rate, confidence)
    return tokens, code, confidence


@triton.jit
def _observe_kernel(
    idx_mapping_ptr,  # *int32 [B]
    num_sampled_ptr,  # *int32 [B]
    num_rejected_ptr,  # *int32 [B]
    stats_ptr,  # *int64 [4 * NUM_LEN_BUCKETS, K, 2]
    last_code_ptr,  # *int32 [max_num_reqs, K]
    last_valid_ptr,  # *int32 [max_num_reqs]
    K: tl.constexpr,
    K_PO2: tl.constexpr,
):
    """The verdict on each request's last draft: its accepted positions and the first rejected one
    were observed, each under its own stats row (integer atomics: the same stats in any order)."""
    b = tl.program_id(0).to(tl.int64)
    r = tl.load(idx_mapping_ptr + b).to(tl.int64)
    num_sampled = tl.load(num_sampled_ptr + b).to(tl.int64)
    accepted = num_sampled - 1
    verified = accepted + tl.load(num_rejected_ptr + b).to(tl.int64)
    j = tl.arange(0, K_PO2).to(tl.int64)
    code = tl.load(last_code_ptr + r * K + j, mask=j < K, other=-1).to(tl.int64)
    valid = tl.load(last_valid_ptr + r).to(tl.int64)
    observed = (j < K) & (code >= 0) & (j <= accepted) & (j < verified) & (j < valid) & (j * 0 + num_sampled > 0)
    tl.atomic_add(stats_ptr + code * 2, (j < accepted).to(tl.int64), mask=observed)
    tl.atomic_add(stats_ptr + code * 2 + 1, tl.full([K_PO2], 1, tl.int64), mask=observed)
    tl.store(last_valid_ptr + r, 0, mask=num_sampled > 0)
