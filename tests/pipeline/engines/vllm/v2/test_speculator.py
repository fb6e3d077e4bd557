"""Our speculator in vLLM 0.34's own classes (run by `make test-vllm034`): the plugin registry and its
config, the runner's exact calls, the prediction side channel through vLLM's Sampler, and a decode
loop through vLLM's RequestState and post_update held to the plain reference."""

import numpy as np
import pytest
import torch

from jobs.benchmark.replay_answers import Answer
from jobs.benchmark.speculators import DecodeLoop, vllm_config
from pipeline.engines.vllm import compat, versions
from pipeline.engines.vllm.v2 import plugin
from pipeline.engines.vllm.v2.speculator import NgrammysSpeculator
from tests.drafters.device.check import ReferenceCheck
from tests.drafters.device.test_drafter import answers


def test_the_installed_vllm_runs_our_speculator_and_every_v2_reach_names_it():
    assert versions.runs_speculator(), versions.installed_version()
    v2 = {name: reach for name, reach in compat.REACHES.items() if name.startswith("v2_")}
    assert v2 and all(reach.versions == versions.SPECULATOR_VERSIONS for reach in v2.values())
    # the V1 reaches do not apply here: no custom_class, no V1 runner
    assert not compat.applies("v1_model_runner") and not compat.applies("keyed_draws")


def test_a_vllm_we_have_not_read_fails_where_our_method_is_asked_for(monkeypatch):
    monkeypatch.setattr(versions, "installed_version", lambda: "0.35.0")
    with pytest.raises(
        versions.UnsupportedVllm, match=r"vLLM 0\.35\.0 is installed; our speculator runs on vLLM 0\.34\.0"
    ):
        plugin.engine_arguments(8, {})


def test_the_plugin_registers_the_method_and_a_bad_option_fails_naming_it(model_dir):
    from vllm.v1.worker.gpu.spec_decode.speculator_config import registered_speculative_methods

    plugin.register()
    plugin.register()  # every process calls it; again is no error
    assert plugin.METHOD in registered_speculative_methods()
    with pytest.raises(ValueError, match="max_depth"):
        vllm_config("ngrammys", 4, 4, 256, 128, {"max_depth": 0}, model_dir)
    with pytest.raises(ValueError, match="unknown option.*'depth'.*takes"):
        vllm_config("ngrammys", 4, 4, 256, 128, {"depth": 8}, model_dir)


def test_a_draft_length_by_batch_size_becomes_vllms_schedule(model_dir):
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
    from vllm.v1.core.sched.scheduler import build_dynamic_sd_schedule_lookup

    plugin.register()
    arguments = plugin.engine_arguments(8, {}, draft_lengths=[(1, 32, 8), (33, 128, 3), (129, 1024, 0)])
    model = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=256, dtype="float32")
    spec = SpeculativeConfig(
        **arguments["speculative_config"], target_model_config=model, target_parallel_config=ParallelConfig()
    )
    lookup = build_dynamic_sd_schedule_lookup(
        spec.num_speculative_tokens_per_batch_size, vllm_max_batch_size=256, vllm_num_speculative_tokens=8
    )
    assert (lookup[16], lookup[64], lookup[256]) == (8, 3, 0)
    with pytest.raises(ValueError, match="draft_lengths"):
        plugin.engine_arguments(4, {}, draft_lengths=[(1, 8, 6)])


