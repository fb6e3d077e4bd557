"""Speculative decoding of one request: k drafts of w tokens verified in one target forward call.

Each step feeds either the block [k, w+1] (the last emitted token followed by each row's draft,
over the context's KV cache shared by all k rows) or, in tree mode, the rows merged by shared
prefixes (pipeline/engines/transformers/tree.py). The verifier (pipeline/engines/transformers/verification.verify)
decides what the step
emits; only the winner's cache entries are kept. The request's own life (budget, EOS, stop
strings, adaptive scoring, result) is pipeline/engines/transformers/request_state.py, shared with the batched decoder.
With no drafter (or w = 0) each step is one plain token: the reference for every test.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from drafters.adaptive import AdaptiveController
from drafters.budget import StepCostFit
from drafters.base import NO_DRAFT, PADDING, Drafter, Drafts
from pipeline.engines.base import Request, Result
from pipeline.engines.transformers.kv_cache import (
    keep_positions,
    keep_row,
    share_context,
)
from pipeline.engines.transformers.request_state import DecodingRules, RequestState
from pipeline.engines.transformers.tree import build_tree, node_logits, tree_inputs
from pipeline.engines.transformers.verification import DraftEvidence, Verdict, verify
from drafters.primitives.forward import prefill
from pipeline.loading.model import eos_token_ids
from drafters.primitives.sampling import GREEDY, SamplingParams


def no_drafts() -> Drafts:
    """A step without drafts: one plain token."""
    return Drafts(tokens=torch.empty(1, 0, dtype=torch.long), strategies=(NO_DRAFT,))


def select_rows(drafts: Drafts, rows, w: int, max_nodes: int | None = None) -> Drafts:
    """`rows` of point drafts (in that order) cut to w tokens and distinct (rows that differ only
    after w would be verified twice), while their tree has at most max_nodes nodes (distinct prefixes)."""
    kept, strategies, prefixes = [], [], set()
    for index in rows:
        row = drafts.tokens[int(index), :w].tolist()
        new = {tuple(row[:depth]) for depth in range(1, len(row) + 1)} - prefixes
        if row in kept or (max_nodes is not None and len(prefixes) + len(new) > max_nodes):
            continue
        kept.append(row)
        strategies.append(drafts.strategies[int(index)])
        prefixes |= new
    if not kept or w == 0:
        return no_drafts()
    return Drafts(tokens=torch.tensor(kept, dtype=torch.long), strategies=tuple(strategies))


@dataclass(frozen=True)
class Verifying:
    """How a SpeculativeDecoder verifies: the longest n-gram its rules match on (ngram_max_q), the
    lenience of speculative sampling (accept x with probability min(1, p(x) / (lenience q(x))): 1 is
    exact), the rows' layout ("batch": k rows of w + 1 tokens; "tree": the rows merged by shared
    prefixes, tree.py), and whether k and w are chosen per step (auto_k, auto_w) or fixed."""

    ngram_max_q: int = 3
    lenience: float = 1.0
    verify_mode: str = "batch"
    auto_k: bool = True
    auto_w: bool = True

    def __post_init__(self):
        assert self.verify_mode in ("batch", "tree"), f"verify_mode must be 'batch' or 'tree', got {self.verify_mode!r}"


class SpeculativeDecoder:
    def __init__(
        self,
        model,
        tokenizer,
        drafter: Drafter | None,
        k: int,
        w: int,
        verifying: Verifying = Verifying(),
        costs: StepCostFit | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.drafter = drafter
        k, w = (k, w) if drafter is not None and w > 0 else (1, 0)
        # With a step cost (learned from this decoder's own calls), k and w are maxima and each step
        # verifies the (k, w) the request's own acceptance history and that cost make fastest
        # (drafters/adaptive.py).
        self.rules = DecodingRules(
            tokenizer,
            eos_token_ids(model, tokenizer),
            getattr(model.config, "max_position_embeddings", None),
            k,
            w,
            verifying.ngram_max_q,
            costs,
        )
        self.auto_k = verifying.auto_k
        self.auto_w = verifying.auto_w
        self.verify_mode = verifying.verify_mode
        self.lenience = verifying.lenience

    @property
    def k(self) -> int:
        return self.rules.k

    @property
    def w(self) -> int:
        return self.rules.w

    def draft(self, state: RequestState) -> Drafts:
        """The step's proposal with padding rows dropped (they carry no guess but cost compute);
        kept by the request for adaptive scoring."""
        w = state.draft_w()
        if self.drafter is None or w <= 0:
            return no_drafts()
        drafts = self.drafter.propose(state.context, self.k, w)
        keep = [i for i, s in enumerate(drafts.strategies) if s != PADDING]
        if not keep:  # nothing to guess: a plain one-token step is cheaper than verifying padding
            return no_drafts()
        longest = max(drafts.lengths[i] for i in keep) if drafts.lengths is not None else w
        if len(keep) < len(drafts.strategies) or longest < w:  # rows as long as the drafter's evidence
            drafts = Drafts(
                tokens=drafts.tokens[keep, :longest],
                strategies=tuple(drafts.strategies[i] for i in keep),
                probs=None if drafts.probs is None else drafts.probs[keep, :longest],
                num_model_calls=drafts.num_model_calls,
            )
        state.proposed(drafts)
        return drafts

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        stop: tuple[str, ...] = (),
        request_id: str = "",
        sampling: SamplingParams = GREEDY,
    ) -> Result:
        state = RequestState.start(
            Request(request_id, prompt_ids, max_new_tokens, stop=stop, sampling=sampling), self.rules
        )
        # The cache holds every token but the last emitted one, which opens the next block.
        cache = prefill(self.model, prompt_ids[:-1])
        while state.finish_reason is None:
            step_started = time.perf_counter()
            drafts = self.draft(state)
            if state.controller is not None and drafts.tokens.shape[1] > 0:
                drafts = self.adapt(state.controller, drafts)
            verify_started = time.perf_counter()
            verdict, fed = self.verify(cache, state, drafts)
            verify_seconds = time.perf_counter() - verify_started
            if self.rules.costs is not None:
                self.rules.costs.observe(fed, verify_seconds)
            state.accept(verdict, drafts, fed, verify_started - step_started, verify_seconds)
        return state.result()

    def adapt(self, controller: AdaptiveController, drafts: Drafts) -> Drafts:
        """The k rows and w tokens the controller chooses (w = 0: none, a plain step)."""
        assert drafts.probs is None, "k/w auto is for point drafts; the config refuses it for a draft model"
        choice = controller.choose(drafts, self.auto_k, self.auto_w)
        return select_rows(drafts, choice.rows, choice.w)

    @torch.no_grad()
    def verify(self, cache, state: RequestState, drafts: Drafts) -> tuple[Verdict, int]:
        """One target call over the step's drafts (a [k, w+1] block, or their tree); keeps the
        winner's cache entries. Returns the verdict and the number of tokens the call fed the target."""
        tree = build_tree(drafts.tokens)
        context_length = cache.get_seq_length()
        as_tree = self.verify_mode == "tree" and drafts.probs is None and bool(tree.tokens)
        logits, fed = (self.tree_call if as_tree else self.block_call)(cache, state.context.tokens[-1], drafts, tree)
        w = drafts.tokens.shape[1]
        draft = None
        if drafts.probs is not None and not state.request.sampling.greedy:
            draft = DraftEvidence(drafts.probs[0], state.random.draft_uniforms(w), self.lenience)
        verdict = verify(tree, logits, state.request.sampling, state.uniforms(w), draft)
        if as_tree:
            keep_positions(cache, context_length + 1, [context_length + 1 + node for node in verdict.path])
        else:
            keep_row(cache, verdict.row, context_length + 1 + verdict.num_accepted)
        return verdict, fed

    def block_call(self, cache, last_token: int, drafts: Drafts, tree) -> tuple[torch.Tensor, int]:
        """[n+1, V] logits at the tree's positions from one [k, w+1] call (every row repeats the
        prefixes it shares), and the tokens fed."""
        k = drafts.tokens.shape[0]
        block = torch.cat([torch.full((k, 1), last_token, dtype=torch.long), drafts.tokens], dim=1)  # [k, w+1]
        if k > 1:
            share_context(cache, k)
        logits = self.model(input_ids=block.to(self.model.device), past_key_values=cache, use_cache=True).logits
        return node_logits(tree, logits), block.numel()

    def tree_call(self, cache, last_token: int, drafts: Drafts, tree) -> tuple[torch.Tensor, int]:
        """[n+1, V] logits from one call over [root, nodes] with the tree's mask, and the tokens fed."""
        input_ids, position_ids, mask = tree_inputs(tree, last_token, cache.get_seq_length(), self.model.dtype)
        device = self.model.device
        logits = self.model(
            input_ids=input_ids.to(device),
            position_ids=position_ids.to(device),
            attention_mask=mask.to(device),
            past_key_values=cache,
            use_cache=True,
        ).logits[0]
        return logits, input_ids.numel()
