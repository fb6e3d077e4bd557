"""The batched suffix drafter's compiled code (numba): one call drafts for every request of a step.

`step` runs one engine step as a short sequence of phases, each a compiled function below it:
retire the requests that ended (their last tokens join the outputs), then per request, in order,
start its slot, take in its new tokens (a request's generated tokens join the outputs index at
once: answers in flight are drafted from, as SuffixDecoding's global tree holds them), judge its
earlier candidates against them (the acceptance model learns and refits), draft from the three
sources, mark their agreement, score and queue the candidates and write the best; last, cut the
batch's drafts to the step's budget. drafters/batch_suffix.py holds the state and says what each
source is. Every array and setting is a named field of one `State` (STATE_FIELDS).

Layout of the state arrays (see BatchSuffixDrafter):
- arena [C + 1] int32: generated tokens of requests, each request a segment reserved when it starts;
  -1 at position 0, after every segment's written tokens and in unwritten space (nothing crosses it);
- heads [NQ, H] int32, prev [NQ, C + 1] int32: per q in min_q..max_q an open-addressing hash table
  from a q-gram to the arena position just after its latest occurrence, and from each such position
  to the one before it (-1: none): the occurrences of a q-gram, newest first;
- slots [S, SLOT_FIELDS] int64: per request slot its segment (start, reserved, written), the tokens
  of its context taken so far, its prompt's length and the most tokens it may reach (set when the
  request starts), whether its segment is in use, and its last store match (its length and
  suffix-array range [lo, hi); lo -1: none known);
- docs [C + 1, 2] int64: the finished segments (start, tokens), oldest first; counters [COUNTERS];
- pending_* : per slot, the candidates awaiting judgement (position, length, tokens, features);
- weights, prior [F]; ring_x [R, F], ring_y [R]: the acceptance model and its judged tokens;
- calibration [2, CALIBRATION_DEPTHS, CALIBRATION_BINS]: the drafts' judged tokens by depth and by
  the probability they were given (drafters/budget.py), what the budget weighs them by.
"""
from __future__ import annotations

import math
from collections import namedtuple
from dataclasses import dataclass, fields

import numba as nb
import numpy as np
from numba.core import types
from numba.experimental import structref

from drafters.budget import allocate, calibrated_gains, calibration_bin, calibration_depth
from drafters.suffix import FEATURES, SOURCES

NUM_FEATURES = len(FEATURES)
# Feature columns by name (drafters/suffix.py's FEATURES): FEATURE.log_match is its column. A
# candidate's feature rows carry two more columns: GIVEN, the probability the model gave the token,
# and CHOSEN, 1 where the candidate was the request's draft (the calibration learns from those only:
# the best of a step's candidates is accepted more often than others given the same probability).
FEATURE = namedtuple("Feature", FEATURES)(*range(NUM_FEATURES))
GIVEN, CHOSEN = NUM_FEATURES, NUM_FEATURES + 1
CANDIDATE_COLUMNS = NUM_FEATURES + 2
CONTEXT, OUTPUTS, STORE = range(len(SOURCES))
# slots[s, :]
START, RESERVED, WRITTEN, SEEN, PROMPT, LIMIT, ACTIVE, STORE_MATCH, STORE_LO, STORE_HI = range(10)
SLOT_FIELDS = 10
# counters[:]
USED, DOCS, JUDGED, SINCE_FIT, CALLS = range(5)
COUNTERS = 5
SEPARATOR = 4294967295  # drafters/datastore.py's document separator (uint32 max)
LOGIT_CLIP = math.log((1 - 1e-3) / 1e-3)


@dataclass(frozen=True)
class Settings:
    """The drafter's settings, as the compiled step reads them (fields of the State)."""
    min_q: int  # shortest match drafted from (context and outputs)
    max_q: int  # longest q-gram the outputs index holds
    max_match: int  # longest match looked for
    max_occurrences: int  # occurrences of a match read per source
    refit_every: int  # judged tokens between two refits of the acceptance model
    newton_steps: int  # Newton steps per refit
    segment_cap: int  # most arena tokens a request reserves
    store_min_match: int  # shortest match drafted from the store
    min_probability: float  # a draft stops where the probability that all its tokens are accepted falls below
    prior_strength: float  # the acceptance model's pull towards its prior weights


# The State's fields, in order, written here once: the arrays (the layout above), the settings, a
# step's outputs ([B', w] ...: the drafts in rows :B) and its working arrays (`scratch`).
ARRAYS = ("arena", "heads", "prev", "slots", "docs", "counters", "pending_count", "pending_position", "pending_length",
          "pending_tokens", "pending_features", "weights", "prior", "ring_x", "ring_y", "calibration", "store",
          "suffix_array", "store_ranges", "logs")
