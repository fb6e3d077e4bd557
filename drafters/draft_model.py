"""Draft-model drafter for speculative sampling (Chen et al. 2023; Leviathan et al. 2023).

A causal LM sharing the target's tokenizer proposes w (= γ) tokens one at a time with its own KV
cache, together with its distribution q at each of them. When no smaller model of the same
family is at hand, `self_draft_model` makes one from the target itself with no training and no
extra memory: its first L layers, its final norm and its LM head (an early exit used as a draft).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import DynamicCache

from drafters.base import DraftContext, Drafts, common_prefix
from drafters.primitives.sampling import sample, target_probs

STRATEGY = "draft_model"


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object sharing every parameter, whose submodules can be swapped without
    touching the original (copy.copy alone would share the `_modules` dict)."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    return clone


def self_draft_model(model: nn.Module, num_layers: int) -> nn.Module:
    """The target's first `num_layers` decoder layers + final norm + LM head, weights shared."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(
            f"transformers.draft_model 'self' needs a decoder-only model with `model.layers` "
            f"(Llama, Mistral, Qwen2, ...); {type(model).__name__} has none: give a draft model directory"
        )
    if not 1 <= num_layers < len(layers):
        raise ValueError(
            f"transformers.draft_layers: must be from 1 to {len(layers) - 1} for this model "
            f"({len(layers)} layers), got {num_layers}"
        )
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    draft = _shallow_copy(model)
    draft.config = config
    draft.generation_config = copy.deepcopy(model.generation_config)  # generate() may edit it
    draft.model = _shallow_copy(base)
    draft.model.config = config
    draft.model.layers = nn.ModuleList(list(layers)[:num_layers])
    return draft


class DraftModelDrafter:
    """Proposes one row of w tokens; the cache follows the request's context between steps and
    drops the entries of rejected draft tokens (or restarts on a new request)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.cached_tokens: list[int] = []  # the tokens whose keys and values the cache holds

    def catch_up(self, tokens: list[int]) -> torch.Tensor:
        """Logits [V] after `tokens`, reusing the cache for their longest prefix already in it."""
        keep = min(common_prefix(self.cached_tokens, tokens), len(tokens) - 1)
        if keep == 0:
            self.cache = DynamicCache(config=self.model.config)
        elif keep < len(self.cached_tokens):
            self.cache.crop(-(len(self.cached_tokens) - keep))
        self.cached_tokens = self.cached_tokens[:keep]
        return self.forward(tokens[keep:])

    def forward(self, tokens: list[int]) -> torch.Tensor:
        input_ids = torch.tensor([tokens], device=self.model.device)
        logits = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True).logits
        self.cached_tokens += tokens
        return logits[0, -1]  # [V]

    @torch.no_grad()
    def propose(self, context: DraftContext, k: int, w: int) -> Drafts:
        assert k == 1, f"a draft model proposes one row per step (k = 1), asked for {k}"
        sampling = context.sampling
        logits = self.catch_up(context.tokens)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []  # each [V]
        for i in range(w):
            if sampling.greedy:
                token = int(logits.argmax())
            else:
                q = target_probs(logits, sampling).cpu()  # the draft samples from the same adjusted distribution
                token = sample(q, float(context.random.draft_uniforms(1)[0]))
                probs.append(q)
            tokens.append(token)
            if i < w - 1:
                logits = self.forward([token])
        return Drafts(
            tokens=torch.tensor([tokens], dtype=torch.long),
            strategies=(STRATEGY,),
            probs=torch.stack(probs).unsqueeze(0) if probs else None,
            num_model_calls=w,
        )
