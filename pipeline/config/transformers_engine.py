"""The `transformers` section: our own decoder's settings (engine.name transformers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.config.drafting import resolve_auto
from pipeline.config.typed import require as _require


@dataclass(frozen=True)
class TransformersConfig:
    """The transformers engine's own settings (engine.name transformers: our decoder). The vLLM
    engine verifies one row per request and refuses the ones that would change what runs
    (pipeline/engines/vllm/settings.py); what this engine refuses in combination with the other
    sections is pipeline/engines/transformers/settings.py's."""

    # Number of draft rows verified per target call. "auto": each step chooses up to AUTO_MAX["k"]
    # (auto_k is then set), from the request's acceptance history and the measured call costs.
    k: int | Literal["auto"] = 1
    auto_k: bool = field(default=False, metadata={"set_by": "transformers.k: auto"})
    # "batch": k rows of w+1 tokens per call (shared prefixes repeated); "tree": the rows merged by
    # shared prefixes into one sequence with a tree attention mask. Both emit the same tokens.
    verify: Literal["batch", "tree"] = "batch"
    # Throughput mode: up to this many requests of an actor's batch share each forward call, each
    # with its own drafts; a finished request's row goes to the next at once. 1: one at a time.
    # Unset: 4, or 1 with drafter draft_model (its draft cache follows one request). Keep
    # ray.batch_size a multiple of it. (The vLLM engine's slots are vllm.max_num_seqs.)
    max_batch_requests: int | None = None
    # Cap on tokens fed per call in throughput mode (requests x widest draft tree + 1); 0: none.
    max_batch_tokens: int = 0
    # drafter "draft_model": "self" drafts with the target's first `draft_layers` layers, its final
    # norm and LM head (no training, no extra weights); or a Hugging Face causal-LM directory
    # sharing the target's tokenizer. Its draft length γ is drafting.w; it proposes one row (k = 1).
    draft_model: str = "self"
    draft_layers: int = 8
    # Lossy option for draft_model sampling: accept x with probability min(1, p(x) / (l q(x))).
    # 1 is exact; l < 1 accepts more and changes the output distribution.
    lenience: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "k", resolve_auto(self, "k", "transformers"))
        _require(self.k >= 1, "transformers.k", "an integer >= 1")
        _require(
            self.max_batch_requests is None or self.max_batch_requests >= 1,
            "transformers.max_batch_requests",
            "an integer >= 1",
        )
        _require(
            self.max_batch_tokens == 0 or self.max_batch_tokens >= (self.max_batch_requests or 1),
            "transformers.max_batch_tokens",
            f"0 (no cap) or at least transformers.max_batch_requests ({self.max_batch_requests})",
        )
        _require(bool(self.draft_model), "transformers.draft_model", "'self' or a model directory")
        _require(self.draft_layers >= 1, "transformers.draft_layers", "an integer >= 1")
        _require(0 < self.lenience <= 1, "transformers.lenience", "a number in (0, 1] (1 is exact)")
