"""Earlier runs' outputs (the `store` source; drafters/datastore.py holds its tokens and suffix
array): the longest suffix of a context that occurs in the store, found by binary search in the
suffix array, and the tokens after its occurrences. The one search of the store: the suffix drafter's
step calls it per request, the retrieval drafter (REST) through `longest_match` and `continuations`."""

from __future__ import annotations

import numba as nb
import numpy as np

from drafters.suffix.grams import gram_hash, same_gram
from drafters.suffix.state import STORE_HI, STORE_LO

# Written between documents. It is the largest uint32 and never a token id, so a pattern (a model
# context) never matches across it, and it sorts after every real token.
SEPARATOR = 2**32 - 1


@nb.njit(cache=True)
def compare(store, start, values, lo, hi):
    """-1, 0, 1: the store's tokens from `start` against values[lo:hi], as far as the pattern goes
    (a suffix that runs out of tokens first is smaller)."""
    size = store.shape[0]
    for i in range(hi - lo):
        if start + i >= size:
            return -1
        token = np.int64(store[start + i])
        if token != values[lo + i]:
            return -1 if token < values[lo + i] else 1
    return 0


@nb.njit(cache=True)
def bound(store, suffix_array, values, lo, hi, upper, first, last):
    """First suffix-array index in [first, last) whose suffix is >= (upper: >) values[lo:hi]; last: none."""
    while first < last:
        middle = (first + last) // 2
        order = compare(store, suffix_array[middle], values, lo, hi)
        if order < 0 or (upper and order == 0):
            first = middle + 1
        else:
            last = middle
    return first


@nb.njit(cache=True)
def gram_at(store, start, q):
    """Whether a q-gram starts at store position `start` (none runs past the end or over a separator)."""
    if start + q > store.shape[0]:
        return False
    for i in range(start, start + q):
        if store[i] == SEPARATOR:
            return False
    return True


@nb.njit(cache=True)
def fill_ranges(store, suffix_array, q, table):
    """One pass over the suffix array: each q-gram's range into `table` (an empty table: only counted)."""
    size, grams, mask = suffix_array.shape[0], 0, table.shape[0] - 1
    i = 0
    while i < size:
        start = suffix_array[i]
        j = i + 1
        if gram_at(store, start, q):
            while (
                j < size
                and gram_at(store, suffix_array[j], q)
                and same_gram(store, start + q, store, suffix_array[j] + q, q)
            ):
                j += 1
            grams += 1
            if table.shape[0]:
                h = gram_hash(store, start + q, q, mask)
                while table[h, 0] >= 0:
                    h = (h + 1) & mask
                table[h, 0], table[h, 1], table[h, 2] = i, j, start
        i = j
    return grams


def store_ranges(store: np.ndarray, suffix_array: np.ndarray, q: int) -> np.ndarray:
    """[H, 3] int32: an open-addressing table (H a power of two, at least twice the q-grams) from each
    q-gram of the store to its suffix-array range [lo, hi) and one store position where it occurs
    (-1: an empty entry). The suffixes that begin with a q-gram are adjacent in the suffix array:
    one pass counts them, one fills the table."""
    grams = fill_ranges(store, suffix_array, q, np.zeros((0, 3), np.int32))
    table = np.full((1 << max(10, int(np.ceil(np.log2(2 * max(grams, 1))))), 3), -1, np.int32)
    fill_ranges(store, suffix_array, q, table)
    return table


@nb.njit(cache=True)
def gram_range(store, ranges, values, start, q):
    """The suffix-array range [lo, hi) of the q-gram values[start:start + q]; (0, 0): the store lacks it."""
    mask = ranges.shape[0] - 1
    h = gram_hash(values, start + q, q, mask)
    while ranges[h, 0] >= 0:
        if same_gram(store, ranges[h, 2] + q, values, start + q, q):
            return ranges[h, 0], ranges[h, 1]
        h = (h + 1) & mask
    return 0, 0


@nb.njit(cache=True)
def first_occurrence(store, suffix_array, values, n, length, first, last):
    """The suffix-array index of the first occurrence of the context's last `length` tokens, searched
    in [first, last) (a range known to hold all of them, if any); -1: none."""
    if first >= last:
        return -1
    index = bound(store, suffix_array, values, n - length, n, False, first, last)
    if index < last and compare(store, suffix_array[index], values, n - length, n) == 0:
        return index
    return -1


@nb.njit(cache=True)
def end_of_range(store, suffix_array, values, lo, hi, first):
    """The end of the suffix-array range of values[lo:hi] that begins at `first`: galloping from it,
    then a binary search, ~2 log2(r) probes for a range of r suffixes where a search of the whole
    array takes log2(N) (most ranges here hold a few suffixes, N is millions)."""
    last, known, step = suffix_array.shape[0], first, 1
    while known + step < last and compare(store, suffix_array[known + step], values, lo, hi) == 0:
        known += step
        step *= 2
    return bound(store, suffix_array, values, lo, hi, True, known + 1, min(known + step, last))


