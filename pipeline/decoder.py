"""Batched speculative decoder: k drafts of w tokens verified in one target forward call.

Each step feeds the block [k, w+1] = the last emitted token followed by each row's draft, over
the context's KV cache shared by all k rows; the verifier picks the winning row (greedy:
verify_greedy; sampling: verify_point_drafts, or speculative_sample for a draft model's drafts);
its accepted tokens plus one more token are emitted and only its cache entries are kept.
With no drafter (or w = 0) each step is one plain token: the reference for every test.
"""
from __future__ import annotations

import time


import torch

from drafters.base import PADDING, DraftContext, Drafter, Drafts
from pipeline.adaptive import AdaptiveController, judge_proposals
from pipeline.cost_model import CostModel
from pipeline.engines.base import Request, Result, budget, cut_at_stop
from pipeline.kv_cache import keep_positions, keep_row, prefill, share_context
from pipeline.sampling import (GREEDY, RandomState, SamplingParams, speculative_sample, target_probs,
                               verify_point_drafts)
from pipeline.stats import RequestStats
from pipeline.tree import build_tree, tree_inputs, verify_tree_greedy, verify_tree_sampled
from pipeline.verification import Verdict, verify_greedy


# A stop string of n characters spans at most n tokens that decode to text; a few more cover
# tokens that decode to nothing alone (special tokens, the first bytes of a character).
STOP_MARGIN_TOKENS = 4

# Strategy name of a step that verified no draft (plain decoding, or nothing worth guessing).
NO_DRAFT = "none"


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


