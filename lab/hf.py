"""The transformers baselines the benchmark compares against: `generate` as its users call it."""

from __future__ import annotations

import torch

from pipeline.engines.transformers import attention_implementation
from drafters.primitives.sampling import GREEDY, SamplingParams


@torch.no_grad()
def hf_generate(model, ids: list[int], max_new_tokens: int, sampling: SamplingParams = GREEDY, **kwargs) -> list[int]:
    inputs = torch.tensor([ids])
    if not sampling.greedy:
        torch.manual_seed(sampling.seed)
        kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
    else:
        kwargs.update(do_sample=False)
    with attention_implementation(model, "sdpa"):  # what a user of generate gets
        output = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new_tokens, **kwargs)
    return output[0, len(ids) :].tolist()


@torch.no_grad()
def hf_generate_batch(
    model, batch: list[list[int]], max_new_tokens: int, pad: int, eos: set[int], attention: str = "sdpa"
) -> list[list[int]]:
    """transformers' greedy generate over a left-padded batch (on transformers' default attention
    unless told); each output is cut after its EOS."""
    width = max(map(len, batch))
    inputs = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch])  # [B, width]
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])  # [B, width]
    with attention_implementation(model, attention):
        output = model.generate(
            inputs, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad
        )[:, width:].tolist()
    return [row[: next((i + 1 for i, token in enumerate(row) if token in eos), len(row))] for row in output]