@nb.njit(cache=True)
def store_rows(state, s, values, n, w, bound):
    """Earlier runs' outputs (drafters/datastore.py) for slot s's request values[:n]: the longest
    suffix (store_min_match..max_match tokens) that occurs, and the w tokens after max_occurrences
    of its occurrences spread evenly over its suffix-array range (cut at a document's end), into
    state.scratch_rows. `bound`: a length the match cannot pass (if the
    last L tokens occur, the L - k before the k newest did: the last step's match plus the tokens
    since bounds this one). Every search runs in a range known to hold its matches: the
    suffix-array range of the pattern's first min_q tokens (`ranges`: store_ranges(store,
    suffix_array, min_q); a context whose last min_q tokens the store lacks needs no search), or,
    for a match that goes on, the last match's range (which the slot keeps), when the bound is that
    match plus the new tokens. The bound itself is tried first, then a binary search over the
    lengths below it (if the last L tokens occur, so do the last L - 1). Sets the slot's STORE_LO and
    STORE_HI (the caller its STORE_MATCH)."""
    store, suffix_array, ranges = state.store, state.suffix_array, state.store_ranges
    min_q, max_match, slot = state.store_min_match, state.max_match, state.slots[s]
    last_lo, last_hi = slot[STORE_LO], slot[STORE_HI]
    slot[STORE_LO] = -1
    if store.shape[0] == 0:
        return 0, 0
    longest = min(max_match, n, bound)
    if longest < min_q:
        return 0, 0
    lo, hi = gram_range(store, ranges, values, n - min_q, min_q)
    if lo == hi:
        return 0, 0
    shortest = min_q  # invariant: the last `shortest` tokens occur, first at lo (their range [lo, hi))
    if longest > min_q:
        goes_on = last_lo >= 0 and longest == bound  # (bound: the last match's length plus the new tokens)
        first, last = (last_lo, last_hi) if goes_on else gram_range(store, ranges, values, n - longest, min_q)
        index = first_occurrence(store, suffix_array, values, n, longest, first, last)
        if index >= 0:
            shortest, lo = longest, index
        else:
            longest -= 1
            while shortest < longest:
                middle = (shortest + longest + 1) // 2
                first, last = gram_range(store, ranges, values, n - middle, min_q)
                index = first_occurrence(store, suffix_array, values, n, middle, first, last)
                if index >= 0:
                    shortest, lo = middle, index
                else:
                    longest = middle - 1
        if shortest > min_q:
            hi = end_of_range(store, suffix_array, values, n - shortest, n, lo)
    slot[STORE_LO], slot[STORE_HI] = lo, hi
    rows = state.scratch_rows[: state.max_occurrences]
    return shortest, gather_continuations(store, suffix_array, lo, hi, shortest, w, rows, state.scratch_row_lengths)


@nb.njit(cache=True)
def gather_continuations(store, suffix_array, lo, hi, match, w, rows, row_lengths):
    """The w tokens after min(hi - lo, len(rows)) occurrences of a `match`-token pattern, spread
    evenly over its suffix-array range [lo, hi) (the first ones in suffix-array order would be the
    alphabetically smallest continuations), each cut at a document's end: rows[:kept]
    (row_lengths[:kept] tokens each; an empty one is left out). Returns kept."""
    count = min(hi - lo, rows.shape[0])
    kept = 0
    for i in range(count):
        start = suffix_array[lo + (i * (hi - lo)) // count] + match
        size = 0
        while size < w and start + size < store.shape[0] and store[start + size] != SEPARATOR:
            rows[kept, size] = store[start + size]
            size += 1
        if size:
            row_lengths[kept] = size
            kept += 1
    return kept


@nb.njit(cache=True)
def longest_match(store, suffix_array, values, max_match, min_q):
    """(length, lo, hi): the longest suffix of `values` (min_q to max_match tokens) that occurs in the
    store and its suffix-array range [lo, hi); (0, 0, 0) when none does. If the last L tokens occur,
    so do the last L - 1: the length is found by binary search over the lengths."""
    n = values.shape[0]
    longest, shortest, lo = min(max_match, n), min_q - 1, 0  # invariant: the last `shortest` tokens occur
    while shortest < longest:
        middle = (shortest + longest + 1) // 2
        index = first_occurrence(store, suffix_array, values, n, middle, 0, suffix_array.shape[0])
        if index >= 0:
            shortest, lo = middle, index
        else:
            longest = middle - 1
    if shortest < min_q:
        return 0, 0, 0
    return shortest, lo, end_of_range(store, suffix_array, values, n - shortest, n, lo)
