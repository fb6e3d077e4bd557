"""A seed is a text on the vLLM engine: a sampled request's t-th token is drawn with noise keyed by
(its seed, t) alone (drafters/primitives/keyed_noise.py), with or without drafts.

Plain sampling draws y_t = argmax_v (l_t(v) + G_{t,v}), l_t the temperature-scaled logits after
top-k and top-p, G the keyed Gumbel noise. Verification draws the very same y_t at each draft
position and accepts the draft token x_t iff x_t = y_t; at the first mismatch it emits y_t, and
after a fully accepted draft it emits the bonus y. Since y_t ~ p_t, a draft token is accepted with
probability p_t(x_t), and a rejected one is replaced by y_t given y_t != x_t, which is p_t without
x_t renormalised: the acceptance and replacement of speculative sampling (Leviathan et al. 2023,
Chen et al. 2023) for a draft that is a point, as every drafter of ours proposes. And the emitted
tokens are y_1, y_2, ... whatever the drafts: the text of plain sampling with that seed, for any
drafter, batch, step timing or restart (up to the float rounding of the logits between batch shapes,
as for greedy decoding).

Installed per engine on each of its workers (compat.py's `install_keyed_draws`, through
LLM.collective_rpc; REACHES: keyed_draws). This module holds what runs in vLLM's place and imports
nothing of vLLM's:
- the model runner's `_sample` sets, for its step, each request's key per position: its
  SamplingParams seed (requests without one draw a fresh random key per step, as unseeded plain
  sampling does), at position num_tokens_no_spec - num_prompt_tokens (the generated tokens so far;
  a draft's j-th token one further each; the bonus after the last draft token) (`keyed_sample`);
- the sampler's top-k/top-p draw (`TopKTopPSampler.forward`) draws with those keys (vLLM's own
  apply_top_k_top_p first, its processed log probabilities as before) (`keyed_top_k_top_p`);
- vLLM's `rejection_sample` (module function, replaced once per process) verifies as above where
  a step has keys and the draft has no probabilities; a draft with probabilities (a draft model:
  not ours) and synthetic acceptance keep vLLM's rule (`keyed_rejection_sample`).
Greedy rows are untouched: their targets are the argmax, as in vLLM's greedy kernel. The draw itself
(`draw(logits [N, V], keys [N]) -> [N]`) is handed in: drafters/primitives/keyed_noise.py's
gumbel_argmax, with vLLM's fused CPU kernel where the process has it (compat.keyed_draw).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from collections.abc import Callable

import numpy as np
import torch

from drafters.primitives.keyed_noise import position_keys

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: no token at that output slot
_step = threading.local()  # the keys of the step running on this thread (the engine's)
Draw = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits [N, V], keys [N]) -> tokens [N]


@dataclass(frozen=True)
class StepKeys:
    sample: torch.Tensor  # [num_reqs] the key of each request's sampler row (plain or bonus token)
    drafts: torch.Tensor  # [num_draft_tokens] the key of each draft position, flat in request order


def request_seeds(runner, num_reqs: int) -> torch.Tensor:
    """[num_reqs] int64: each request's seed, a fresh random one where it has none."""
    seeds = torch.randint(-(2**63), 2**63 - 1, (num_reqs,), dtype=torch.int64)
    for index, req_id in enumerate(runner.input_batch.req_ids[:num_reqs]):
        params = runner.requests[req_id].sampling_params
        if params is not None and params.seed is not None:
            seeds[index] = params.seed
    return seeds


def step_keys(runner, num_draft_tokens: list[int] | None) -> StepKeys:
    """The keys of the step about to be sampled, from the runner's persistent batch."""
    batch = runner.input_batch
    num_reqs = batch.num_reqs
    seeds = request_seeds(runner, num_reqs)
    generated = torch.from_numpy(
        (batch.num_tokens_no_spec[:num_reqs] - batch.num_prompt_tokens[:num_reqs]).astype(np.int64)
    )
    drafts = torch.tensor(num_draft_tokens if num_draft_tokens is not None else [0] * num_reqs, dtype=torch.int64)
    draft_seeds = seeds.repeat_interleave(drafts)
    starts = torch.cumsum(drafts, 0) - drafts
    draft_positions = (
        generated.repeat_interleave(drafts)
        + torch.arange(len(draft_seeds), dtype=torch.int64)
        - starts.repeat_interleave(drafts)
    )
    device = runner.device
    return StepKeys(
        position_keys(seeds, generated + drafts).to(device), position_keys(draft_seeds, draft_positions).to(device)
    )