OUTPUTS_FIELDS = ("out_tokens", "out_lengths", "out_confidence", "out_sources")
SCRATCH = ("rows", "row_lengths", "ends", "tally", "alive", "paths", "path_lengths", "members", "counts", "features",
           "confidence", "queued")
STATE_FIELDS = ARRAYS + tuple(f.name for f in fields(Settings)) + OUTPUTS_FIELDS + tuple(f"scratch_{n}" for n in SCRATCH)


@structref.register
class StateType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(kind)) for name, kind in fields)


class State(structref.StructRefProxy):
    """The drafter's arrays and settings (STATE_FIELDS) as one object over the same buffers: a
    compiled call unboxes one argument instead of one per array (at B = 1 a step is mostly its
    call). Made in compiled code, cached (numba's own constructor is compiled in every process)."""

    def __new__(cls, **values):
        missing = set(STATE_FIELDS) - set(values)
        if missing or len(values) != len(STATE_FIELDS):
            raise TypeError(f"State: missing {sorted(missing)}, unknown {sorted(set(values) - set(STATE_FIELDS))}")
        return _new_state(*(values[name] for name in STATE_FIELDS))


structref.define_proxy(State, StateType, STATE_FIELDS)


@nb.njit(cache=True)
def _new_state(*values):
    return State(*values)


def settings_values(settings: Settings) -> dict:
    """The settings as State fields: integers as int64, probabilities as float64 (one compiled type)."""
    return {f.name: (float if f.type in (float, "float") else int)(getattr(settings, f.name)) for f in fields(Settings)}


def scratch(max_occurrences: int, w: int) -> dict[str, np.ndarray]:
    """A step's working arrays (the State's scratch_*), made once: each is written before it is read."""
    occurrences = max(max_occurrences, 1)
    sources = len(SOURCES)
    arrays = {"rows": np.zeros((occurrences, w), np.int64), "row_lengths": np.zeros(occurrences, np.int64),
              "ends": np.zeros(occurrences, np.int64), "tally": np.zeros(occurrences, np.int64),
              "alive": np.zeros(occurrences, np.int64), "paths": np.zeros((sources, w), np.int64),
              "path_lengths": np.zeros(sources, np.int64), "members": np.zeros(w, np.int64),
              "counts": np.zeros(w, np.int64), "features": np.zeros((sources, w, CANDIDATE_COLUMNS)),
              "confidence": np.zeros((sources, w)), "queued": np.zeros(sources, np.int64)}
    return {f"scratch_{name}": arrays[name] for name in SCRATCH}


def log_table(size: int) -> np.ndarray:
    """[size] log(k) (log 0 unused)."""
    return np.log(np.maximum(np.arange(size, dtype=np.float64), 1.0))


@nb.njit(cache=True)
def _hash(values, end, q, mask):
    h = 2166136261
    for i in range(end - q, end):
        h = ((h ^ (values[i] & 0xFFFFFFFF)) * 16777619) & 0xFFFFFFFF
    return h & mask


@nb.njit(cache=True)
def _same_gram(arena, position, values, end, q):
    for i in range(q):
        if arena[position - q + i] != values[end - q + i]:
            return False
    return True


@nb.njit(cache=True)
def _insert(arena, heads, prev, qi, q, end):
    """Indexes the q-gram that ends just before arena position `end`."""
    mask = heads.shape[1] - 1
    h = _hash(arena, end, q, mask)
    while True:
        head = heads[qi, h]
        if head < 0:
            heads[qi, h] = end
            prev[qi, end] = -1
            return
        if _same_gram(arena, head, arena, end, q):
            heads[qi, h] = end
            prev[qi, end] = head
            return
        h = (h + 1) & mask


@nb.njit(cache=True)
def _lookup(arena, heads, qi, q, values, end):
    """The newest arena position after an occurrence of values[end - q:end]; -1: none."""
    mask = heads.shape[1] - 1
    h = _hash(values, end, q, mask)
    while True:
        head = heads[qi, h]
        if head < 0:
            return -1
        if _same_gram(arena, head, values, end, q):
            return head
        h = (h + 1) & mask


