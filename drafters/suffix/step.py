"""The suffix drafter's compiled step: one call drafts for every request of an engine step.

`step` runs one engine step as a short sequence of phases, each a compiled function below it:
retire the requests that ended (their last tokens join the outputs), then per request, in order,
start its slot, take in its new tokens (a request's generated tokens join the outputs index at
once: answers in flight are drafted from, as SuffixDecoding's global tree holds them), judge its
earlier candidates against them (the acceptance model learns and refits), draft from the three
sources, mark their agreement, score and queue the candidates and write the best; last, cut the
batch's drafts to the step's budget. drafter.py holds the state; state.py says its layout.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from drafters.budget import allocate, calibrated_gains, calibration_bin, calibration_depth
from drafters.suffix.acceptance import CHOSEN, FEATURE, GIVEN, NUM_FEATURES, SOURCES, fit, sigmoid, token_features
from drafters.suffix.arena import append_token, finish_segment, output_rows, reserve_segment
from drafters.suffix.state import (
    ACTIVE,
    CALLS,
    JUDGED,
    LIMIT,
    PROMPT,
    RESERVED,
    SEEN,
    SINCE_FIT,
    START,
    STORE_LO,
    STORE_MATCH,
)
from drafters.suffix.store_search import store_rows

CONTEXT, OUTPUTS, STORE = range(len(SOURCES))


@nb.njit(cache=True)
def context_rows(state, values, n, w):
    """The request's own tokens values[:n]: the longest earlier match of its suffix (min_q..max_match
    tokens) and the w tokens after each of its newest max_occurrences occurrences (past the
    context's end the match repeats periodically), into state.scratch_rows. Returns (match length, rows)."""
    min_q, max_match, max_occurrences = state.min_q, state.max_match, state.max_occurrences
    rows, row_lengths = state.scratch_rows, state.scratch_row_lengths
    best, found, last = 0, 0, values[n - 1]
    end = n - 1
    while end > 0:
        # most ends do not follow the last token: skip them four at a time (half the scan's time)
        while (
            end > 4
            and values[end - 1] != last
            and values[end - 2] != last
            and values[end - 3] != last
            and values[end - 4] != last
        ):
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
def majority_path(state, count, w, path):
    """The majority path of the scratch rows[:count] into `path` (tests/drafters/reference.py's
    majority_path): at each depth the most frequent next token (ties: the smallest id) of the rows
    that follow the path so far, how many have it (scratch_counts) and of how many (scratch_members:
    the share's denominator; the first depth counts one unseen row too). Returns the path's length.
    alive[:members]: the rows that follow the path so far."""
    rows, row_lengths, scratch = state.scratch_rows, state.scratch_row_lengths, state.scratch_tally
    shares, counts, alive = state.scratch_members, state.scratch_counts, state.scratch_alive
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


@nb.njit(cache=True)
def step(state, retired, request_slots, tokens, rows, lengths, max_w, step_cost):
    """One engine step for a batch of requests. Request b is tokens[rows[b], :lengths[b]], in slot
    request_slots[b] (its prompt's length and limit set there when it started); it drafts at most
    `max_w` tokens (0: it only takes in its tokens) and never past its limit. `retired`: the
    requests that ended since the last step, (finished, finished_tokens, finished_offsets): their
    slots finished[i], their generated tokens finished_tokens[finished_offsets[i]:finished_offsets[i + 1]].
    step_cost[n]: the step's seconds when it feeds n tokens (empty: no budget).

    Phases: retire the finished requests; then per request, in order: start its slot (or start it
    again when its tokens were rewound), take in its new tokens, judge its earlier candidates (and
    refit the acceptance model), draft from each source, mark where sources agree, score the
    candidates and queue them for judgement, and write the best one; last, cut the batch's drafts
    to the step's budget. Writes request b's draft into state.out_*[b] (out_lengths[b] tokens,
    out_strategy[b] its source, -1: none) and returns the number of draft tokens kept."""
    state.counters[CALLS] += 1
    _retire(state, retired[0], retired[1], retired[2])
    batch, max_w = request_slots.shape[0], min(max_w, state.out_tokens.shape[1])
    for b in range(batch):
        s, n, values = request_slots[b], lengths[b], tokens[rows[b]]
        state.out_lengths[b], state.out_strategy[b] = 0, -1
        _start(state, s, n)
        store_bound = _take_in(state, s, values, n)
        if _judge(state, s, values, n) and state.counters[SINCE_FIT] >= state.refit_every:
            fit(
                state.weights,
                state.prior,
                state.ring_x,
                state.ring_y,
                min(state.counters[JUDGED], state.ring_y.shape[0]),
                state.prior_strength,
                state.newton_steps,
            )
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
                append_token(state, s, finished_tokens[j])
        finish_segment(state, s)


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _start(state, s, n):
    """Slot s's segment for a request of n tokens: kept while its tokens only grow. Made at its
    first step, and again when its tokens were rewound (fewer than it has taken in: the old
    segment becomes an output): as long as its generation may run (up to segment_cap), no store
    match known."""
    slots = state.slots
    if slots[s, ACTIVE] and n < slots[s, SEEN]:
        finish_segment(state, s)
    if not slots[s, ACTIVE]:
        slots[s, ACTIVE], slots[s, SEEN] = 1, 0
        slots[s, STORE_MATCH], slots[s, STORE_LO] = state.max_match, -1  # no earlier match known: no bound
        size = min(max(slots[s, LIMIT] - slots[s, PROMPT], 0) + 1, state.segment_cap)
        reserve_segment(state, s, size)


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _take_in(state, s, values, n):
    """Slot s's generated tokens since the last step into its segment and the outputs index (its
    answer is drafted from while in flight). Returns the longest store match this step can have:
    the last step's match (or the store's shortest, less one) plus the tokens since."""
    slots = state.slots
    store_bound = max(slots[s, STORE_MATCH], state.store_min_match - 1) + n - slots[s, SEEN]
    for position in range(max(slots[s, SEEN], slots[s, PROMPT]), n):
        append_token(state, s, values[position])
    slots[s, SEEN] = n
    return store_bound


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _draft_from_sources(state, s, values, n, w, store_bound):
    """Each source's candidate for the request in slot s (values[:n]): the majority path of the
    rows the source finds (scratch_paths[source], scratch_path_lengths[source] tokens, 0: none) and
    its tokens' features (scratch_features[source])."""
    match, found = context_rows(state, values, n, w)
    _take_path(state, CONTEXT, match, found, w)
    own_start = state.slots[s, START]  # the request's own segment: its own tokens are the context's
    match, found = output_rows(state, values, n, w, own_start, own_start + state.slots[s, RESERVED])
    _take_path(state, OUTPUTS, match, found, w)
    match, found = store_rows(state, s, values, n, w, store_bound)
    state.slots[s, STORE_MATCH] = match
    _take_path(state, STORE, match, found, w)


@nb.njit(cache=True, inline="always")  # (a phase of step: compiled into it)
def _take_path(state, source, match, found, w):
    """The majority path of a source's `found` rows (a `match`-token match) and its features."""
    size = majority_path(state, found, w, state.scratch_paths[source]) if found else 0
    state.scratch_path_lengths[source] = size
    if size:
        token_features(
            source, match, state.scratch_counts, state.scratch_members, size, state.logs, state.scratch_features[source]
        )


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
            probability *= sigmoid(z)
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
    state.out_strategy[b] = source


@nb.njit(cache=True)
def _budget(out_lengths, out_confidence, step_cost, calibration):
    """Cuts the batch's drafts to what pays (drafters/budget.py), each token's probability as
    calibrated by what the judged tokens of its bin did."""
    gains = calibrated_gains(out_confidence, out_lengths, calibration, np.empty_like(out_confidence))
    return allocate(gains, out_lengths.copy(), step_cost, out_lengths)