def keyed_sample(sample):
    """The model runner's `_sample`, with this step's keys set while it runs."""

    def wrapped(self, logits, spec_decode_metadata):
        if self.input_batch.sampling_metadata.all_greedy:
            return sample(logits, spec_decode_metadata)
        drafts = None if spec_decode_metadata is None else spec_decode_metadata.num_draft_tokens
        _step.keys = step_keys(self, drafts)
        try:
            return sample(logits, spec_decode_metadata)
        finally:
            _step.keys = None

    return wrapped


def keyed_top_k_top_p(sampler, original_forward, apply_top_k_top_p, draw: Draw):
    """TopKTopPSampler.forward drawing with the step's keys (vLLM's own draw outside a keyed step);
    apply_top_k_top_p: vLLM's filter, as its sampler applies it."""

    def forward(logits, generators, k, p):
        keys = getattr(_step, "keys", None)
        if keys is None or logits.shape[0] != keys.sample.shape[0]:
            return original_forward(logits, generators, k, p)
        logits = apply_top_k_top_p(logits, k, p)
        processed = None
        if sampler.logprobs_mode == "processed_logits":
            processed = logits
        elif sampler.logprobs_mode == "processed_logprobs":
            processed = logits.log_softmax(dim=-1, dtype=torch.float32)
        return draw(logits, keys.sample), processed

    return forward


def accept_matching(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    max_spec_len: int,
    targets: torch.Tensor,
    bonus_token_ids: torch.Tensor,
) -> torch.Tensor:
    """The verdict: each request keeps its draft tokens while they equal the targets, then emits
    the target at the first mismatch, or the bonus after a fully accepted draft.
    draft_token_ids, targets: [num_draft_tokens] flat in request order; bonus_token_ids: [B, 1].
    Returns [B, max_spec_len + 1] int32, PLACEHOLDER after each request's last token."""
    device = targets.device
    counts = torch.tensor(num_draft_tokens, dtype=torch.int64, device=device)
    batch, width = len(num_draft_tokens), max_spec_len + 1  # a last slot for the bonus
    slots = torch.arange(width, device=device).expand(batch, width)
    valid = slots < counts.unsqueeze(1)
    drafts = torch.full((batch, width), PLACEHOLDER, dtype=torch.int64, device=device)
    chosen = drafts.clone()
    drafts[valid], chosen[valid] = draft_token_ids.to(torch.int64), targets.to(torch.int64)
    accepted = ((drafts == chosen) & valid).to(torch.int64).cumprod(dim=1).sum(dim=1, keepdim=True)  # [B, 1]
    out = torch.where(slots < accepted, drafts, PLACEHOLDER)
    last = torch.where(
        accepted < counts.unsqueeze(1), chosen.gather(1, accepted), bonus_token_ids.view(-1, 1).to(torch.int64)
    )
    out.scatter_(1, accepted, last)
    return out.to(torch.int32)


def keyed_rejection_sample(original, draw: Draw):
    """vLLM's `rejection_sample`, verifying against the keyed draws within a keyed step."""
    if getattr(original, "keyed", False):
        return original

    def rejection_sample(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        target_logits,
        bonus_token_ids,
        sampling_metadata,
        synthetic_mode=False,
        **kwargs,
    ):
        keys = getattr(_step, "keys", None)
        if (
            keys is None
            or draft_probs is not None
            or synthetic_mode
            or sampling_metadata.all_greedy
            or keys.drafts.shape[0] != target_logits.shape[0]
        ):
            return original(
                draft_token_ids,
                num_draft_tokens,
                max_spec_len,
                cu_num_draft_tokens,
                draft_probs,
                target_logits,
                bonus_token_ids,
                sampling_metadata,
                synthetic_mode=synthetic_mode,
                **kwargs,
            )
        targets = target_logits.argmax(dim=-1)
        counts = torch.tensor(num_draft_tokens, device=target_logits.device)
        sampled = (sampling_metadata.temperature != 0).repeat_interleave(counts, output_size=targets.shape[0])
        targets[sampled] = draw(target_logits[sampled], keys.drafts[sampled])
        return accept_matching(draft_token_ids, num_draft_tokens, max_spec_len, targets, bonus_token_ids)

    rejection_sample.keyed = True
    return rejection_sample