@nb.njit(cache=True)
def _append(arena, heads, prev, slots, s, token, min_q, max_q):
    """One generated token of slot s into its segment and the index; a full segment takes no more."""
    start, reserved, written = slots[s, START], slots[s, RESERVED], slots[s, WRITTEN]
    if written >= reserved - 1:  # the last reserved place stays -1
        return
    end = start + written + 1
    arena[end - 1] = token
    slots[s, WRITTEN] = written + 1
    for q in range(min_q, max_q + 1):
        if q > written + 1:
            break
        _insert(arena, heads, prev, q - min_q, q, end)


@nb.njit(cache=True)
def _rebuild(arena, heads, prev, slots, docs, counters, min_q, max_q):
    """Compaction: the newest finished segments up to half the arena, then every segment in use,
    copied to the front and indexed again (older outputs are forgotten)."""
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
        arena[used:used + length] = old[start:start + length]
        docs[kept, 0], docs[kept, 1] = used, length
        kept += 1
        for end in range(used + 1, used + length + 1):
            for q in range(min_q, min(max_q, end - used) + 1):
                _insert(arena, heads, prev, q - min_q, q, end)
        used += length + 1
    counters[DOCS] = kept
    for s in range(slots.shape[0]):
        if slots[s, ACTIVE]:
            start, written = slots[s, START], slots[s, WRITTEN]
            arena[used:used + written] = old[start:start + written]
            slots[s, START] = used
            for end in range(used + 1, used + written + 1):
                for q in range(min_q, min(max_q, end - used) + 1):
                    _insert(arena, heads, prev, q - min_q, q, end)
            used += slots[s, RESERVED]
    counters[USED] = used


@nb.njit(cache=True)
def _reserve(arena, heads, prev, slots, docs, counters, s, size, min_q, max_q):
    capacity = arena.shape[0] - 1
    if counters[USED] + size > capacity:
        _rebuild(arena, heads, prev, slots, docs, counters, min_q, max_q)
    if counters[USED] + size > capacity:  # the requests in flight hold it all: this one is not indexed
        size = 0
    slots[s, START], slots[s, RESERVED], slots[s, WRITTEN] = counters[USED], size, 0
    counters[USED] += size


@nb.njit(cache=True)
def _finish(slots, docs, counters, pending_count, s):
    if slots[s, ACTIVE] and slots[s, WRITTEN] > 0:
        docs[counters[DOCS], 0], docs[counters[DOCS], 1] = slots[s, START], slots[s, WRITTEN]
        counters[DOCS] += 1
    slots[s, ACTIVE] = 0
    pending_count[s] = 0


# -- the three sources ---------------------------------------------------------------------

@nb.njit(cache=True)
def _context_rows(values, n, w, min_q, max_match, max_occurrences, rows, row_lengths):
    """The request's own tokens: the longest earlier match of its suffix (min_q..max_match tokens)
    and the w tokens after each of its newest max_occurrences occurrences (past the context's end
    the match repeats periodically). Returns (match length, rows)."""
    best, found, last = 0, 0, values[n - 1]
    end = n - 1
    while end > 0:
        # most ends do not follow the last token: skip them four at a time (half the scan's time)
        while end > 4 and values[end - 1] != last and values[end - 2] != last and values[end - 3] != last \
                and values[end - 4] != last:
            end -= 4
        length = 0
        while length < max_match and length < end and values[end - 1 - length] == values[n - 1 - length]:
            length += 1
        if length >= min_q and length >= best:
            if length > best:
                best, found = length, 0
            if found < max_occurrences:
                period = n - end
                for j in range(w):
                    rows[found, j] = values[end + j] if end + j < n else rows[found, j - period]
                row_lengths[found] = w
                found += 1
        end -= 1
    return best, found


@nb.njit(cache=True)
def _output_rows(arena, heads, prev, values, n, w, own_start, own_end, min_q, max_q, max_match,
                 max_occurrences, rows, row_lengths, ends):
    """Other requests' generated tokens (finished or in flight): for the longest q (max_q down to
    min_q) whose last-q-token suffix occurs outside the request's own segment, its newest
    max_occurrences occurrences, each extended backwards up to max_match; the tokens after those
    that match the longest (cut at a segment's end). Returns (match length, rows)."""
    for q in range(min(max_q, n), min_q - 1, -1):
        found = 0
        position = _lookup(arena, heads, q - min_q, q, values, n)
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


@nb.njit(cache=True)
def _compare(store, start, values, lo, hi):
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
def _bound(store, suffix_array, values, lo, hi, upper, first, last):
    """First suffix-array index in [first, last) whose suffix is >= (upper: >) values[lo:hi]; last: none."""
    while first < last:
        middle = (first + last) // 2
        order = _compare(store, suffix_array[middle], values, lo, hi)
        if order < 0 or (upper and order == 0):
            first = middle + 1
        else:
            last = middle
    return first


