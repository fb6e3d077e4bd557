"""Earlier runs' outputs (the `store` source; drafters/datastore.py holds its tokens and suffix
array): the longest suffix of a context that occurs in the store, found by binary search in the
suffix array, and the tokens after its occurrences. The one search of the store: the suffix drafter's
step calls it per request, the retrieval drafter (REST) through `longest_match` and `continuations`.

A store may be several segments (a series' store: pipeline/job/series_store.py): their tokens joined
(a SEPARATOR between them) and their suffix arrays one after the other, `segments` [S, 2] the
suffix-array range of each, oldest first. Each range is sorted on its own, so a search runs in each
and the longest match wins (the newest segment's on a tie); its occurrences are that segment's."""

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


def whole(suffix_array: np.ndarray) -> np.ndarray:
    """[1, 2] int64: a store of one segment, its whole suffix array."""
    return np.array([[0, suffix_array.shape[0]]], dtype=np.int64)


@nb.njit(cache=True)
def fill_ranges(store, suffix_array, segments, q, table):
    """One pass over each segment's suffix array: each q-gram's range in it into `table` (an empty
    table: only counted)."""
    grams, mask = 0, table.shape[0] - 1
    for segment in range(segments.shape[0]):
        i, size = segments[segment, 0], segments[segment, 1]
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
                    table[h, 0], table[h, 1], table[h, 2], table[h, 3] = i, j, start, segment
            i = j
    return grams


def store_ranges(store: np.ndarray, suffix_array: np.ndarray, q: int, segments: np.ndarray | None = None) -> np.ndarray:
    """[H, 4] int32: an open-addressing table (H a power of two, at least twice the q-grams) from each
    q-gram of each segment to its suffix-array range [lo, hi) there, one store position where it
    occurs, and the segment (-1: an empty entry). The suffixes that begin with a q-gram are adjacent
    in a segment's suffix array: one pass counts them, one fills the table."""
    segments = whole(suffix_array) if segments is None else segments
    grams = fill_ranges(store, suffix_array, segments, q, np.zeros((0, 4), np.int32))
    table = np.full((1 << max(10, int(np.ceil(np.log2(2 * max(grams, 1))))), 4), -1, np.int32)
    fill_ranges(store, suffix_array, segments, q, table)
    return table


@nb.njit(cache=True)
def gram_range(store, ranges, values, start, q, segment):
    """The suffix-array range [lo, hi) of the q-gram values[start:start + q] in `segment`; (0, 0):
    the segment lacks it."""
    mask = ranges.shape[0] - 1
    h = gram_hash(values, start + q, q, mask)
    while ranges[h, 0] >= 0:
        if ranges[h, 3] == segment and same_gram(store, ranges[h, 2] + q, values, start + q, q):
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
def end_of_range(store, suffix_array, values, lo, hi, first, last):
    """The end of the suffix-array range of values[lo:hi] that begins at `first`, in a segment that
    ends at `last`: galloping from it, then a binary search, ~2 log2(r) probes for a range of r
    suffixes where a search of the whole array takes log2(N) (most ranges here hold a few suffixes,
    N is millions)."""
    known, step = first, 1
    while known + step < last and compare(store, suffix_array[known + step], values, lo, hi) == 0:
        known += step
        step *= 2
    return bound(store, suffix_array, values, lo, hi, True, known + 1, min(known + step, last))


