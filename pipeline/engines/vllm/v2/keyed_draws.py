"""A seed is a text on vLLM 0.34 too: a sampled request's t-th generated token is drawn with noise
keyed by (its seed, t) alone (drafters/primitives/keyed_noise.py, the noise vLLM 0.32's engine draws
with), whatever the mode: plain, ours, or vLLM's own methods.

vLLM 0.34's sampler draws with its own keyed noise, but its rejection sampler verifies a point draft
by a probability-ratio test and resamples a rejected position from the residual: a drafted row is a
sample of the target's distribution, not plain's text for that seed. So a sampled request runs as
a greedy one in vLLM (temperature 0), its sampling settings in SamplingParams.extra_args[KEYED_KEY],
and this logits processor, run by vLLM's own sampler on every logits row (plain rows, draft rows,
the bonus row alike), turns each of the request's rows into the one token drawn for it:

    y = argmax_v (l(v) / T + G_v),  over top-k / top-p of l / T,  G keyed by (seed, t)

with t the generated index of the token the row samples (its position + 1 - the prompt's length).
vLLM's greedy verification then accepts a draft token iff it equals y, and emits y at the first
mismatch and after the last draft token: the tokens of plain sampling with that seed. Since y ~ p,
a draft token x is accepted with probability p(x), and a rejected one replaced by p without x
renormalised: speculative sampling for a point draft (pipeline/engines/vllm/seeded_sampling.py says
the same of vLLM 0.32). vLLM's raw log probabilities (its default) are those of the unprocessed
logits, as for any request.
"""

from __future__ import annotations

import numpy as np
import torch

from drafters.primitives.keyed_noise import as_int64, gumbel_argmax, position_keys
from pipeline.engines.vllm import compat
from pipeline.engines.vllm.v2.options import KEYED_KEY


def keyed_settings(sampling_params) -> dict | None:
    """The request's keyed sampling settings, or None (a request vLLM samples as it is); ValueError
    names what is wrong."""
    settings = (getattr(sampling_params, "extra_args", None) or {}).get(KEYED_KEY)
    if settings is None:
        return None
    wrong = not isinstance(settings, dict) or set(settings) != {"temperature", "top_k", "top_p", "seed"}
    if wrong or not (settings["temperature"] > 0 and 0 < settings["top_p"] <= 1 and settings["top_k"] >= 0):
        raise ValueError(
            f"SamplingParams.extra_args[{KEYED_KEY!r}] must be {{temperature > 0, top_k >= 0 (0: all), "
            f"0 < top_p <= 1, seed}}, got {settings!r:.120}"
        )
    if sampling_params.temperature != 0:
        raise ValueError(f"a request with extra_args[{KEYED_KEY!r}] runs as greedy in vLLM (temperature 0)")
    return settings


def filtered(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [R, V] with the tokens outside each row's top_k (0: all) and top_p nucleus at -inf: the
    k likeliest, then the fewest likeliest whose probability reaches p (the likeliest always kept)."""
    ordered, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    keep = ranks < torch.where(top_k > 0, top_k, vocab).unsqueeze(1)
    ordered = ordered.masked_fill(~keep, float("-inf"))
    probabilities = ordered.softmax(dim=-1)
    before = probabilities.cumsum(dim=-1) - probabilities  # the mass of the likelier tokens
    keep &= (before < top_p.unsqueeze(1)) | (ranks == 0)
    return torch.full_like(logits, float("-inf")).scatter(1, order, ordered.masked_fill(~keep, float("-inf")))


CHUNK_ROWS = 64  # rows drawn at a time: the filter's sort and softmax hold a few [rows, V] temporaries


def keyed_tokens(logits, temperature, top_k, top_p, seeds, generated, filtering: bool = True) -> torch.Tensor:
    """[R] the keyed draw of each row: logits [R, V] / temperature, filtered (where `filtering`: some
    row has a top-k or top-p), Gumbel-max with the noise of (seed, generated index); CHUNK_ROWS rows
    at a time."""
    tokens = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    for start in range(0, logits.shape[0], CHUNK_ROWS):
        rows = slice(start, start + CHUNK_ROWS)
        scaled = logits[rows].float() / temperature[rows].unsqueeze(1)
        scaled = filtered(scaled, top_k[rows], top_p[rows]) if filtering else scaled
        tokens[rows] = gumbel_argmax(scaled, position_keys(seeds[rows], generated[rows]))
    return tokens


class KeyedDrawProcessor(compat.logits_processor_base()):
    def __init__(self, vllm_config, req_states):
        slots, device = req_states.max_num_reqs, req_states.device
        self.req_states = req_states  # its prompt lengths are read at each step (vLLM swaps the buffer)
        self.keyed = np.zeros(slots, bool)  # on the host: which slots draw keyed (no device read to skip)
        self.filters = np.zeros(slots, bool)  # on the host: which of them have a top-k or top-p
        self.keyed_device = torch.zeros(slots, dtype=torch.bool, device=device)
        self.temperature = torch.ones(slots, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(slots, dtype=torch.int64, device=device)
        self.top_p = torch.ones(slots, dtype=torch.float32, device=device)
        self.seed = torch.zeros(slots, dtype=torch.int64, device=device)

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        keyed_settings(sampling_params)

    def add_request(self, req_idx: int, sampling_params) -> bool:
        settings = keyed_settings(sampling_params)
        self.keyed[req_idx] = settings is not None
        self.filters[req_idx] = settings is not None and (settings["top_k"] > 0 or settings["top_p"] < 1)
        self.keyed_device[req_idx] = settings is not None
        if settings is not None:
            self.temperature[req_idx] = float(settings["temperature"])
            self.top_k[req_idx] = int(settings["top_k"])
            self.top_p[req_idx] = float(settings["top_p"])
            self.seed[req_idx] = as_int64(int(settings["seed"]))
        return settings is not None  # its rows are masked to one token each

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        """Each keyed row masked, in place, to its draw (vLLM hands the processors its own fp32 copy)."""
        requests = ctx.idx_mapping_np
        if not self.keyed[requests].any():
            return logits
        slots = ctx.expanded_idx_mapping.long()
        generated = ctx.pos.long() + 1 - compat.slot_prompt_lengths(self.req_states)[slots].long()
        filtering = bool(self.filters[requests].any())
        tokens = keyed_tokens(
            logits,
            self.temperature[slots],
            self.top_k[slots],
            self.top_p[slots],
            self.seed[slots],
            generated,
            filtering,
        ).unsqueeze(1)
        keyed = self.keyed_device[slots].unsqueeze(1)
        kept = logits.gather(1, tokens)  # (an unkeyed row's own logit there, put back)
        logits.masked_fill_(keyed, float("-inf"))
        logits.scatter_(1, tokens, torch.where(keyed, torch.zeros_like(kept), kept))
        return logits
