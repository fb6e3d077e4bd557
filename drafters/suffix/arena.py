"""Other requests' outputs, finished or in flight (the `outputs` source): a bounded arena of their
tokens, indexed by q-gram (state.py says the layout). Each request writes into a segment reserved
when it starts; past the arena's capacity the oldest finished segments are forgotten (compact)."""

from __future__ import annotations

import numba as nb

from drafters.suffix.grams import gram_hash, same_gram
from drafters.suffix.state import ACTIVE, DOCS, RESERVED, START, USED, WRITTEN


@nb.njit(cache=True)
def gram_slot(arena, heads, qi, q, values, end):
    """The slot of table qi that holds the q-gram values[end - q:end], or the empty slot where it
    would go (linear probing)."""
    mask = heads.shape[1] - 1
    h = gram_hash(values, end, q, mask)
    while heads[qi, h] >= 0 and not same_gram(arena, heads[qi, h], values, end, q):
        h = (h + 1) & mask
    return h


@nb.njit(cache=True)
def index_gram(arena, heads, prev, qi, q, end):
    """Indexes the q-gram that ends just before arena position `end`."""
    h = gram_slot(arena, heads, qi, q, arena, end)
    prev[qi, end] = heads[qi, h]  # the gram's previous newest position, -1 where it is new
    heads[qi, h] = end


@nb.njit(cache=True)
def newest_occurrence(arena, heads, qi, q, values, end):
    """The newest arena position after an occurrence of values[end - q:end]; -1: none."""
    return heads[qi, gram_slot(arena, heads, qi, q, values, end)]


@nb.njit(cache=True)
def append_token(state, s, token):
    """One generated token of slot s into its segment and the index; a full segment takes no more."""
    slots, min_q = state.slots, state.min_q
    start, reserved, written = slots[s, START], slots[s, RESERVED], slots[s, WRITTEN]
    if written >= reserved - 1:  # the last reserved place stays -1
        return
    end = start + written + 1
    state.arena[end - 1] = token
    slots[s, WRITTEN] = written + 1
    for q in range(min_q, state.max_q + 1):
        if q > written + 1:
            break
        index_gram(state.arena, state.heads, state.prev, q - min_q, q, end)


@nb.njit(cache=True)
def compact(state):
    """Compaction: the newest finished segments up to half the arena, then every segment in use,
    copied to the front and indexed again (older outputs are forgotten)."""
    arena, heads, prev, slots, docs, counters = (
        state.arena,
        state.heads,
        state.prev,
        state.slots,
        state.docs,
        state.counters,
    )
    min_q, max_q = state.min_q, state.max_q
    capacity = arena.shape[0] - 1
    old = arena.copy()
    in_flight = 0
    for s in range(slots.shape[0]):
        if slots[s, ACTIVE]:
            in_flight += slots[s, RESERVED]
    room = min(capacity // 2, capacity - 1 - in_flight)
    keep_from, size = counters[DOCS], 0
    while keep_from > 0 and size + docs[keep_from - 1, 1] + 1 <= room:
        keep_from -= 1
        size += docs[keep_from, 1] + 1
    arena[:] = -1
    heads[:] = -1
    prev[:] = -1
    used = 1
    kept = 0
    for d in range(keep_from, counters[DOCS]):
        start, length = docs[d, 0], docs[d, 1]
        arena[used : used + length] = old[start : start + length]
        docs[kept, 0], docs[kept, 1] = used, length
        kept += 1
        for end in range(used + 1, used + length + 1):
            for q in range(min_q, min(max_q, end - used) + 1):
                index_gram(arena, heads, prev, q - min_q, q, end)
        used += length + 1
    counters[DOCS] = kept
    for s in range(slots.shape[0]):
        if slots[s, ACTIVE]:
            start, written = slots[s, START], slots[s, WRITTEN]
            arena[used : used + written] = old[start : start + written]
            slots[s, START] = used
            for end in range(used + 1, used + written + 1):
                for q in range(min_q, min(max_q, end - used) + 1):
                    index_gram(arena, heads, prev, q - min_q, q, end)
            used += slots[s, RESERVED]
    counters[USED] = used


@nb.njit(cache=True)
def reserve_segment(state, s, size):
    """Slot s's segment of `size` places at the arena's end (compacted first when it is full)."""
    capacity, counters = state.arena.shape[0] - 1, state.counters
    if counters[USED] + size > capacity:
        compact(state)
    if counters[USED] + size > capacity:  # the requests in flight hold it all: this one is not indexed
        size = 0
    state.slots[s, START], state.slots[s, RESERVED], state.slots[s, WRITTEN] = counters[USED], size, 0
    counters[USED] += size


@nb.njit(cache=True)
def finish_segment(state, s):
    """Slot s's segment becomes a finished output (if it holds a token); the slot is free."""
    slots, docs, counters = state.slots, state.docs, state.counters
    if slots[s, ACTIVE] and slots[s, WRITTEN] > 0:
        docs[counters[DOCS], 0], docs[counters[DOCS], 1] = slots[s, START], slots[s, WRITTEN]
        counters[DOCS] += 1
    slots[s, ACTIVE] = 0
    state.pending_count[s] = 0


@nb.njit(cache=True)
def output_rows(state, values, n, w, own_start, own_end):
    """Other requests' generated tokens (finished or in flight) for a request's values[:n] (its
    own segment [own_start, own_end) left out): for the longest q (max_q down to min_q) whose
    last-q-token suffix occurs, its newest max_occurrences occurrences, each extended backwards up
    to max_match; the w tokens after those that match the longest (cut at a segment's end), into
    state.scratch_rows. Returns (match length, rows)."""
    arena, heads, prev, min_q = state.arena, state.heads, state.prev, state.min_q
    max_match, max_occurrences = state.max_match, state.max_occurrences
    rows, row_lengths, ends = state.scratch_rows, state.scratch_row_lengths, state.scratch_ends
    for q in range(min(state.max_q, n), min_q - 1, -1):
        found = 0
        position = newest_occurrence(arena, heads, q - min_q, q, values, n)
        while position >= 0 and found < max_occurrences:
            if position < own_start or position >= own_end:
                ends[found] = position
                found += 1
            position = prev[q - min_q, position]
        if found == 0:
            continue
        best, count = q, 0
        for i in range(found):
            end, length = ends[i], q
            while length < max_match and length < n and arena[end - length - 1] == values[n - length - 1]:
                length += 1
            if length > best:
                best, count = length, 0
            if length == best:
                ends[count] = end
                count += 1
        kept = 0
        for i in range(count):
            size = 0
            while size < w and arena[ends[i] + size] >= 0:
                rows[kept, size] = arena[ends[i] + size]
                size += 1
            if size:
                row_lengths[kept] = size
                kept += 1
        if kept:
            return best, kept
    return 0, 0
