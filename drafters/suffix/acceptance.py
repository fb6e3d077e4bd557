"""The acceptance model, compiled: how likely a drafted token is to be accepted given that the
tokens before it were, learned online from what requests emit.

    P(accept token j | tokens < j accepted) = sigmoid(x_j . weights)

x_j are the token's FEATURES: its share of the continuations that reached it (as log odds), the
match length, its depth, the match it extends if the tokens before it hold, how many
continuations have it, its source, whether it is the draft's first token, whether another source
drafts the same prefix, and whether it is the model bigram's top choice (0 here: this drafter has
no bigram table). Greedy, a token is accepted when it equals the target's greedy token; sampling
with point drafts, with probability p_target(token), the probability that the request emits it:
judging drafts against the emitted tokens is unbiased either way.

Learning: every judged token goes into a bounded ring; every refit_every new ones, Newton steps
fit the weights by maximum a posteriori, a Gaussian prior centred on PRIOR with precision
prior_strength (about that many judged tokens' worth of belief), so an actor drafts sensibly from
its first step and a model or corpus unlike the prior's moves the weights within a few hundred
steps. (tests/drafters/reference.py states the model and its fit in plain numpy.)
"""

from __future__ import annotations

import math
from collections import namedtuple

import numba as nb
import numpy as np

SOURCES = ("context", "outputs", "store")
FEATURES = (
    "bias",
    "log_odds_share",
    "log_match",
    "log_depth",
    "log_reach",
    "log_count",
    "from_context",
    "from_outputs",
    "from_store",
    "first",
    "agreed",
    "bigram_top1",
)
# Fitted by maximum likelihood on SmolLM2-135M-Instruct's greedy outputs for HumanEval, GSM8K and
# ShareGPT prompts (B = 1, every candidate judged: 65k tokens), rounded; the store's weight is set to
# the outputs' (the same kind of evidence: other requests' answers).
PRIOR = np.array([-1.85, 0.27, -0.25, -0.41, 1.47, 0.35, -0.41, -1.44, -1.44, 0.85, 1.48, 0.92])
NUM_FEATURES = len(FEATURES)
# Feature columns by name: FEATURE.log_match is its column. A candidate's feature rows carry two
# more columns: GIVEN, the probability the model gave the token, and CHOSEN, 1 where the candidate
# was the request's draft (the calibration learns from those only: the best of a step's candidates
# is accepted more often than others given the same probability).
FEATURE = namedtuple("Feature", FEATURES)(*range(NUM_FEATURES))
GIVEN, CHOSEN = NUM_FEATURES, NUM_FEATURES + 1
CANDIDATE_COLUMNS = NUM_FEATURES + 2
LOGIT_CLIP = math.log((1 - 1e-3) / 1e-3)  # a share is clipped to [1e-3, 1 - 1e-3] before its log odds


def log_table(size: int) -> np.ndarray:
    """[size] log(k) (log 0 unused)."""
    return np.log(np.maximum(np.arange(size, dtype=np.float64), 1.0))


@nb.njit(cache=True)
def token_features(source, match, counts, members, size, logs, out):
    """The features of one path's tokens (tests/drafters/reference.py's token_features); logs[k] = log(k) (the shares
    are counts
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
def sigmoid(z):
    return 1.0 / (1.0 + math.exp(-min(max(z, -30.0), 30.0)))


@nb.njit(cache=True)
def solve(matrix, vector):
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
def fit(weights, prior, ring_x, ring_y, held, prior_strength, newton_steps):
    """The acceptance model's fit (tests/drafters/reference.py's AcceptanceModel.fit states it in
    Python): Newton steps on the logistic loss plus (λ/2)|w - prior|²."""
    features = weights.shape[0]
    for _ in range(newton_steps):
        gradient = prior_strength * (weights - prior)
        hessian = prior_strength * np.eye(features)
        for i in range(held):
            z = 0.0
            for k in range(features):
                z += ring_x[i, k] * weights[k]
            p = sigmoid(z)
            for k in range(features):
                gradient[k] += ring_x[i, k] * (p - ring_y[i])
                for m in range(features):
                    hessian[k, m] += ring_x[i, k] * ring_x[i, m] * p * (1 - p)
        weights -= solve(hessian, gradient)