@nb.njit(cache=True)
def _gram_at(store, start, q):
    """Whether a q-gram starts at store position `start` (none runs past the end or over a separator)."""
    if start + q > store.shape[0]:
        return False
    for i in range(start, start + q):
        if store[i] == SEPARATOR:
            return False
    return True


@nb.njit(cache=True)
def _fill_ranges(store, suffix_array, q, table):
    """One pass over the suffix array: each q-gram's range into `table` (an empty table: only counted)."""
    size, grams, mask = suffix_array.shape[0], 0, table.shape[0] - 1
    i = 0
    while i < size:
        start = suffix_array[i]
        j = i + 1
        if _gram_at(store, start, q):
            while j < size and _gram_at(store, suffix_array[j], q) \
                    and _same_gram(store, start + q, store, suffix_array[j] + q, q):
                j += 1
            grams += 1
            if table.shape[0]:
                h = _hash(store, start + q, q, mask)
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
    grams = _fill_ranges(store, suffix_array, q, np.zeros((0, 3), np.int32))
    table = np.full((1 << max(10, int(np.ceil(np.log2(2 * max(grams, 1))))), 3), -1, np.int32)
    _fill_ranges(store, suffix_array, q, table)
    return table


@nb.njit(cache=True)
def _gram_range(store, ranges, values, start, q):
    """The suffix-array range [lo, hi) of the q-gram values[start:start + q]; (0, 0): the store lacks it."""
    mask = ranges.shape[0] - 1
    h = _hash(values, start + q, q, mask)
    while ranges[h, 0] >= 0:
        if _same_gram(store, ranges[h, 2] + q, values, start + q, q):
            return ranges[h, 0], ranges[h, 1]
        h = (h + 1) & mask
    return 0, 0


@nb.njit(cache=True)
def _first_occurrence(store, suffix_array, values, n, length, first, last):
    """The suffix-array index of the first occurrence of the context's last `length` tokens, searched
    in [first, last) (a range known to hold all of them, if any); -1: none."""
    if first >= last:
        return -1
    index = _bound(store, suffix_array, values, n - length, n, False, first, last)
    if index < last and _compare(store, suffix_array[index], values, n - length, n) == 0:
        return index
    return -1


@nb.njit(cache=True)
def _end_of_range(store, suffix_array, values, lo, hi, first):
    """The end of the suffix-array range of values[lo:hi] that begins at `first`: galloping from it,
    then a binary search, ~2 log2(r) probes for a range of r suffixes where a search of the whole
    array takes log2(N) (most ranges here hold a few suffixes, N is millions)."""
    last, known, step = suffix_array.shape[0], first, 1
    while known + step < last and _compare(store, suffix_array[known + step], values, lo, hi) == 0:
        known += step
        step *= 2
    return _bound(store, suffix_array, values, lo, hi, True, known + 1, min(known + step, last))


