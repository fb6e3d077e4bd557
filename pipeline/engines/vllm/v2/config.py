"""Our speculator's config in vLLM's plugin registry: it behaves as vLLM's suffix speculator (no
draft model; the requests' whole token history dense on the device; confidences from acceptance
rates, not draft logits) and takes `speculator_options` (options.py). vLLM imports this module in
every process: it imports no speculator, torch kernel or table."""

from __future__ import annotations

from pipeline.engines.vllm import compat
from pipeline.engines.vllm.v2.options import parse_options

SuffixSpeculatorConfig = compat.speculator_config_base()


class NgrammysSpeculatorConfig(SuffixSpeculatorConfig):
    speculator_class = "pipeline.engines.vllm.v2.speculator.NgrammysSpeculator"
    supported_options = frozenset({"speculator_options"})

    @classmethod
    def configure(cls, spec) -> None:
        super().configure(spec)  # num_speculative_tokens' default (8) and the suffix fields' checks
        parse_options(spec.speculator_options)  # a bad option fails here, at the engine's start