def eos_token_ids(model, tokenizer) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, (list, tuple)) else [] if ids is None else [ids])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class SpeculativeDecoder:
    def __init__(self, model, tokenizer, drafter: Drafter | None, k: int, w: int, ngram_max_q: int = 3,
                 lenience: float = 1.0, verify_mode: str = "batch", costs: CostModel | None = None,
                 auto_k: bool = True, auto_w: bool = True):
        self.model, self.tokenizer = model, tokenizer
        # With a cost model, k and w are maxima and each step verifies the (k, w) the request's own
        # acceptance history and the hardware's costs make fastest (pipeline/adaptive.py).
        self.costs = costs
        self.acceptance_pool = {}  # what earlier requests accepted, per row kind: a new request's prior
        self.auto_k, self.auto_w = auto_k, auto_w
        # "batch": k rows of w+1 tokens; "tree": the rows merged by shared prefixes (pipeline/tree.py).
        assert verify_mode in ("batch", "tree"), f"verify_mode must be 'batch' or 'tree', got {verify_mode!r}"
        self.verify_mode = verify_mode
        # Speculative sampling accepts x with probability min(1, p(x) / (lenience q(x))): 1 is exact.
        self.lenience = lenience
        self.drafter = drafter
        self.k, self.w = (k, w) if drafter is not None and w > 0 else (1, 0)
        self.ngram_max_q = ngram_max_q
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.max_positions = getattr(model.config, "max_position_embeddings", None)

    def draft(self, context: DraftContext, w: int) -> Drafts:
        """The step's drafts with padding rows dropped (they carry no guess but cost compute)."""
        if self.drafter is None or w == 0:
            return no_drafts()
        drafts = self.drafter.propose(context, self.k, w)
        keep = [i for i, s in enumerate(drafts.strategies) if s != PADDING]
        if not keep:  # nothing to guess: a plain one-token step is cheaper than verifying padding
            return no_drafts()
        if len(keep) == len(drafts.strategies):
            return drafts
        return Drafts(tokens=drafts.tokens[keep], strategies=tuple(drafts.strategies[i] for i in keep),
                      probs=None if drafts.probs is None else drafts.probs[keep],
                      num_model_calls=drafts.num_model_calls)

    @torch.no_grad()
    def verify(self, cache, last_token: int, drafts: Drafts, sampling: SamplingParams,
               random: RandomState | None, position: int) -> tuple[Verdict, int]:
        """One target call over the block [last, draft] for every row; keeps the winner's cache.
        `position` is the number of tokens generated so far (it picks the position uniforms).
        Returns the verdict and the number of tokens the call fed the target."""
        if self.verify_mode == "tree" and drafts.probs is None and drafts.tokens.shape[1] > 0:
            return self.verify_tree(cache, last_token, drafts, sampling, random, position)
        tokens = drafts.tokens  # [k, w]
        k, w = tokens.shape
        block = torch.cat([torch.full((k, 1), last_token, dtype=torch.long), tokens], dim=1)  # [k, w+1]
        context_length = cache.get_seq_length()
        if k > 1:
            share_context(cache, k)
        logits = self.model(input_ids=block.to(self.model.device), past_key_values=cache,
                            use_cache=True).logits  # [k, w+1, V]
        if sampling.greedy:
            verdict = verify_greedy(tokens.to(logits.device), logits)
        else:
            probs = target_probs(logits, sampling).cpu()  # [k, w+1, V]; sampling runs on the host
            uniforms = random.position_uniforms[position:position + w + 1]  # [w+1]
            if drafts.probs is None:
                verdict = verify_point_drafts(tokens, probs, uniforms)
            else:
                verdict = speculative_sample(tokens[0], drafts.probs[0], probs[0], random.draft_uniforms(w),
                                             uniforms, self.lenience)
        # Keep the winner's last token and accepted drafts; the next token opens the next block.
        keep_row(cache, verdict.row, context_length + 1 + verdict.num_accepted)
        return verdict, block.numel()

    def verify_tree(self, cache, last_token: int, drafts: Drafts, sampling: SamplingParams,
                    random: RandomState | None, position: int) -> tuple[Verdict, int]:
        """verify() with the rows merged into one tree: shared prefixes are fed once."""
        tree = build_tree(drafts.tokens)
        context_length = cache.get_seq_length()
        device = self.model.device
        input_ids, position_ids, mask = tree_inputs(tree, last_token, context_length, self.model.dtype)
        logits = self.model(input_ids=input_ids.to(device), position_ids=position_ids.to(device),
                            attention_mask=mask.to(device), past_key_values=cache, use_cache=True).logits[0]  # [n+1, V]
        if sampling.greedy:
            verdict, path = verify_tree_greedy(tree, logits)
        else:
            uniforms = random.position_uniforms[position:position + drafts.tokens.shape[1] + 1]
            verdict, path = verify_tree_sampled(tree, target_probs(logits, sampling).cpu(), uniforms)
        keep_positions(cache, context_length + 1, [context_length + 1 + node for node in path])
        return verdict, input_ids.numel()

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop: tuple[str, ...] = (),
                 request_id: str = "", sampling: SamplingParams = GREEDY) -> Result:
        started = time.perf_counter()
        budget_ = budget(Request(request_id, prompt_ids, max_new_tokens), self.max_positions)
        stats = RequestStats(num_prompt_tokens=len(prompt_ids), accepted_length_histogram=[0] * (self.w + 1),
                             accepted_rank_histogram=[0] * self.k)
        # The cache holds every token but the last emitted one, which opens the next block.
        cache = prefill(self.model, prompt_ids[:-1])
        random = None if sampling.greedy else RandomState(sampling.seed, budget_)
        context = DraftContext(prompt_ids, self.ngram_max_q, sampling, random)
        generated: list[int] = []
        finish_reason = "length"
        controller = AdaptiveController(self.costs, self.acceptance_pool) if self.costs is not None else None
        pending: list[tuple[int, Drafts]] = []  # proposals whose rows are judged once their tokens exist
        while len(generated) < budget_:
            step_started = time.perf_counter()
            # A step emits at most w+1 tokens; do not draft past the budget.
            drafts = self.draft(context, min(self.w, budget_ - len(generated) - 1))
            if controller is not None and drafts.tokens.shape[1] > 0:
                pending.append((len(generated), drafts))
                drafts = self.adapt(controller, drafts, len(context))
            verify_started = time.perf_counter()
            verdict, fed = self.verify(cache, context.tokens[-1], drafts, sampling, random, len(generated))
            stats.observe(verdict, drafts, fed, verify_started - step_started, time.perf_counter() - verify_started)
            emitted, finish = self.cut_at_eos(verdict.tokens)
            generated += emitted
            context.append(emitted)
            if controller is not None:
                pending = judge_proposals(controller, pending, generated)
            stop_cut = self.stop_cut(generated, len(generated) - len(emitted), stop)
            if stop_cut is not None:
                generated, finish = generated[:stop_cut], "stop"
            if finish:
                finish_reason = finish
                break
        text = self.decode_text(generated, stop)
        stats.num_generated_tokens = len(generated)
        stats.finish_reason = finish_reason
        stats.total_seconds = time.perf_counter() - started
        return Result(request_id, generated, text, finish_reason, stats)

    def adapt(self, controller: AdaptiveController, drafts: Drafts, context_length: int) -> Drafts:
        """The k rows and w tokens the controller chooses (w = 0: none, a plain step)."""
        assert drafts.probs is None, "k/w auto is for point drafts; the config refuses it for a draft model"
        choice = controller.choose(drafts, context_length, self.auto_k, self.auto_w)
        return select_rows(drafts, choice.rows, choice.w)

    def cut_at_eos(self, tokens: list[int]) -> tuple[list[int], str | None]:
        for i, token in enumerate(tokens):
            if token in self.eos_ids:
                return tokens[:i + 1], "eos"
        return tokens, None

    def stop_cut(self, generated: list[int], checked: int, stop: tuple[str, ...]) -> int | None:
        """Fewest tokens whose text contains a stop string, if one ended among generated[checked:]
        (none ended earlier: it would have been cut then). Only a tail is decoded, long enough to
        hold any stop string that ends among the new tokens, so checking stays linear in length."""
        if not stop:
            return None
        start = max(0, checked - max(map(len, stop)) - STOP_MARGIN_TOKENS)

        def stopped(end: int) -> bool:
            text = self.tokenizer.decode(generated[start:end], skip_special_tokens=True)
            return any(s in text for s in stop)

        if not stopped(len(generated)):
            return None
        return next(length for length in range(checked + 1, len(generated) + 1) if stopped(length))

    def decode_text(self, generated: list[int], stop: tuple[str, ...]) -> str:
        text = self.tokenizer.decode(generated, skip_special_tokens=True) if self.tokenizer else ""
        return cut_at_stop(text, stop)
