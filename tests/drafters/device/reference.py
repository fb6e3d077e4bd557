"""The device drafter's rules in plain Python (drafters/device/kernels.py is held to this): one step
for a batch of slots, over numpy copies of the drafter's state, request by request, token by token."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from drafters.device.settings import BIGRAM, CONTEXT, CORPUS, HASH_MUL, NEAR, NUM_LEN_BUCKETS, POS_BITS, PREDICTION

MASK64 = (1 << 64) - 1


def signed(value: int) -> int:
    value &= MASK64
    return value - (1 << 64) if value >> 63 else value


def len_bucket(length: int) -> int:
    return length - 1 if length <= 6 else 6 if length <= 10 else 7 if length <= 20 else 8


def hash_bucket(hv: int, num_buckets: int) -> int:
    return ((hv >> 29) ^ hv) & (num_buckets - 1)


@dataclass
class State:
    """numpy copies of a DeviceDrafter's tensors (`of`), updated by `step` as the kernels update them."""

    predictions: np.ndarray
    prediction_len: np.ndarray
    reached: np.ndarray
    corpus: np.ndarray
    head: int
    table: np.ndarray
    bigram: np.ndarray | None
    stats: np.ndarray  # [rows, k, 2]
    last_code: np.ndarray
    last_valid: np.ndarray
    has_corpus: bool
    running: np.ndarray  # [2, buckets]: the index of running requests' tokens
    indexed: np.ndarray
    steps: int
    index_block: int

    @classmethod
    def of(cls, drafter) -> State:
        drafter.flush()
        return cls(
            drafter.predictions.numpy().copy(),
            drafter.prediction_len.numpy().copy(),
            drafter.reached.numpy().copy(),
            drafter.corpus.numpy().copy(),
            int(drafter.head[0]),
            drafter.table.numpy().copy(),
            drafter.bigram.numpy().copy() if drafter.has_bigram else None,
            drafter.stats.numpy().copy(),
            drafter.last_code.numpy().copy(),
            drafter.last_valid.numpy().copy(),
            drafter.settings.corpus_tokens > 0,
            drafter.running.numpy().copy(),
            drafter.indexed.numpy().copy(),
            drafter.steps,
            max(16, 1 << (2 * (drafter.k + 1) - 1).bit_length()),
        )


def suffix_length(tokens, n: int, text, end: int, depth: int) -> int:
    """How many of tokens[:n]'s last tokens (at most depth) text repeats right before `end`."""
    length = 0
    while length < depth and end - 1 - length >= 0 and text[end - 1 - length] == tokens[n - 1 - length]:
        length += 1
    return length


def context_match(tokens, n: int, depth: int) -> tuple[int, int]:
    best = (0, 0)
    for end in range(1, n):
        length = suffix_length(tokens, n, tokens, end, min(n, depth))
        if length:
            best = max(best, (length, end))
    return best


def prediction_match(tokens, n: int, generated: int, prediction, expected: int, depth: int) -> tuple[int, int, int]:
    """(length, end, distance) of the best match: full depth near `expected`, then nearest, longest, latest."""
    best, found = None, (0, 0, 0)
    for end in range(1, len(prediction)):
        length = suffix_length(tokens, n, prediction, end, min(n, depth, generated))
        if length:
            distance = min(abs(end - expected), (1 << POS_BITS) - 1)
            key = (depth if distance <= NEAR else length, -distance, length, end)
            if best is None or key > best:
                best, found = key, (length, end, distance)
    return found


