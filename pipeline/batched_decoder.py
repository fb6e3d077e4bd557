"""Throughput mode: many requests, each with its own drafts, in one forward call per step.

Each step, every request in the batch drafts as it would alone (SpeculativeDecoder.draft), its
rows are merged into a draft tree (pipeline/tree.py), and the B trees are fed as the rows of one
[B, N] call: row b is [last token, tree nodes, padding], with its own position ids and a mask that
shows it its own context (RaggedCache) and tree. Each request accepts its own number of tokens.
When a request finishes, the next request takes its row at once (continuous batching).

The cost of a [B, N] call comes from the same cost model as a [k, w+1] block (rows x tokens). With
k/w auto, each step picks the draft shape (K rows of w tokens per request, at most
max_batch_tokens fed in all) that maximises the batch's expected tokens per call / relative call
cost, so on compute-bound hardware the budget goes to requests rather than drafts.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np
import torch

from drafters.base import DraftContext, Drafts
from pipeline.adaptive import AdaptiveController, judge_proposals
from pipeline.decoder import SpeculativeDecoder, no_drafts, select_rows
from pipeline.engines.base import Failed, Request, RequestError, Result, budget
from pipeline.kv_cache import prefill_many
from pipeline.ragged_cache import RaggedCache
from pipeline.sampling import GREEDY, RandomState, SamplingParams, target_probs
from pipeline.stats import RequestStats
from pipeline.tree import DraftTree, build_tree, tree_visibility, verify_tree_greedy, verify_tree_sampled


# Joiners are prefilled together in padded calls of at most this many tokens (rows x longest).
PREFILL_TOKENS = 8192


@dataclass
class Slot:
    """A request being generated in one row of the batch."""
    request: Request
    budget: int  # tokens it may generate
    context: DraftContext
    random: RandomState | None
    stats: RequestStats
    controller: AdaptiveController | None
    started: float
    generated: list[int] = field(default_factory=list)
    pending: list[tuple[int, Drafts]] = field(default_factory=list)  # proposals to judge (adaptive)
    finish_reason: str | None = None


def prefill_groups(joiners: list[tuple[Request, int]]) -> list[list[tuple[Request, int]]]:
    """Consecutive groups whose padded prefill (rows x longest prompt) stays within PREFILL_TOKENS."""
    groups, group, longest = [], [], 0
    for joiner in joiners:
        longer = max(longest, len(joiner[0].prompt_ids))
        if group and (len(group) + 1) * longer > PREFILL_TOKENS:
            groups.append(group)
            group, longer = [], len(joiner[0].prompt_ids)
        group.append(joiner)
        longest = longer
    return groups + [group] if group else groups


class BatchedDecoder:
    def __init__(self, decoder: SpeculativeDecoder, max_batch_requests: int, max_batch_tokens: int = 0):
        assert max_batch_requests >= 1
        self.decoder, self.model = decoder, decoder.model
        self.max_batch_requests = max_batch_requests
        # Cap on tokens fed per call (B x N); 0: no cap beyond B x (k*w + 1).
        self.max_batch_tokens = max_batch_tokens
        self.adaptive = decoder.costs is not None

    @torch.no_grad()
    def generate_many(self, requests: Iterable[Request]) -> Iterator[tuple[Request, Result | Failed]]:
        """Yields (request, its result) as each request finishes (not in input order)."""
        queue = iter(requests)
        cache = RaggedCache(self.model)
        slots: list[Slot | None] = []
        while True:
            free = [row for row in range(self.max_batch_requests) if row >= len(slots) or slots[row] is None]
            joiners = yield from self.take(queue, len(free))
            for row, slot in zip(free, self.start(joiners, cache, free)):
                if row < len(slots):
                    slots[row] = slot
                else:
                    slots.append(slot)
            active = [row for row, slot in enumerate(slots) if slot is not None]
            if not active:
                return
            if len(active) < len(slots):  # no request left to take a free row: drop it
                cache.select_rows(active)
                slots = [slots[row] for row in active]
            self.step(slots, cache)
            for row, slot in enumerate(slots):
                if slot.finish_reason is not None:
                    yield slot.request, self.result(slot)
                    slots[row] = None
                    cache.valid[row] = False
            cache.compact()

    def take(self, queue: Iterator[Request], count: int):
        """Up to `count` next valid requests with their budgets (yielding a Failed for each invalid one)."""
        taken = []
        while len(taken) < count:
            request = next(queue, None)
            if request is None:
                break
            try:
                taken.append((request, budget(request, self.decoder.max_positions)))
            except RequestError as error:
                yield request, Failed(request.request_id, str(error))
        return taken

    def start(self, joiners: list[tuple[Request, int]], cache: RaggedCache, rows: list[int]) -> list[Slot]:
        """Starts the joiners in `rows`, prefilled together (like the single-request decoder, the
        cache holds all but each prompt's last token)."""
        slots, rows = [], iter(rows)
        for group in prefill_groups(joiners):
            prefix = prefill_many(self.model, [list(request.prompt_ids[:-1]) for request, _ in group])
            for source_row, (request, budget_) in enumerate(group):
                cache.put(next(rows), prefix, len(request.prompt_ids) - 1, source_row)
                slots.append(self.new_slot(request, budget_))
        return slots

    def new_slot(self, request: Request, budget_: int) -> Slot:
        prompt = request.prompt_ids
        random = None if request.sampling.greedy else RandomState(request.sampling.seed, budget_)
        controller = AdaptiveController(self.decoder.costs, self.decoder.acceptance_pool) if self.adaptive else None
        stats = RequestStats(num_prompt_tokens=len(prompt), accepted_length_histogram=[0] * (self.decoder.w + 1),
                             accepted_rank_histogram=[0] * self.decoder.k)
        return Slot(request, budget_, DraftContext(prompt, self.decoder.ngram_max_q, request.sampling, random),
                    random, stats, controller, time.perf_counter())

    def step(self, slots: list[Slot], cache: RaggedCache) -> None:
        started = time.perf_counter()
        proposals = []
        for slot in slots:
            # A step emits at most w+1 tokens; do not draft past the budget.
            drafts = self.decoder.draft(slot.context, min(self.decoder.w, slot.budget - len(slot.generated) - 1))
            if slot.controller is not None and drafts.tokens.shape[1] > 0:
                slot.pending.append((len(slot.generated), drafts))
            proposals.append(drafts)
        chosen = self.allocate(slots, proposals)
        trees = [build_tree(drafts.tokens) for drafts in chosen]
        verify_started = time.perf_counter()
        logits, width = self.forward(slots, trees, cache)  # [B, N, V]
        kept = []
        for row, (slot, drafts, tree) in enumerate(zip(slots, chosen, trees)):
            verdict, path = self.verify(slot, drafts, tree, logits[row, :len(tree.tokens) + 1])
            kept.append([0] + [node + 1 for node in path])
            self.emit(slot, verdict.tokens)
            share = 1 / len(slots)  # the call (and its time) is shared by the requests it served
            slot.stats.observe(verdict, drafts, len(tree.tokens) + 1, (verify_started - started) * share,
                               (time.perf_counter() - verify_started) * share, share)
        cache.keep_new(kept, width)

    def forward(self, slots: list[Slot], trees: list[DraftTree], cache: RaggedCache) -> tuple[torch.Tensor, int]:
        """One call over every request's [last token, tree nodes], padded to the widest."""
        width = 1 + max(len(tree.tokens) for tree in trees)
        input_ids = torch.zeros(len(slots), width, dtype=torch.long)  # [B, N]; padding feeds token 0
        position_ids = torch.zeros(len(slots), width, dtype=torch.long)  # [B, N]
        visible = torch.eye(width, dtype=torch.bool).repeat(len(slots), 1, 1)  # [B, N, N]; padding sees itself
        for row, (slot, tree) in enumerate(zip(slots, trees)):
            n = len(tree.tokens) + 1
            input_ids[row, :n] = torch.tensor([slot.context.tokens[-1]] + tree.tokens)
            position_ids[row] = len(slot.context) - 1
            position_ids[row, 1:n] += torch.tensor(tree.depths, dtype=torch.long)
            visible[row, :n, :n] = tree_visibility(tree)
        device = self.model.device
        mask = cache.attention_mask(visible, self.model.dtype)  # [B, 1, N, L+N]
        logits = self.model(input_ids=input_ids.to(device), position_ids=position_ids.to(device),
                            attention_mask=mask.to(device), past_key_values=cache.cache, use_cache=True).logits
        return logits, width

    def verify(self, slot: Slot, drafts: Drafts, tree: DraftTree, logits: torch.Tensor):
        # logits: [n+1, V] for [last token, nodes]
        if slot.request.sampling.greedy:
            return verify_tree_greedy(tree, logits)
        position = len(slot.generated)
        uniforms = slot.random.position_uniforms[position:position + drafts.tokens.shape[1] + 1]
        return verify_tree_sampled(tree, target_probs(logits, slot.request.sampling).cpu(), uniforms)

    def emit(self, slot: Slot, tokens: list[int]) -> None:
        decoder = self.decoder
        emitted, finish = decoder.cut_at_eos(tokens)
        slot.generated += emitted
        slot.context.append(emitted)
        if slot.controller is not None:
            slot.pending = judge_proposals(slot.controller, slot.pending, slot.generated)
        stop_cut = decoder.stop_cut(slot.generated, len(slot.generated) - len(emitted), slot.request.stop)
        if stop_cut is not None:
            slot.generated, finish = slot.generated[:stop_cut], "stop"
        if finish is None and len(slot.generated) >= slot.budget:
            finish = "length"
        slot.finish_reason = finish

    def result(self, slot: Slot) -> Result:
        stats = slot.stats
        stats.num_generated_tokens = len(slot.generated)
        stats.finish_reason = slot.finish_reason
        stats.total_seconds = time.perf_counter() - slot.started
        text = self.decoder.decode_text(slot.generated, slot.request.stop)
        return Result(slot.request.request_id, slot.generated, text, slot.finish_reason, stats)

    def allocate(self, slots: list[Slot], proposals: list[Drafts]) -> list[Drafts]:
        """The rows each request verifies this step: its K best rows cut to w tokens, for the shared
        (K, w) the cost model and the requests' acceptance rates make fastest (k/w auto), or its
        proposal as is; either way within max_batch_tokens."""
        rows_cap = self.max_batch_tokens // len(slots) if self.max_batch_tokens else None  # N per row
        if not self.adaptive:
            if rows_cap is None:
                return proposals
            return [select_rows(drafts, range(drafts.tokens.shape[0]), min(drafts.tokens.shape[1], rows_cap - 1), rows_cap - 1)
                    for drafts in proposals]
        k_max, w_max = self.decoder.k, self.decoder.w
        tables, orders = [], []
        for slot, drafts in zip(slots, proposals):
            if drafts.tokens.shape[1] == 0:
                tables.append(None)
                orders.append(None)
                continue
            order, table = slot.controller.expected_tokens(drafts)  # [k_b], [k_b, w_b]
            tables.append(table)
            orders.append(order)
        context = int(np.mean([len(slot.context) for slot in slots]))
        controller = slots[0].controller
        best, best_rate = (0, 0), len(slots) / controller.cost(len(slots), 0, context)
        for k in range(1 if self.decoder.auto_k else k_max, k_max + 1):
            for w in range(1 if self.decoder.auto_w else w_max, w_max + 1):
                width = 1 + k * w
                if rows_cap is not None and width > rows_cap:
                    continue
                tokens = sum(1.0 if table is None else table[min(k, table.shape[0]) - 1, min(w, table.shape[1]) - 1]
                             for table in tables)
                rate = tokens / controller.cost(len(slots), width - 1, context)
                if rate > best_rate:
                    best, best_rate = (k, w), rate
        k, w = best
        return [no_drafts() if order is None else select_rows(drafts, order[:k], w, k * w)
                for drafts, order in zip(proposals, orders)]

