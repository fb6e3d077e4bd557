"""Typed configuration: frozen dataclasses loaded from YAML and validated at load.

The dataclasses hold every default (a YAML file holds only what it changes; `python -m
jobs.generate --show-config` prints them all) and resolve `auto` themselves, so the job's loader,
pipeline.llm's processor and a program building a Config get the same settings.

Every error names the field (as `section.field`) and what is allowed, so a typo in a
scheduled job's YAML fails at start instead of after an hour of generation. Each section checks its
own shape, in its module (model, engine, vllm_engine, drafting, sampling, transformers_engine,
input, job, ray_actors); what an engine cannot honour (another engine's setting, a drafter it does not run)
is that engine's check (pipeline/engines/<engine>/settings.py), run when the job or the processor
starts (pipeline/engines/build.checked_config): the config, below the engines, knows none of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from pipeline.config.drafting import DraftingConfig
from pipeline.config.engine import EngineConfig
from pipeline.config.input import InputConfig
from pipeline.config.job import JobConfig
from pipeline.config.model import ModelConfig
from pipeline.config.ray_actors import RayConfig
from pipeline.config.sampling import SamplingConfig
from pipeline.config.transformers_engine import TransformersConfig
from pipeline.config.vllm_engine import VllmConfig


# The keys of the `decoder` section that was, and where each is now (refused at load, naming it).
DECODER_KEYS = {
    "drafter": "drafting.drafter",
    "w": "drafting.w",
    "auto_w": "drafting.w",  # (set as w: auto)
    "datastore": "drafting.datastore",
    **{f"ngram_{name}": f"drafting.ngram.{name}" for name in ("max_q", "min_q")},
    **{f"bigram_{name}": f"drafting.bigram.{name}" for name in ("top_k", "prefix", "batch_size")},
    **{
        f"retrieval_{name}": f"drafting.retrieval.{name}"
        for name in ("max_match", "min_match", "max_occurrences", "max_nodes")
    },
    **{
        f"suffix_{name}": f"drafting.suffix.{name}"
        for name in ("max_tokens", "min_probability", "min_match", "max_match")
    },
    **{name: f"sampling.{name}" for name in ("max_new_tokens", "n", "stop", "temperature", "top_k", "top_p", "seed")},
    **{
        name: f"transformers.{name}"
        for name in (
            "k",
            "verify",
            "lenience",
            "max_batch_requests",
            "max_batch_tokens",
            "draft_model",
            "draft_layers",
        )
    },
    "auto_k": "transformers.k",  # (set as k: auto)
}


@dataclass(frozen=True)
class Config:
    # A section that is no more, and where each of its keys is now: refused at load, naming it.
    MOVED_SECTIONS: ClassVar[dict[str, dict[str, str]]] = {"decoder": DECODER_KEYS}

    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    vllm: VllmConfig = field(default_factory=VllmConfig)
    drafting: DraftingConfig = field(default_factory=DraftingConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    transformers: TransformersConfig = field(default_factory=TransformersConfig)
    input: InputConfig = field(default_factory=InputConfig)
    job: JobConfig = field(default_factory=JobConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def __post_init__(self):
        """The shape of every section is checked by the section; what an engine cannot honour is
        the engine's to refuse (pipeline/engines/build.checked_config, when the job starts)."""
        if self.transformers.max_batch_requests is None:  # its default follows the drafter
            requests = 1 if self.drafting.drafter == "draft_model" else 4
            object.__setattr__(
                self, "transformers", dataclasses.replace(self.transformers, max_batch_requests=requests)
            )
