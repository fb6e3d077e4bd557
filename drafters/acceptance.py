"""How likely a drafted token is to be accepted, learned online from what requests emit.

A drafter describes each token of a candidate draft by a feature vector x (drafters/suffix.py
says which); the model gives the probability that the token is accepted given that the tokens
before it were:

    P(accept token j | tokens < j accepted) = sigmoid(x_j . weights)

so the probability that a draft's first j tokens are all accepted is the product of the first j.
Greedy: a token is accepted when it equals the target's greedy token. Sampling with point drafts:
vLLM and our verifier accept it with probability p_target(token), which is exactly the probability
that the request emits it, so judging drafts against the emitted tokens is unbiased either way.

Learning: every judged token (feature vector, accepted or not) goes into a bounded buffer; every
`refit_every` new ones, a few Newton steps fit the weights by maximum a posteriori, a Gaussian
prior centred on the starting weights with precision `prior_strength` (about that many judged
tokens' worth of belief), so a new actor drafts sensibly from its first step and a model or corpus
unlike the prior's moves the weights within a few hundred steps. No training outside the job.
"""
from __future__ import annotations

import numpy as np


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))


class AcceptanceModel:
    def __init__(self, prior: np.ndarray, prior_strength: float = 200.0, capacity: int = 16384,
                 refit_every: int = 512, newton_steps: int = 3):
        self.prior = np.asarray(prior, dtype=np.float64)  # [F]
        self.weights = self.prior.copy()  # [F]
        self.prior_strength, self.refit_every, self.newton_steps = prior_strength, refit_every, newton_steps
        self.features = np.zeros((capacity, len(self.prior)))  # [capacity, F] ring buffer
        self.outcomes = np.zeros(capacity)  # [capacity] 1.0 accepted, 0.0 rejected
        self.seen = 0  # judged tokens so far (the buffer holds the last `capacity`)
        self.since_fit = 0

    def conditional(self, features: np.ndarray) -> np.ndarray:
        """[n]: P(token accepted | the tokens before it were), features: [n, F]."""
        return sigmoid(features @ self.weights)

    def cumulative(self, features: np.ndarray) -> np.ndarray:
        """[n]: P(the draft's first j + 1 tokens are all accepted), features: [n, F] in draft order."""
        return np.cumprod(self.conditional(features))

    def observe(self, features: np.ndarray, outcomes: np.ndarray) -> None:
        """features: [m, F] of judged tokens; outcomes: [m] whether each was accepted."""
        capacity, judged = len(self.outcomes), len(outcomes)
        slots = (self.seen + np.arange(judged)) % capacity  # [m] where each goes in the ring
        keep = slice(max(judged - capacity, 0), judged)  # more than the ring holds: the newest
        self.features[slots[keep]], self.outcomes[slots[keep]] = features[keep], np.asarray(outcomes, dtype=np.float64)[keep]
        self.seen += judged
        self.since_fit += judged
        if self.since_fit >= self.refit_every:
            self.fit()

    def fit(self) -> None:
        """Newton steps on -log posterior = Σ logloss + (λ/2)|w - prior|² over the buffer."""
        held = min(self.seen, len(self.outcomes))
        x, y = self.features[:held], self.outcomes[:held]  # [held, F], [held]
        regulariser = self.prior_strength * np.eye(len(self.weights))
        for _ in range(self.newton_steps):
            p = sigmoid(x @ self.weights)
            gradient = x.T @ (p - y) + self.prior_strength * (self.weights - self.prior)
            hessian = (x * (p * (1 - p))[:, None]).T @ x + regulariser
            self.weights = self.weights - np.linalg.solve(hessian, gradient)
        self.since_fit = 0