@nb.njit(cache=True)
def _store_rows(store, suffix_array, ranges, values, n, w, min_q, max_match, max_occurrences, rows, row_lengths, bound,
                slot):
    """Earlier runs' outputs (drafters/datastore.py): the longest suffix (min_q..max_match tokens)
    that occurs, and the w tokens after max_occurrences of its occurrences spread evenly over its
    suffix-array range (cut at a document's end). `bound`: a length the match cannot pass (if the
    last L tokens occur, the L - k before the k newest did: the last step's match plus the tokens
    since bounds this one). Every search runs in a range known to hold its matches: the
    suffix-array range of the pattern's first min_q tokens (`ranges`: store_ranges(store,
    suffix_array, min_q); a context whose last min_q tokens the store lacks needs no search), or,
    for a match that goes on, the last match's range (which `slot` keeps), when the bound is that
    match plus the new tokens. The bound itself is tried first, then a binary search over the
    lengths below it (if the last L tokens occur, so do the last L - 1). Sets slot's STORE_LO and
    STORE_HI (the caller its STORE_MATCH)."""
    last_lo, last_hi = slot[STORE_LO], slot[STORE_HI]
    slot[STORE_LO] = -1
    if store.shape[0] == 0:
        return 0, 0
    longest = min(max_match, n, bound)
    if longest < min_q:
        return 0, 0
    lo, hi = _gram_range(store, ranges, values, n - min_q, min_q)
    if lo == hi:
        return 0, 0
    shortest = min_q  # invariant: the last `shortest` tokens occur, first at lo (their range [lo, hi))
    if longest > min_q:
        goes_on = last_lo >= 0 and longest == bound  # (bound: the last match's length plus the new tokens)
        first, last = (last_lo, last_hi) if goes_on else _gram_range(store, ranges, values, n - longest, min_q)
        index = _first_occurrence(store, suffix_array, values, n, longest, first, last)
        if index >= 0:
            shortest, lo = longest, index
        else:
            longest -= 1
            while shortest < longest:
                middle = (shortest + longest + 1) // 2
                first, last = _gram_range(store, ranges, values, n - middle, min_q)
                index = _first_occurrence(store, suffix_array, values, n, middle, first, last)
                if index >= 0:
                    shortest, lo = middle, index
                else:
                    longest = middle - 1
        if shortest > min_q:
            hi = _end_of_range(store, suffix_array, values, n - shortest, n, lo)
    slot[STORE_LO], slot[STORE_HI] = lo, hi
    count = min(hi - lo, max_occurrences)
    kept = 0
    for i in range(count):
        start = suffix_array[lo + (i * (hi - lo)) // count] + shortest
        size = 0
        while size < w and start + size < store.shape[0] and store[start + size] != SEPARATOR:
            rows[kept, size] = store[start + size]
            size += 1
        if size:
            row_lengths[kept] = size
            kept += 1
    return shortest, kept


@nb.njit(cache=True)
def _majority_path(rows, row_lengths, count, w, path, shares, counts, scratch, alive):
    """drafters/suffix.py's majority_path over rows[:count]: at each depth the most frequent next
    token (ties: the smallest id) of the rows that follow the path so far, how many have it
    (counts) and of how many (shares: the share's denominator; the first depth counts one unseen
    row too). Returns the path's length. alive[:members]: the rows that follow the path so far."""
    members = count
    for i in range(count):
        alive[i] = i
    for depth in range(w):
        tallied = 0
        for m in range(members):
            i = alive[m]
            if row_lengths[i] > depth:
                scratch[tallied] = rows[i, depth]
                tallied += 1
        if tallied == 0:
            return depth
        token, best = scratch[0], tallied
        for t in range(1, tallied):
            if scratch[t] != token:
                best = 0
                break
        if best == 0:  # more than one next token: count each (a few rows: no sort needed)
            for t in range(tallied):
                run = 0
                for u in range(tallied):
                    run += scratch[u] == scratch[t]
                if run > best or (run == best and scratch[t] < token):
                    best, token = run, scratch[t]
        path[depth] = token
        shares[depth] = members + (depth == 0)  # the share's denominator
        counts[depth] = best
        following = 0
        for m in range(members):
            i = alive[m]
            if row_lengths[i] > depth and rows[i, depth] == token:
                alive[following] = i
                following += 1
        members = following
    return w


@nb.njit(cache=True)
def _features(source, match, counts, members, size, logs, out):
    """drafters/suffix.py's token_features for one path; logs[k] = log(k) (the shares are counts
    over members, so every logarithm is of an integer: a table lookup). `agreed` and
    `bigram_top1` start at 0 (the step marks agreement; the batched drafter has no bigram table)."""
    for j in range(size):
        depth = j + 1
        if counts[j] >= members[j]:  # a share of 1, clipped to 1 - 1e-3 as token_features clips it
            logit = LOGIT_CLIP
        else:
            logit = logs[counts[j]] - logs[members[j] - counts[j]]
        out[j, FEATURE.bias] = 1.0
        out[j, FEATURE.log_odds_share] = logit
        out[j, FEATURE.log_match] = logs[match]
        out[j, FEATURE.log_depth] = logs[depth]
        out[j, FEATURE.log_reach] = logs[match + depth - 1]
        out[j, FEATURE.log_count] = logs[counts[j]]
        for k in range(len(SOURCES)):  # from_context, from_outputs, from_store: one column each, in order
            out[j, FEATURE.from_context + k] = 1.0 if source == k else 0.0
        out[j, FEATURE.first] = 1.0 if depth == 1 else 0.0
        out[j, FEATURE.agreed] = 0.0
        out[j, FEATURE.bigram_top1] = 0.0


@nb.njit(cache=True)
def _sigmoid(z):
    return 1.0 / (1.0 + math.exp(-min(max(z, -30.0), 30.0)))


# -- the acceptance model -----------------------------------------------------------------------

@nb.njit(cache=True)
def _solve(matrix, vector):
    """matrix^-1 vector by Gaussian elimination with partial pivoting (F x F, F small)."""
    size = vector.shape[0]
    a = matrix.copy()
    b = vector.copy()
    for column in range(size):
        pivot = column + np.argmax(np.abs(a[column:, column]))
        if pivot != column:
            for k in range(size):
                a[column, k], a[pivot, k] = a[pivot, k], a[column, k]
            b[column], b[pivot] = b[pivot], b[column]
        for row in range(column + 1, size):
            factor = a[row, column] / a[column, column]
            for k in range(column, size):
                a[row, k] -= factor * a[column, k]
            b[row] -= factor * b[column]
    x = np.zeros(size)
    for row in range(size - 1, -1, -1):
        total = b[row]
        for k in range(row + 1, size):
            total -= a[row, k] * x[k]
        x[row] = total / a[row, row]
    return x


@nb.njit(cache=True)
def _fit(weights, prior, ring_x, ring_y, held, prior_strength, newton_steps):
    """drafters/acceptance.py's fit: Newton steps on the logistic loss plus (λ/2)|w - prior|²."""
    features = weights.shape[0]
    for _ in range(newton_steps):
        gradient = prior_strength * (weights - prior)
        hessian = prior_strength * np.eye(features)
        for i in range(held):
            z = 0.0
            for k in range(features):
                z += ring_x[i, k] * weights[k]
            p = _sigmoid(z)
            for k in range(features):
                gradient[k] += ring_x[i, k] * (p - ring_y[i])
                for m in range(features):
                    hessian[k, m] += ring_x[i, k] * ring_x[i, m] * p * (1 - p)
        weights -= _solve(hessian, gradient)


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _judge(state, s, values, n):
    """Judges slot s's waiting candidates whose fate its tokens values[:n] now show: each token up
    to the first wrong one, accepted or not, into the model's ring; every token's cumulative
    outcome against the probability it was given (column GIVEN) into the calibration, for the
    candidates that were drafts (column CHOSEN). A candidate
    right so far whose rest is not emitted yet waits on. Returns the tokens judged."""
    pending_position, pending_length = state.pending_position, state.pending_length
    pending_tokens, pending_features = state.pending_tokens, state.pending_features
    ring_x, ring_y, counters, calibration = state.ring_x, state.ring_y, state.counters, state.calibration
    capacity, judged_now, still = ring_y.shape[0], 0, 0
    for p in range(state.pending_count[s]):
        position, size = pending_position[s, p], pending_length[s, p]
        available = min(size, n - position)
        right = 0
        while right < available and pending_tokens[s, p, right] == values[position + right]:
            right += 1
        if right == available and available < size:  # right so far, the rest not emitted yet
            if still != p:
                pending_position[s, still], pending_length[s, still] = position, size
                pending_tokens[s, still, :] = pending_tokens[s, p, :]
                pending_features[s, still, :, :] = pending_features[s, p, :, :]
            still += 1
            continue
        for j in range(size if pending_features[s, p, 0, CHOSEN] else 0):  # its first j + 1 tokens held, or not
            depth, index = calibration_depth(j), calibration_bin(pending_features[s, p, j, GIVEN])
            calibration[0, depth, index] += 1.0 if j < right else 0.0
            calibration[1, depth, index] += 1.0
        judged = min(right + 1, size)
        for j in range(judged):
            slot = counters[JUDGED] % capacity
            ring_x[slot, :] = pending_features[s, p, j, :NUM_FEATURES]
            ring_y[slot] = 1.0 if j < right else 0.0
            counters[JUDGED] += 1
        judged_now += judged
    state.pending_count[s] = still
    counters[SINCE_FIT] += judged_now
    return judged_now


# -- the step, phase by phase ----------------------------------------------------------------

@nb.njit(cache=True)
def step(state, finished, finished_tokens, finished_offsets, request_slots, tokens, rows, lengths, width, step_cost):
    """One engine step for a batch of requests. Request b is tokens[rows[b], :lengths[b]], in slot
    request_slots[b] (its prompt's length and limit set there when it started); it drafts at most
    `width` tokens (0: it only takes in its tokens) and never past its limit. finished[i]: the
    slots of requests that ended since the last step, their generated tokens
    finished_tokens[finished_offsets[i]:finished_offsets[i + 1]]. step_cost[n]: the step's seconds
    when it feeds n tokens (empty: no budget).

    Phases: retire the finished requests; then per request, in order: start its slot (or start it
    again when its tokens were rewound), take in its new tokens, judge its earlier candidates (and
    refit the acceptance model), draft from each source, mark where sources agree, score the
    candidates and queue them for judgement, and write the best one; last, cut the batch's drafts
    to the step's budget. Writes request b's draft into state.out_*[b] (out_lengths[b] tokens,
    out_sources[b] its source, -1: none) and returns the number of draft tokens kept."""
    state.counters[CALLS] += 1
    _retire(state, finished, finished_tokens, finished_offsets)
    batch, max_w = request_slots.shape[0], min(width, state.out_tokens.shape[1])
    for b in range(batch):
        s, n, values = request_slots[b], lengths[b], tokens[rows[b]]
        state.out_lengths[b], state.out_sources[b] = 0, -1
        _start(state, s, n)
        store_bound = _take_in(state, s, values, n)
        if _judge(state, s, values, n) and state.counters[SINCE_FIT] >= state.refit_every:
            _fit(state.weights, state.prior, state.ring_x, state.ring_y, min(state.counters[JUDGED], state.ring_y.shape[0]),
                 state.prior_strength, state.newton_steps)
            state.counters[SINCE_FIT] = 0
        w = min(max_w, state.slots[s, LIMIT] - n - 1)
        if w <= 0 or n == 0:  # nothing to draft; the store was not searched: no bound next time
            state.slots[s, STORE_MATCH], state.slots[s, STORE_LO] = state.max_match, -1
            continue
        _draft_from_sources(state, s, values, n, w, store_bound)
        _mark_agreement(state)
        best = _score_and_queue(state, s, n)
        if best >= 0:
            _write_draft(state, b, best)
            _mark_chosen(state, s, best)
    if step_cost.shape[0]:
        return _budget(state.out_lengths[:batch], state.out_confidence[:batch], step_cost, state.calibration)
    return state.out_lengths[:batch].sum()


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _retire(state, finished, finished_tokens, finished_offsets):
    """Requests that ended: the generated tokens the drafter had not taken in join their segment,
    which becomes a finished output (drafted from until the arena forgets it); the slot is free."""
    slots = state.slots
    for i in range(finished.shape[0]):
        s = finished[i]
        if slots[s, ACTIVE]:
            taken = slots[s, SEEN] - slots[s, PROMPT]
            for j in range(finished_offsets[i] + max(taken, 0), finished_offsets[i + 1]):
                _append(state.arena, state.heads, state.prev, slots, s, finished_tokens[j], state.min_q, state.max_q)
        _finish(slots, state.docs, state.counters, state.pending_count, s)


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _start(state, s, n):
    """Slot s's segment for a request of n tokens: kept while its tokens only grow. Made at its
    first step, and again when its tokens were rewound (fewer than it has taken in: the old
    segment becomes an output): as long as its generation may run (up to segment_cap), no store
    match known."""
    slots = state.slots
    if slots[s, ACTIVE] and n < slots[s, SEEN]:
        _finish(slots, state.docs, state.counters, state.pending_count, s)
    if not slots[s, ACTIVE]:
        slots[s, ACTIVE], slots[s, SEEN] = 1, 0
        slots[s, STORE_MATCH], slots[s, STORE_LO] = state.max_match, -1  # no earlier match known: no bound
        size = min(max(slots[s, LIMIT] - slots[s, PROMPT], 0) + 1, state.segment_cap)
        _reserve(state.arena, state.heads, state.prev, slots, state.docs, state.counters, s, size, state.min_q,
                 state.max_q)


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _take_in(state, s, values, n):
    """Slot s's generated tokens since the last step into its segment and the outputs index (its
    answer is drafted from while in flight). Returns the longest store match this step can have:
    the last step's match (or the store's shortest, less one) plus the tokens since."""
    slots = state.slots
    store_bound = max(slots[s, STORE_MATCH], state.store_min_match - 1) + n - slots[s, SEEN]
    for position in range(max(slots[s, SEEN], slots[s, PROMPT]), n):
        _append(state.arena, state.heads, state.prev, slots, s, values[position], state.min_q, state.max_q)
    slots[s, SEEN] = n
    return store_bound


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _draft_from_sources(state, s, values, n, w, store_bound):
    """Each source's candidate for the request in slot s (values[:n]): the majority path of the
    rows the source finds (scratch_paths[source], scratch_path_lengths[source] tokens, 0: none) and
    its tokens' features (scratch_features[source])."""
    rows, row_lengths = state.scratch_rows, state.scratch_row_lengths
    match, found = _context_rows(values, n, w, state.min_q, state.max_match, state.max_occurrences, rows, row_lengths)
    _take_path(state, CONTEXT, match, found, w)
    own_start = state.slots[s, START]  # the request's own segment: its own tokens are the context's
    match, found = _output_rows(state.arena, state.heads, state.prev, values, n, w, own_start,
                                own_start + state.slots[s, RESERVED], state.min_q, state.max_q, state.max_match,
                                state.max_occurrences, rows, row_lengths, state.scratch_ends)
    _take_path(state, OUTPUTS, match, found, w)
    match, found = _store_rows(state.store, state.suffix_array, state.store_ranges, values, n, w, state.store_min_match,
                               state.max_match, state.max_occurrences, rows, row_lengths, store_bound, state.slots[s])
    state.slots[s, STORE_MATCH] = match
    _take_path(state, STORE, match, found, w)


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _take_path(state, source, match, found, w):
    """The majority path of a source's `found` rows (a `match`-token match) and its features."""
    size = _majority_path(state.scratch_rows, state.scratch_row_lengths, found, w, state.scratch_paths[source],
                          state.scratch_members, state.scratch_counts, state.scratch_tally,
                          state.scratch_alive) if found else 0
    state.scratch_path_lengths[source] = size
    if size:
        _features(source, match, state.scratch_counts, state.scratch_members, size, state.logs,
                  state.scratch_features[source])


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _mark_agreement(state):
    """`agreed`: a token where another source's candidate drafts the same prefix up to it."""
    paths, lengths, features = state.scratch_paths, state.scratch_path_lengths, state.scratch_features
    for source in range(len(SOURCES)):
        for other in range(len(SOURCES)):
            if other != source:
                j = 0
                while j < min(lengths[source], lengths[other]) and paths[source, j] == paths[other, j]:
                    features[source, j, FEATURE.agreed] = 1.0
                    j += 1


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _score_and_queue(state, s, n):
    """Scores each candidate with the acceptance model: confidence[source, j], the probability that
    its first j + 1 tokens are all accepted (also kept as column GIVEN), and its score, their sum.
    Every candidate is queued for judgement (while slot s has room: scratch_queued[source] its
    place, -1 none). Returns the source of the best
    candidate with at least one token of min_probability (-1: none)."""
    features, confidence, weights = state.scratch_features, state.scratch_confidence, state.weights
    best_source, best_score = -1, 0.0
    for source in range(len(SOURCES)):
        size = state.scratch_path_lengths[source]
        if size == 0:
            continue
        probability, score, kept = 1.0, 0.0, 0
        for j in range(size):
            z = 0.0
            for k in range(NUM_FEATURES):
                z += features[source, j, k] * weights[k]
            probability *= _sigmoid(z)
            confidence[source, j] = probability
            features[source, j, GIVEN] = probability
            score += probability
            if probability >= state.min_probability:
                kept += 1
        if kept and (best_source < 0 or score > best_score):
            best_source, best_score = source, score
        state.scratch_queued[source] = _queue(state, s, n, source, size)
    return best_source


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _queue(state, s, n, source, size):
    """A candidate drafted at position n of slot s's request, to be judged once its tokens are
    emitted (dropped when PENDING candidates wait already). Returns its place (-1: dropped), not
    chosen yet."""
    p = state.pending_count[s]
    if p >= state.pending_position.shape[1]:
        return -1
    state.pending_position[s, p], state.pending_length[s, p] = n, size
    state.pending_tokens[s, p, :size] = state.scratch_paths[source, :size]
    state.pending_features[s, p, :size, :] = state.scratch_features[source, :size, :]
    state.pending_features[s, p, 0, CHOSEN] = 0.0
    state.pending_count[s] = p + 1
    return p


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _mark_chosen(state, s, source):
    """The source's queued candidate is slot s's draft this step."""
    p = state.scratch_queued[source]
    if p >= 0:
        state.pending_features[s, p, 0, CHOSEN] = 1.0


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _write_draft(state, b, source):
    """Request b's draft: the source's candidate up to its last token of min_probability."""
    confidence = state.scratch_confidence
    for j in range(state.scratch_path_lengths[source]):
        if confidence[source, j] < state.min_probability:
            break
        state.out_tokens[b, j] = state.scratch_paths[source, j]
        state.out_confidence[b, j] = confidence[source, j]
        state.out_lengths[b] = j + 1
    state.out_sources[b] = source


@nb.njit(cache=True)
def _budget(out_lengths, out_confidence, step_cost, calibration):
    """Cuts the batch's drafts to what pays (drafters/budget.py), each token's probability as
    calibrated by what the judged tokens of its bin did."""
    gains = calibrated_gains(out_confidence, out_lengths, calibration, np.empty_like(out_confidence))
    return allocate(gains, out_lengths.copy(), step_cost, out_lengths)
