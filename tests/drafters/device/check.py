"""The device drafter held to its reference inside a decode loop (jobs.benchmark speculators
--check-reference, and the V2 speculator's tests): every step's drafts, confidences and learned rates."""

from __future__ import annotations

import numpy as np

from tests.drafters.device import reference


class ReferenceCheck:
    def __init__(self):
        self.compared = 0  # request-steps whose drafts were held to the reference

    def before(self, drafter) -> reference.State:
        return reference.State.of(drafter)

    def check(self, state, req_states, idx, num_sampled, num_rejected, drafts, drafter) -> None:
        want, confidence, sources, lengths = reference.step(
            state,
            req_states.all_token_ids.gpu.numpy(),
            req_states.total_len.gpu.numpy(),
            req_states.prompt_len.gpu.numpy(),
            idx.numpy(),
            num_sampled.numpy(),
            num_rejected.numpy(),
            drafter.k,
            drafter.settings.max_depth,
            drafter.settings.min_confidence,
        )
        np.testing.assert_array_equal(drafts, want, err_msg=f"after {self.compared} request-steps")
        np.testing.assert_allclose(drafter.confidence[: len(want)].numpy(), confidence, rtol=1e-6)
        np.testing.assert_array_equal(drafter.stats.numpy(), state.stats)
        self.compared += len(want)