@nb.njit(cache=True)
def store_rows(state, s, values, n, w, bound):
    """Earlier runs' outputs (drafters/datastore.py) for slot s's request values[:n]: the longest
    suffix (store_min_match..max_match tokens) that occurs, in any segment (the newest on a tie), and
    the w tokens after max_occurrences of its occurrences there spread evenly over its suffix-array
    range (cut at a document's end), into state.scratch_rows. `bound`: a length the match cannot
    pass (if the last L tokens occur, the L - k before the k newest did: the last step's match plus
    the tokens since bounds this one). Sets the slot's STORE_LO and STORE_HI (the caller its
    STORE_MATCH)."""
    store, suffix_array, segments = state.store, state.suffix_array, state.store_segments
    slot = state.slots[s]
    last_lo, last_hi = slot[STORE_LO], slot[STORE_HI]
    slot[STORE_LO] = -1
    if store.shape[0] == 0:
        return 0, 0
    longest = min(state.max_match, n, bound)
    if longest < state.store_min_match:
        return 0, 0
    best, best_lo, best_hi = 0, 0, 0
    for segment in range(segments.shape[0]):
        first, last = segments[segment, 0], segments[segment, 1]
        # the last step's match goes on in this segment: searched in its range (bound: that match's
        # length plus the new tokens)
        goes_on = first <= last_lo < last and longest == bound
        match, lo, hi = segment_match(state, segment, values, n, longest, last_lo if goes_on else -1, last_hi, last)
        if match and match >= best:
            best, best_lo, best_hi = match, lo, hi
    if best == 0:
        return 0, 0
    slot[STORE_LO], slot[STORE_HI] = best_lo, best_hi
    rows = state.scratch_rows[: state.max_occurrences]
    return best, gather_continuations(store, suffix_array, best_lo, best_hi, best, w, rows, state.scratch_row_lengths)


@nb.njit(cache=True)
def segment_match(state, segment, values, n, longest, last_lo, last_hi, segment_end):
    """(length, lo, hi): the longest suffix of values[:n] (store_min_match..`longest` tokens) that
    occurs in `segment`, and its suffix-array range; (0, 0, 0): none. Every search runs in a range
    known to hold its matches: the suffix-array range of the pattern's first min_q tokens (`ranges`:
    store_ranges(store, suffix_array, min_q, segments); a context whose last min_q tokens the segment
    lacks needs no search), or, for a match that goes on, the last match's range (`last_lo`,
    `last_hi`; last_lo -1: none). The longest is tried first, then a binary search over the lengths
    below it (if the last L tokens occur, so do the last L - 1)."""
    store, suffix_array, ranges, min_q = state.store, state.suffix_array, state.store_ranges, state.store_min_match
    lo, hi = gram_range(store, ranges, values, n - min_q, min_q, segment)
    if lo == hi:
        return 0, 0, 0
    shortest = min_q  # invariant: the last `shortest` tokens occur, first at lo (their range [lo, hi))
    if longest > min_q:
        goes_on = last_lo >= 0
        first, last = (last_lo, last_hi) if goes_on else gram_range(store, ranges, values, n - longest, min_q, segment)
        index = first_occurrence(store, suffix_array, values, n, longest, first, last)
        if index >= 0:
            shortest, lo = longest, index
        else:
            longest -= 1
            while shortest < longest:
                middle = (shortest + longest + 1) // 2
                first, last = gram_range(store, ranges, values, n - middle, min_q, segment)
                index = first_occurrence(store, suffix_array, values, n, middle, first, last)
                if index >= 0:
                    shortest, lo = middle, index
                else:
                    longest = middle - 1
        if shortest > min_q:
            hi = end_of_range(store, suffix_array, values, n - shortest, n, lo, segment_end)
    return shortest, lo, hi


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
def longest_match(store, suffix_array, segments, values, max_match, min_q):
    """(length, lo, hi): the longest suffix of `values` (min_q to max_match tokens) that occurs in a
    segment of the store (the newest on a tie) and its suffix-array range [lo, hi) there; (0, 0, 0)
    when none does. If the last L tokens occur, so do the last L - 1: the length is found by binary
    search over the lengths."""
    n = values.shape[0]
    best, best_lo, best_hi = 0, 0, 0
    for segment in range(segments.shape[0]):
        first, last = segments[segment, 0], segments[segment, 1]
        longest, shortest, lo = min(max_match, n), min_q - 1, 0  # invariant: the last `shortest` tokens occur
        while shortest < longest:
            middle = (shortest + longest + 1) // 2
            index = first_occurrence(store, suffix_array, values, n, middle, first, last)
            if index >= 0:
                shortest, lo = middle, index
            else:
                longest = middle - 1
        if shortest >= min_q and shortest >= best:
            best, best_lo = shortest, lo
            best_hi = end_of_range(store, suffix_array, values, n - shortest, n, lo, last)
    return best, best_lo, best_hi