@pytest.mark.parametrize(
    "drafter,overrides",
    [
        ("batch_suffix", ["drafting.w=auto"]),
        ("mixed", ["drafting.w=5"]),
        ("context_ngram", ["drafting.w=4"]),
        ("vllm_suffix", ["drafting.w=8"]),
        ("vllm_ngram_gpu", ["drafting.w=5"]),
    ],
)
def test_the_jobs_drafters_become_speculative_configs_vllm_takes(model_dir, tmp_path, drafter, overrides):
    """What the job's engine hands vLLM 0.34 for each drafter that runs there (methods.py), built into
    vLLM's own SpeculativeConfig and ModelConfig (our options checked as vLLM builds its config)."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    from pipeline.config import load_config
    from pipeline.engines.vllm.methods import longest_draft, speculative_arguments, write_bigram_table
    from pipeline.loading.drafters import DrafterTables

    plugin.register()
    config = load_config(
        overrides=["engine.name=vllm", "ray.num_gpus_per_actor=1", f"drafting.drafter={drafter}", *overrides]
    )
    ours = not drafter.startswith("vllm_")
    write_bigram_table(DrafterTables(bigram=np.zeros((128, 2), dtype=np.int64)), tmp_path)
    arguments = speculative_arguments(config, longest_draft(config, ours), ours, tmp_path)
    model = ModelConfig(
        model=model_dir,
        skip_tokenizer_init=True,
        max_model_len=256,
        dtype="float32",
        logits_processors=arguments.get("logits_processors"),
    )
    spec = SpeculativeConfig(
        **arguments["speculative_config"], target_model_config=model, target_parallel_config=ParallelConfig()
    )
    # vLLM keeps a registered method as custom_method and runs it as its base (suffix: our config subclasses it)
    assert (spec.custom_method if ours else spec.method) == (
        plugin.METHOD if ours else arguments["speculative_config"]["method"]
    )
    assert spec.num_speculative_tokens == (8 if drafter == "batch_suffix" else config.drafting.w)
    if ours:
        assert ("bigram_table" in spec.speculator_options) == (drafter == "mixed")


def test_the_runners_calls_dummy_run_slots_recycled_and_reset(config):
    from vllm.v1.worker.gpu.spec_decode import init_speculator
    from vllm.v1.worker.gpu.states import RequestState

    states = RequestState(4, 256, 1024, 4, 128, torch.device("cpu"), use_dense_all_token_ids=True)
    speculator = init_speculator(config, torch.device("cpu"), states)
    assert isinstance(speculator, NgrammysSpeculator)
    batch = type("Batch", (), {"num_reqs": 3, "idx_mapping": torch.arange(3, dtype=torch.int32)})()
    drafts = speculator.propose(batch, None, None, None, None, None, None, None, None, None, None, dummy_run=True)
    assert drafts.shape == (3, 4) and drafts.dtype == torch.int64
    assert speculator.draft_token_confidence_probs.shape == (4, 4)
    speculator.add_request(2)
    speculator.drafter.set_prediction(2, [5, 6, 7])
    speculator.add_request(2)  # a recycled slot forgets its last occupant's prediction
    speculator.drafter.flush()
    assert int(speculator.drafter.prediction_len[2]) == 0
    speculator.reset_state()
    assert int(speculator.drafter.head[0]) == 0


def test_a_prediction_reaches_the_speculator_through_vllms_sampler(config):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.spec_decode import init_speculator
    from vllm.v1.worker.gpu.states import RequestState

    from pipeline.engines.vllm.v2.predictions import PredictionProcessor

    states = RequestState(4, 256, 1024, 4, 128, torch.device("cpu"), use_dense_all_token_ids=True)
    speculator = init_speculator(config, torch.device("cpu"), states)
    processor = PredictionProcessor(config, states)
    sampler = Sampler(config, 4, 128, torch.device("cpu"), states, custom_logits_processors=[processor])
    speculator.add_request(1)  # the runner's order: the speculator's slot first, then the sampler's request
    sampler.add_request(1, SamplingParams(extra_args={"prediction": [9, 8, 7, 6]}))
    speculator.drafter.flush()
    assert speculator.drafter.predictions[1, :4].tolist() == [9, 8, 7, 6]
    with pytest.raises(ValueError, match="prediction"):
        PredictionProcessor.validate_params(SamplingParams(extra_args={"prediction": "text"}))


def recorded(count: int, seed: int) -> list[Answer]:
    rows = answers(count, np.random.default_rng(seed))
    return [
        Answer(prompt.astype(np.int64), output.astype(np.int64), len(output), str(i), p)
        for i, (prompt, output, p) in enumerate(rows)
    ]


def test_a_decode_loop_through_vllms_post_update_drafts_as_the_reference():
    """Ours, in vLLM's RequestState + post_update + propose + on_requests_finished, held to the reference
    step by step; vLLM's suffix and ngram run the same loop."""
    from jobs.benchmark import speculators

    rows = recorded(10, 3)
    config_dir = speculators.tiny_model_dir(128, 128, __import__("pathlib").Path("/tmp/ngrammys-v2-test"))
    check = ReferenceCheck()
    results = {}
    for method in ("ngrammys", "suffix", "ngram"):
        config = vllm_config(method, 4, 4, 128, 128, {"max_depth": 8, "corpus_tokens": 2048}, config_dir)
        loop = DecodeLoop(
            config, rows, 4, 4, predictions=method == "ngrammys", reference=check if method == "ngrammys" else None
        )
        results[method] = loop.run()
    assert check.compared >= 40, check.compared
    assert all(result["request_steps"] > 0 for result in results.values()), results