def corpus_match(state: State, tokens, n: int, depth: int) -> tuple[int, int]:
    capacity, num_buckets = len(state.corpus), state.table.shape[1]
    hv, best = 0, (0, 0)
    for d in range(4):
        hv = signed((hv ^ (int(tokens[n - 1 - d]) if n - 1 - d >= 0 else 0)) * HASH_MUL)
        if d % 2 == 0:
            continue
        entry = int(state.table[(3 - d) // 2, hash_bucket(hv, num_buckets)])
        live = entry >= 0 and entry >= state.head - capacity + depth and entry < state.head and n >= d + 1
        length = 0
        while live and length < depth and n - 1 - length >= 0:
            if state.corpus[(entry - 1 - length) % capacity] != tokens[n - 1 - length]:
                break
            length += 1
        if length >= d + 1 and length > best[0]:
            best = (length, entry)
    return best


def index_running(state: State, tokens, total_len, prompt_len, slots) -> None:
    """Each request's tokens since the last step into the index of running outputs (at most a block)."""
    state.steps += 1
    buckets = state.running.shape[1]
    for r in slots:
        r, n = int(r), int(total_len[r])
        start = max(int(state.indexed[r]), int(prompt_len[r]) - 3)
        for p in range(start, min(n, start + state.index_block)):
            hv = 0
            for d in range(4):
                hv = signed((hv ^ (int(tokens[r, p - 1 - d]) if p - 1 - d >= 0 else 0)) * HASH_MUL)
                if d % 2 == 1 and p >= d + 1:
                    entry = ((state.steps << POS_BITS) + r << POS_BITS) + p
                    key = hash_bucket(hv, buckets)
                    state.running[(3 - d) // 2, key] = max(int(state.running[(3 - d) // 2, key]), entry)
        state.indexed[r] = min(n, start + state.index_block)


def running_match(state: State, tokens, total_len, r: int, depth: int) -> tuple[int, int, int]:
    """(length, slot, position): the request's suffix in another running request's tokens."""
    n, row = int(total_len[r]), tokens[r]
    hv, best = 0, (0, 0, 0)
    for d in range(4):
        hv = signed((hv ^ (int(row[n - 1 - d]) if n - 1 - d >= 0 else 0)) * HASH_MUL)
        if d % 2 == 0:
            continue
        entry = int(state.running[(3 - d) // 2, hash_bucket(hv, state.running.shape[1])])
        if entry < 0:
            continue
        slot, position = (entry >> POS_BITS) % (1 << POS_BITS), entry % (1 << POS_BITS)
        if slot == r or n < d + 1 or position >= total_len[slot]:
            continue
        length = 0
        while length < depth and n - 1 - length >= 0 and position - 1 - length >= 0:
            if tokens[slot, position - 1 - length] != row[n - 1 - length]:
                break
            length += 1
        if length >= d + 1 and length > best[0]:
            best = (length, slot, position)
    return best


def rates(state: State, bucket: int, positions, k: int) -> np.ndarray:
    out = np.zeros(k, np.float32)
    for j in positions:
        accepted, observed = state.stats[bucket, j]
        out[j] = (np.float32(accepted) + np.float32(1.0)) / (np.float32(observed) + np.float32(2.0))
    return out


def expected_gain(values: np.ndarray) -> np.float32:
    logs = np.log(np.maximum(values, np.float32(1e-30)))
    return np.float32((np.exp(np.cumsum(logs)) * (values > 0)).sum(dtype=np.float32))


def observe(state: State, r: int, num_sampled: int, num_rejected: int, k: int) -> None:
    if num_sampled <= 0:
        return
    accepted = num_sampled - 1
    verified = accepted + num_rejected
    flat = state.stats.reshape(-1, 2)
    for j in range(k):
        code = int(state.last_code[r, j])
        if code >= 0 and j <= accepted and j < verified and j < state.last_valid[r]:
            flat[code] += (int(j < accepted), 1)
    state.last_valid[r] = 0


def draft(state: State, all_tokens, total_len, prompt: int, r: int, k: int, depth: int, min_confidence: float):
    """(tokens [k], confidences [k], source, length): one request's draft; updates reached, last_code, last_valid."""
    tokens, n = all_tokens[r], int(total_len[r])
    generated = n - prompt
    candidates = []  # (source, tokens, valid positions, bucket)
    length, end = context_match(tokens, n, depth)
    positions = list(range(k)) if length else []  # past the end, the match repeats with its period
    candidates.append(
        (CONTEXT, [tokens[end + j % (n - end)] for j in positions], positions, CONTEXT * 9 + len_bucket(max(length, 1)))
    )
    expected = int(state.reached[r, 0]) + generated - int(state.reached[r, 1])
    prediction = state.predictions[r, : state.prediction_len[r]]
    p_len, p_end, distance = prediction_match(tokens, n, generated, prediction, expected, depth)
    ok = p_len >= 2 or (p_len > 0 and distance <= NEAR)
    positions = [j for j in range(k) if ok and p_end + j < len(prediction)]
    candidates.insert(
        0,
        (PREDICTION, [prediction[p_end + j] for j in positions], positions, PREDICTION * 9 + len_bucket(max(p_len, 1))),
    )
    g_len, g_pos = corpus_match(state, tokens, n, depth) if state.has_corpus else (0, 0)
    positions, g_tokens = [], []
    for j in range(k):
        if not g_len or g_pos + j >= state.head or state.corpus[(g_pos + j) % len(state.corpus)] < 0:
            break
        positions.append(j)
        g_tokens.append(state.corpus[(g_pos + j) % len(state.corpus)])
    if state.has_corpus:
        r_len, other, r_pos = running_match(state, all_tokens, total_len, r, depth)
        if r_len > g_len:
            positions = [j for j in range(k) if r_pos + j < total_len[other]]
            g_tokens = [all_tokens[other, r_pos + j] for j in positions]
            g_len = r_len
    candidates.append((CORPUS, g_tokens, positions, CORPUS * 9 + len_bucket(max(g_len, 1))))
    chain, previous = [], int(tokens[n - 1])
    for _ in range(k):
        if state.bigram is not None:
            previous = int(state.bigram[min(max(previous, 0), len(state.bigram) - 1)])
        chain.append(previous)
    candidates.append((BIGRAM, chain, list(range(k)) if state.bigram is not None else [], BIGRAM * 9))

    gains = [expected_gain(rates(state, bucket, positions, k)) for _, _, positions, bucket in candidates]
    best = max(gains)
    choice = next((i for i, gain in enumerate(gains) if gain == best and gain > 0), 3)
    source, found, positions, bucket = candidates[choice]
    chosen_rates = rates(state, bucket, positions, k)
    out, confidence, code = [0] * k, np.zeros(k, np.float32), [-1] * k
    length = 0
    while length < k and length in positions and chosen_rates[length] >= min_confidence:
        out[length], confidence[length], code[length] = int(found[length]), chosen_rates[length], bucket * k + length
        length += 1
    state.reached[r] = (p_end if ok and p_end < len(prediction) else expected, generated)
    last = int(tokens[n - 1])
    for i in range(length, k):
        previous = last if i == 0 else out[i - 1]
        if state.bigram is not None:
            out[i] = int(state.bigram[min(max(previous, 0), len(state.bigram) - 1)])
            rate = rates(state, BIGRAM * 9, [i - length], k)[i - length]
            confidence[i] = rate if rate >= min_confidence else 0.0
            code[i] = BIGRAM * 9 * k + i - length
        else:
            out[i] = last
    live = np.cumsum(confidence <= 0) == 0
    confidence = np.where(live, confidence, np.float32(0.0))
    state.last_code[r] = np.where(live, code, -1)
    state.last_valid[r] = int(live.sum())
    return out, confidence, source, length


def step(state: State, tokens, total_len, prompt_len, idx_mapping, num_sampled, num_rejected, k, depth, min_confidence):
    """The drafts [B, k], confidences [B, k], sources and lengths of one step, as the kernels make them."""
    for b, r in enumerate(idx_mapping):
        observe(state, int(r), int(num_sampled[b]), int(num_rejected[b]), k)
    if state.has_corpus:
        index_running(state, tokens, total_len, prompt_len, idx_mapping)
    drafts, confidences, sources, lengths = [], [], [], []
    for b, r in enumerate(idx_mapping):
        r = int(r)
        out, confidence, source, length = draft(
            state, tokens, total_len, int(prompt_len[r]), r, k, depth, min_confidence
        )
        if num_sampled[b] <= 0:
            confidence[:] = 0
            state.last_code[r] = -1
            state.last_valid[r] = 0
            source, length = -1, 0
        drafts.append(out)
        confidences.append(confidence)
        sources.append(source)
        lengths.append(length)
    return np.array(drafts, np.int64), np.array(confidences, np.float32), sources, lengths


assert NUM_LEN_BUCKETS == 9
