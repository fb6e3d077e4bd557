"""The draft budget: how many of a step's draft tokens to feed the model, from what a step costs
and how likely each token is to be accepted. One allocator and one family of step costs, used by
every drafter under vLLM (the batched suffix drafter's compiled step, and drafters/per_request.py
for the others) and the replay's projection.

`allocate`: a step that feeds n tokens (one per running request plus their drafts) takes c(n)
seconds and emits B + Σ P tokens in expectation (P a kept draft token's probability that it and
the draft before it are accepted). Draft tokens are taken most likely first while one more raises
the expected tokens per second: P > T (c(n + 1) - c(n)) / c(n), T and n the totals so far. A
request's probabilities never rise along its draft, so each kept draft is a prefix and taking the
largest first is optimal for a linear c (and a fair rule for a convex one). `calibrated`: a
drafter's probability as the judged tokens of its depth and bin bore it out.

The step cost, c(n) as `seconds(n)`: `LinearStepCost`, c(n) = a + b n, fitted online from the
engine's own steps (`StepCostFit`: the one step-cost model, vLLM's proposer's and the transformers
engine's), so only the tokens likely enough to pay for what they cost are fed. (The benchmark's
projections give the allocator GPU step costs of the same form: jobs/benchmark/step_costs.py.)

`choose_shape`: the same rule for an engine that verifies one draft shape per call (the
transformers engine: k rows of w tokens per request), the shape of the most expected tokens per
unit of c(n).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

# calibrated(): judged draft tokens, binned by their depth in the draft (1 .. CALIBRATION_DEPTHS - 1,
# then the rest together) and by the probability the drafter gave them; a bin's rate is shrunk
# towards the drafter's own probability by CALIBRATION_PRIOR tokens. (By depth: a drafter's model
# that under-predicts first tokens may over-predict deep ones, and one table by probability alone
# averages the two away.)
CALIBRATION_DEPTHS, CALIBRATION_BINS, CALIBRATION_PRIOR = 8, 20, 20.0


@dataclass(frozen=True)
class LinearStepCost:
    a: float  # seconds of a step whatever it feeds
    b: float  # seconds per token fed

    def seconds(self, fed: np.ndarray) -> np.ndarray:
        return self.a + self.b * np.asarray(fed, dtype=np.float64)


class StepCostFit:
    """Seconds of one engine step as a + b n, n the tokens it fed the model (one per running
    request plus their drafts), fitted by least squares over the recent steps (weights decay by
    `memory` per step). Little variation in n leaves b at its prior: `prior_slope` of a mean step
    per token, so drafting is tried again after a stretch without drafts; b never falls below it."""

    def __init__(self, memory: float = 0.97, prior_slope: float = 0.02, prior_weight: float = 4.0):
        self.memory = memory
        self.prior_slope = prior_slope
        self.prior_weight = prior_weight
        self.sums = np.zeros(5)  # weighted count, Σn, Σt, Σn², Σnt

    def observe(self, tokens: int, seconds: float) -> None:
        self.sums = self.memory * self.sums + np.array([1.0, tokens, seconds, tokens * tokens, tokens * seconds])

    def cost(self) -> LinearStepCost:
        """A step feeding n tokens costs about a + b n seconds."""
        weight, sum_n, sum_t, sum_nn, sum_nt = self.sums
        if weight < 1:
            return LinearStepCost(1.0, self.prior_slope)  # nothing seen yet: only the ratio b / (a + b n) matters
        mean_n, mean_t = sum_n / weight, sum_t / weight
        variance, covariance = sum_nn / weight - mean_n**2, sum_nt / weight - mean_n * mean_t
        prior = self.prior_slope * mean_t
        # Never below the prior: a token fed is never free, and a noisy fit near 0 would draft everything.
        slope = max(prior, (weight * covariance + self.prior_weight * prior) / (weight * variance + self.prior_weight))
        return LinearStepCost(max(mean_t - slope * mean_n, 1e-6), slope)


class DraftingPays:
    """Whether running the drafter at all pays, step after step: what a step's drafts were worth
    (their expected accepted tokens, each worth a plain step's seconds per request, less what the
    extra tokens fed cost) against the drafter's own seconds, as a moving average. The budget cuts
    tokens that do not pay for themselves; this cuts the drafting when even its kept tokens do not
    pay for the drafter's time (at 256 requests on a GPU, where the step keeps few tokens and the
    drafter's time is the step's too). While it does not pay, one step in `probe` drafts anyway, to
    keep the estimate current."""

    def __init__(self, decay: float = 0.8, probe: int = 16):
        self.decay = decay
        self.probe = probe
        self.net = 0.0  # seconds a drafting step gained, on average (>= 0 at first: draft)
        self.skipped = 0

    def drafting(self) -> bool:
        if self.net >= 0 or self.skipped + 1 >= self.probe:
            self.skipped = 0
            return True
        self.skipped += 1
        return False

    def observe(
        self, expected_accepted: float, fed_drafts: int, batch: int, step_cost: np.ndarray, drafter_seconds: float
    ) -> None:
        plain = float(step_cost[batch])
        gained = expected_accepted * plain / batch - (float(step_cost[batch + fed_drafts]) - plain) - drafter_seconds
        self.net = self.decay * self.net + (1 - self.decay) * gained


def cost_table(cost, batch: int, max_w: int) -> np.ndarray:
    """[batch (max_w + 1) + 1]: cost.seconds(n) for every n a step of `batch` requests can feed."""
    return cost.seconds(np.arange(batch * (max_w + 1) + 1))


def empty_calibration() -> np.ndarray:
    """[2, CALIBRATION_DEPTHS, CALIBRATION_BINS]: per depth and bin, the judged draft tokens held
    to that token (0) and judged (1); none yet."""
    return np.zeros((2, CALIBRATION_DEPTHS, CALIBRATION_BINS))


@nb.njit(cache=True)
def calibration_bin(probability):
    return min(int(probability * CALIBRATION_BINS), CALIBRATION_BINS - 1)


@nb.njit(cache=True)
def calibration_depth(j):
    """The depth row of a draft's token j (0-based)."""
    return min(j, CALIBRATION_DEPTHS - 1)


