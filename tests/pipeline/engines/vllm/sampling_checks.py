"""The checks of the vLLM sampling tests, on any model: every token a request emitted, given the
tokens before it, is a draw from the target's distribution at that position (jobs/benchmark/
sampling.py computes the evidence: the tokens' randomised probability integral transforms, all and
after a rejected draft, and the text's log-likelihood against its exact expectation)."""

from __future__ import annotations

from lab.sampling import Evidence, gather, uniformity_p_value
from pipeline.engines.base import Failed, Request, Result

# Seeds are fixed, so each test is deterministic: an exact engine fails it for 1 in 10,000 choices of seeds.
P_VALUE = 1e-4


def generate_tracking(engine, requests: list[Request]) -> tuple[list[Result], dict]:
    """The results, and the drafts our proposer made for each request (Proposal lists), by request id."""
    proposals, result = {}, engine.result

    def keep(request, output, tracked, wall, params):
        proposals[request.request_id] = tracked.proposals if tracked is not None else []
        return result(request, output, tracked, wall, params)

    engine.result = keep
    try:
        results = engine.generate(requests)
    finally:
        del engine.result
    assert all(isinstance(r, Result) for r in results), [r for r in results if isinstance(r, Failed)]
    return results, proposals


def assert_exact(
    model,
    requests: list[Request],
    results: list[Result],
    proposals: dict,
    min_checked: int,
    min_accepted: int,
    min_rejected: int = 0,
) -> Evidence:
    """Fails unless the results are the target's draws, with at least the given numbers of draft
    tokens checked and accepted, and of rejected drafts (ours) to test."""
    checked = sum(r.stats.num_checked_draft_tokens for r in results)
    accepted = sum(j * n for r in results for j, n in enumerate(r.stats.accepted_length_histogram))
    assert checked >= min_checked and accepted >= min_accepted, (
        f"too few drafts to test speculation ({checked} checked, {accepted} accepted)"
    )
    evidence = gather(model, requests, [r.token_ids for r in results], proposals)
    n = len(evidence.all_tokens)
    # transformers' logits differ from vLLM's in the last bits: a token at the top-p edge may flip.
    assert evidence.impossible <= max(1, n // 500), f"{evidence.impossible} tokens the target gives no mass"
    p_all = uniformity_p_value(evidence.all_tokens)
    assert p_all > P_VALUE, f"emitted tokens are not the target's draws: p = {p_all:.2e}"
    assert abs(evidence.z) < 4, (
        f"log-likelihood off the target's: {evidence.nll / n:.3f} nats per token, expected "
        f"{evidence.nll_expected / n:.3f} (z = {evidence.z:.1f})"
    )
    assert len(evidence.after_rejection) >= min_rejected, len(evidence.after_rejection)
    if evidence.after_rejection:
        p_rejected = uniformity_p_value(evidence.after_rejection)
        assert p_rejected > P_VALUE, f"tokens after a rejected draft are not the residual's draws: p = {p_rejected:.2e}"
    return evidence
