"""Throughput mode: many requests, each with its own drafts, in one forward call per step.

Each step, every request in the batch drafts as it would alone (SpeculativeDecoder.draft), its
rows are merged into a draft tree (pipeline/engines/transformers/tree.py), and the B trees are fed as the rows of one
[B, N] call: row b is [last token, tree nodes, padding], with its own position ids and a mask that
shows it its own context (RaggedCache) and tree. Each request accepts its own number of tokens.
When a request finishes, the next request takes its row at once (continuous batching).

The cost of a [B, N] call comes from the decoder's one step cost, c(n) of the n tokens a call feeds
(drafters/budget.py, learned from these calls). With k/w auto, each step picks the draft shape (K
rows of w tokens per request, at most max_batch_tokens fed in all) that maximises the batch's
expected tokens per call / relative call cost, so on compute-bound hardware the budget goes to
requests rather than drafts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import torch

from drafters.budget import choose_shape, relative_cost
from drafters.base import Drafts
from pipeline.engines.base import Failed, Request, Result
from pipeline.engines.errors import RequestError
from pipeline.engines.transformers.speculative_decoder import (
    SpeculativeDecoder,
    no_drafts,
    select_rows,
)
from pipeline.engines.transformers.kv_cache import prefill_many
from pipeline.engines.transformers.ragged_cache import RaggedCache
from pipeline.engines.transformers.request_state import RequestState
from pipeline.engines.transformers.tree import DraftTree, build_tree, tree_visibility
from pipeline.engines.transformers.verification import verify

# Joiners are prefilled together in padded calls of at most this many tokens (rows x longest).
PREFILL_TOKENS = 8192


def prefill_groups(joiners: list[RequestState]) -> list[list[RequestState]]:
    """Consecutive groups whose padded prefill (rows x longest prompt) stays within PREFILL_TOKENS."""
    groups, group, longest = [], [], 0
    for joiner in joiners:
        longer = max(longest, len(joiner.request.prompt_ids))
        if group and (len(group) + 1) * longer > PREFILL_TOKENS:
            groups.append(group)
            group, longer = [], len(joiner.request.prompt_ids)
        group.append(joiner)
        longest = longer
    return groups + [group] if group else groups


class BatchedDecoder:
    def __init__(self, decoder: SpeculativeDecoder, max_batch_requests: int, max_batch_tokens: int = 0):
        assert max_batch_requests >= 1
        self.decoder = decoder
        self.model = decoder.model
        self.rules = decoder.rules
        self.max_batch_requests = max_batch_requests
        # Cap on tokens fed per call (B x N); 0: no cap beyond B x (k*w + 1).
        self.max_batch_tokens = max_batch_tokens

    @torch.no_grad()
    def generate_many(self, requests: Iterable[Request]) -> Iterator[tuple[Request, Result | Failed]]:
        """Yields (request, its result) as each request finishes (not in input order)."""
        queue = iter(requests)
        cache = RaggedCache(self.model)
        slots: list[RequestState | None] = []
        while True:
            free = [row for row in range(self.max_batch_requests) if row >= len(slots) or slots[row] is None]
            joiners = yield from self.take(queue, len(free))
            self.prefill(joiners, cache, free)
            for row, state in zip(free, joiners):
                if row < len(slots):
                    slots[row] = state
                else:
                    slots.append(state)
            active = [row for row, state in enumerate(slots) if state is not None]
            if not active:
                return
            if len(active) < len(slots):  # no request left to take a free row: drop it
                cache.select_rows(active)
                slots = [slots[row] for row in active]
            self.step(slots, cache)
            for row, state in enumerate(slots):
                if state.finish_reason is not None:
                    yield state.request, state.result()
                    slots[row] = None
                    cache.valid[row] = False
            cache.compact()

    def take(self, queue: Iterator[Request], count: int):
        """Up to `count` next requests started (yielding a Failed for each that cannot be)."""
        taken = []
        while len(taken) < count:
            request = next(queue, None)
            if request is None:
                break
            try:
                state = RequestState.start(request, self.rules)
            except RequestError as error:
                yield request, Failed(request.request_id, str(error))
                continue
            if state.finish_reason is not None:  # nothing to generate
                yield request, state.result()
                continue
            taken.append(state)
        return taken

    def prefill(self, joiners: list[RequestState], cache: RaggedCache, rows: list[int]) -> None:
        """Puts the joiners in `rows` (in order), prefilled together (like the single-request decoder,
        the cache holds all but each prompt's last token)."""
        rows = iter(rows)
        for group in prefill_groups(joiners):
            prefix = prefill_many(self.model, [list(state.request.prompt_ids[:-1]) for state in group])
            for source_row, state in enumerate(group):
                cache.put(next(rows), prefix, len(state.request.prompt_ids) - 1, source_row)

    def step(self, slots: list[RequestState], cache: RaggedCache) -> None:
        started = time.perf_counter()
        chosen = self.allocate(slots, [self.decoder.draft(state) for state in slots])
        trees = [build_tree(drafts.tokens) for drafts in chosen]
        verify_started = time.perf_counter()
        logits, width = self.forward(slots, trees, cache)  # [B, N, V]
        if self.rules.costs is not None:
            self.rules.costs.observe(len(slots) * width, time.perf_counter() - verify_started)
        kept = []
        share = 1 / len(slots)  # the call (and its time) is shared by the requests it served
        for row, (state, drafts, tree) in enumerate(zip(slots, chosen, trees)):
            verdict = verify(tree, logits[row, : len(tree.tokens) + 1], state.request.sampling, state.uniforms(tree.w))
            kept.append([0] + [node + 1 for node in verdict.path])
            state.accept(
                verdict,
                drafts,
                len(tree.tokens) + 1,
                (verify_started - started) * share,
                (time.perf_counter() - verify_started) * share,
                share,
            )
        cache.keep_new(kept, width)

    def forward(
        self, slots: list[RequestState], trees: list[DraftTree], cache: RaggedCache
    ) -> tuple[torch.Tensor, int]:
        """One call over every request's [last token, tree nodes], padded to the widest."""
        width = 1 + max(len(tree.tokens) for tree in trees)
        input_ids = torch.zeros(len(slots), width, dtype=torch.long)  # [B, N]; padding feeds token 0
        position_ids = torch.zeros(len(slots), width, dtype=torch.long)  # [B, N]
        visible = torch.eye(width, dtype=torch.bool).repeat(len(slots), 1, 1)  # [B, N, N]; padding sees itself
        for row, (state, tree) in enumerate(zip(slots, trees)):
            n = len(tree.tokens) + 1
            input_ids[row, :n] = torch.tensor([state.context.tokens[-1]] + tree.tokens)
            position_ids[row] = len(state.context) - 1
            position_ids[row, 1:n] += torch.tensor(tree.depths, dtype=torch.long)
            visible[row, :n, :n] = tree_visibility(tree)
        device = self.model.device
        mask = cache.attention_mask(visible, self.model.dtype)  # [B, 1, N, L+N]
        logits = self.model(
            input_ids=input_ids.to(device),
            position_ids=position_ids.to(device),
            attention_mask=mask.to(device),
            past_key_values=cache.cache,
            use_cache=True,
        ).logits
        return logits, width

    def allocate(self, slots: list[RequestState], proposals: list[Drafts]) -> list[Drafts]:
        """The rows each request verifies this step: its best rows cut to w tokens, for the one
        shape (k rows of w tokens per request) choose_shape finds fastest for the [B, 1 + k*w]
        call (k/w auto), or its proposal as is; either way within max_batch_tokens."""
        max_fed = self.max_batch_tokens // len(slots) - 1 if self.max_batch_tokens else None  # nodes per request
        if self.rules.costs is None:
            if max_fed is None:
                return proposals
            return [
                select_rows(drafts, range(drafts.tokens.shape[0]), min(drafts.tokens.shape[1], max_fed), max_fed)
                for drafts in proposals
            ]
        ranked = [
            None if drafts.tokens.shape[1] == 0 else state.controller.expected_tokens(drafts)
            for state, drafts in zip(slots, proposals)
        ]  # (order [k_b], table [k_b, w_b])
        step, requests = self.rules.costs.cost(), len(slots)
        shape = choose_shape(
            [None if r is None else r[1] for r in ranked],
            lambda k, w: relative_cost(step, requests * (1 + k * w), requests),
            self.rules.k,
            self.rules.w,
            self.decoder.auto_k,
            self.decoder.auto_w,
            max_fed,
        )
        return [
            no_drafts()
            if r is None or shape.w == 0
            else select_rows(drafts, r[0][: shape.k], shape.w, shape.k * shape.w)
            for drafts, r in zip(proposals, ranked)
        ]
