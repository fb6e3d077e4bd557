"""The device drafter's settings and the constants its kernels and their reference share (nothing
here imports torch or Triton: vLLM reads the settings in every process)."""

from __future__ import annotations

from dataclasses import dataclass

# Sources, in the order a tie between their expected accepted tokens is broken.
PREDICTION, CONTEXT, CORPUS, BIGRAM = range(4)
SOURCES = ("prediction", "context", "corpus", "bigram")
NUM_LEN_BUCKETS = 9  # match lengths 1-6 one bucket each, then 7-10, 11-20, 21+ (bigram: bucket 0)
HASH_MUL = 0x9E3779B97F4A7C15 - (1 << 64)  # an odd 64-bit multiplier (the golden ratio), as a signed int64
NEAR = 8  # a prediction match this close to where the answer is expected counts as a full-depth one
POS_BITS = 20  # scores pack positions and distances in 20 bits (texts shorter than 2**20 tokens)
DEPTH_BITS = 7  # and match lengths in 7 (max_depth < 128)


@dataclass(frozen=True)
class DeviceSettings:
    """What the device drafter keeps and how far it looks (speculator_options by these names)."""

    max_depth: int = 24  # the longest suffix match looked for (vLLM suffix's tree depth, for a like comparison)
    corpus_tokens: int = 1 << 20  # the ring of earlier outputs (and the store); 0: no corpus
    prediction_tokens: int = 4096  # the longest prediction a slot holds (longer ones: their start)
    min_confidence: float = 0.0  # a draft position rated below this ends it (0: every slot verified)

    def __post_init__(self):
        if not 1 <= self.max_depth < 128:
            raise ValueError(f"max_depth must be in [1, 128), got {self.max_depth}")
        if not 0 <= self.corpus_tokens < 1 << 31:
            raise ValueError(f"corpus_tokens must be in [0, 2**31), got {self.corpus_tokens}")
        if not 0 <= self.prediction_tokens < 1 << POS_BITS:
            raise ValueError(f"prediction_tokens must be in [0, {1 << POS_BITS}), got {self.prediction_tokens}")
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {self.min_confidence}")