@nb.njit(cache=True)
def calibrated(probability, j, calibration):
    """The drafter's `probability` that a draft's first j + 1 tokens are accepted, as the judged
    tokens of its depth and bin bore it out: calibration[0, depth, bin] of them held,
    calibration[1, depth, bin] judged, shrunk towards the drafter's own probability by
    CALIBRATION_PRIOR tokens."""
    depth, index = calibration_depth(j), calibration_bin(probability)
    return (calibration[0, depth, index] + CALIBRATION_PRIOR * probability) / (
        calibration[1, depth, index] + CALIBRATION_PRIOR
    )


@nb.njit(cache=True)
def calibrated_gains(confidence, lengths, calibration, gains):
    """gains[b, j] for j < lengths[b]: request b's draft tokens' probabilities (confidence[b, j],
    that the draft's first j + 1 tokens are accepted) as calibrated, never above the token's before."""
    for b in range(lengths.shape[0]):
        gain = 1.0
        for j in range(lengths[b]):
            gain = min(gain, calibrated(confidence[b, j], j, calibration))
            gains[b, j] = gain
    return gains


@nb.njit(cache=True)
def allocate(gains, lengths, step_cost, taken):
    """Draft tokens per request for one step (see the module's docstring). gains[b, j]: the
    probability that request b's first j + 1 draft tokens are all accepted (non-increasing in j),
    for j < lengths[b]; step_cost[n]: the step's seconds when it feeds n tokens, for n up to its
    length - 1 (no step feeds more). Writes each request's kept tokens into taken; returns their sum."""
    batch = lengths.shape[0]
    total = lengths.sum()
    flat = np.empty(total)
    owners = np.empty(total, np.int64)
    i = 0
    for b in range(batch):
        taken[b] = 0
        for j in range(lengths[b]):
            flat[i], owners[i] = gains[b, j], b
            i += 1
    order = np.argsort(-flat, kind="mergesort")  # a request's gains in their order: each cut keeps a prefix
    expected, fed = float(batch), batch
    for i in order:
        if fed + 1 >= step_cost.shape[0]:
            break
        if flat[i] * step_cost[fed] <= expected * (step_cost[fed + 1] - step_cost[fed]):
            break
        taken[owners[i]] += 1
        expected += flat[i]
        fed += 1
    return fed - batch


def relative_cost(cost: LinearStepCost, fed: float, plain: float) -> float:
    """A step feeding `fed` tokens against one feeding `plain` (one per request), by `cost`."""
    return float(cost.seconds(fed) / cost.seconds(plain))


@dataclass(frozen=True)
class Shape:
    k: int  # draft rows each request verifies (0 with w 0: a plain step)
    w: int  # tokens per row
    expected_tokens: float  # per call, summed over the requests
    relative_cost: float  # of the call, against a plain one


def choose_shape(
    tables: list[np.ndarray | None],
    call_cost,
    max_k: int,
    max_w: int,
    auto_k: bool = True,
    auto_w: bool = True,
    max_fed: int | None = None,
) -> Shape:
    """The one draft shape every request of a call verifies (k rows of w tokens each) that maximises
    expected tokens per unit cost: the budget of an engine that verifies one shape per call (the
    transformers engine's decoders: one request alone, or the requests of a batched call), where
    `allocate` is the budget of one that verifies each request's own length (vLLM).
    tables: per request, [k_b, w_b] expected tokens per call of verifying its first k rows cut to
    w tokens (expected_tokens), or None when it proposed nothing (one token);
    call_cost(k, w): the call's cost relative to a plain one (w 0: no drafts; relative_cost);
    max_fed: a cap on k x w per request. A dimension that is not auto stays at its maximum;
    a plain step is always a candidate."""
    best = Shape(0, 0, float(len(tables)), call_cost(1, 0))
    for k in range(1 if auto_k else max_k, max_k + 1):
        for w in range(1 if auto_w else max_w, max_w + 1):
            if max_fed is not None and k * w > max_fed:
                continue
            tokens = sum(
                1.0 if table is None else float(table[min(k, table.shape[0]) - 1, min(w, table.shape[1]) - 1])
                for table in tables
            )
            cost = call_cost(k, w)
            if tokens / cost > best.expected_tokens / best.relative_cost:
                best = Shape(k, w, tokens, cost)
    return best
