"""A model or a setting an engine cannot run is refused when the job starts, naming the model or
the field and the reason, instead of failing in every actor with every row lost; the engine's own
settings (its KIND, read through pipeline/engines/build.py) decide."""

import pytest

from pipeline.config import ConfigError, load_config
from pipeline.engines.build import (
    ModelRefused,
    check_engine_can_run,
    checked_config,
    concurrent_batches,
    drafts_from_predictions,
    engine_kind,
)


def test_the_transformers_engine_refuses_sliding_window_attention_at_start(tiny_gemma3_dir, tiny_model_dir, tmp_path):
    config = load_config(
        "configs/default.yaml", ["engine.name=transformers", f"model.name={tiny_gemma3_dir}", f"job.output={tmp_path}"]
    )
    with pytest.raises(
        ModelRefused,
        match=rf"model.name '{tiny_gemma3_dir}': engine.name transformers cannot decode "
        r"it: .*DynamicSlidingWindowLayer.*Use engine.name: vllm",
    ):
        check_engine_can_run(config, tiny_gemma3_dir)
    # The job fails at start too: tests/pipeline/job/test_ray_job.py.
    check_engine_can_run(
        load_config(overrides=["engine.name=transformers", f"model.name={tiny_model_dir}"]), tiny_model_dir
    )


def test_vllm_takes_what_transformers_refuses(tiny_gemma3_dir):
    check_engine_can_run(load_config(overrides=["engine.name=vllm", f"model.name={tiny_gemma3_dir}"]), tiny_gemma3_dir)


# --- The engine's own settings, checked when the job starts --------------------------------------


def batch_size(config):
    return engine_kind(config.engine.name).batch_size(config)


def started(*overrides):
    """The config as a job starts it (jobs/generate.py, the processor): loaded, then its engine's checks."""
    return checked_config(load_config("configs/default.yaml", list(overrides)))


@pytest.mark.parametrize(
    "override,field",
    [
        ("transformers.k=2", "transformers.k"),
        ("transformers.k=auto", "transformers.k"),
        ("transformers.verify=tree", "transformers.verify"),
        ("transformers.max_batch_tokens=64", "transformers.max_batch_tokens"),
        ("ray.num_gpus_per_actor=2", "ray.num_gpus_per_actor"),
    ],
)
def test_vllm_refuses_what_it_cannot_honour_naming_the_field(override, field):
    """What only the transformers engine does is refused on vLLM when the job starts, not silently
    run some other way; the config itself (below the engines) takes it."""
    load_config("configs/default.yaml", ["engine.name=vllm", override])
    with pytest.raises(ConfigError, match=rf"^{field}: must be .*engine.name"):
        started("engine.name=vllm", override)
    started("engine.name=transformers", override)


def test_vllm_refuses_lenience_and_the_draft_model():
    with pytest.raises(ConfigError, match=r"^transformers.lenience: must be 1 with engine.name vllm"):
        started("engine.name=vllm", "transformers.lenience=0.5")
    with pytest.raises(ConfigError, match="^drafting.drafter: must be a point drafter with engine.name vllm"):
        started("engine.name=vllm", "drafting.drafter=draft_model")
    with pytest.raises(ConfigError, match="^drafting.drafter: must be one of ours with engine.name transformers"):
        started("engine.name=transformers", "drafting.drafter=vllm_ngram")


def test_a_setting_the_engine_cannot_honour_fails_the_job_at_its_start():
    from jobs.generate import main

    with pytest.raises(ConfigError, match="^transformers.verify: must be 'batch' with engine.name vllm"):
        main(["--set", "engine.name=vllm", "--set", "transformers.verify=tree", "--show-config"])


def test_tensor_parallel_ranks_take_one_gpu_each_on_vllm_only():
    split = started("engine.name=vllm", "vllm.tensor_parallel_size=2", "ray.num_gpus_per_actor=2")
    assert (split.vllm.tensor_parallel_size, split.ray.num_gpus_per_actor) == (2, 2)
    with pytest.raises(ConfigError, match=r"^ray.num_gpus_per_actor: .*vllm.tensor_parallel_size \(2\)"):
        started("engine.name=vllm", "vllm.tensor_parallel_size=2", "ray.num_gpus_per_actor=1")
    with pytest.raises(ConfigError, match="^vllm.tensor_parallel_size: must be 1 with engine.name transformers"):
        started("engine.name=transformers", "vllm.tensor_parallel_size=2")
    with pytest.raises(ConfigError, match="^vllm.engine_args: must be empty with engine.name transformers"):
        started("engine.name=transformers", "vllm.engine_args={enable_prefix_caching: false}")
    with pytest.raises(ConfigError, match="^vllm.pipeline_parallel_size: must be 1: vLLM 0.32 cannot speculate"):
        started("engine.name=vllm", "vllm.pipeline_parallel_size=2")


def test_w_auto_goes_further_on_vllm_and_the_check_is_idempotent():
    from pipeline.config import AUTO_MAX
    from pipeline.engines.vllm.settings import AUTO_MAX_VLLM_W

    on_vllm = started("engine.name=vllm", "drafting.drafter=context_ngram", "drafting.w=auto")
    assert (on_vllm.drafting.w, on_vllm.drafting.auto_w) == (AUTO_MAX_VLLM_W, True) and AUTO_MAX_VLLM_W > AUTO_MAX["w"]
    assert checked_config(on_vllm) == on_vllm
    assert started("engine.name=transformers", "drafting.w=auto").drafting.w == AUTO_MAX["w"]
    assert started("engine.name=vllm", "drafting.w=3").drafting.w == 3


def test_engine_slots_are_apart_from_the_ray_batch():
    from pipeline.config import CPU_MAX_NUM_SEQS

    # On vLLM the Ray batch only sizes the blocks Ray moves: the engine's slots are its own.
    config = started("engine.name=vllm", "vllm.max_num_seqs=256", "ray.batch_size=64")
    assert config.vllm.max_num_seqs == 256
    assert concurrent_batches(config) == 13  # 3 x 256 slots in 64-row batches, plus one
    assert concurrent_batches(started("engine.name=vllm", "ray.batch_size=8")) == 3 * CPU_MAX_NUM_SEQS // 8 + 1
    assert concurrent_batches(started("engine.name=vllm", "ray.max_concurrent_batches=3")) == 3
    assert concurrent_batches(started("engine.name=transformers")) == 1
    # ray.batch_size auto (kept auto by the checks: a job grows it for a long run): a batch per vLLM
    # slot (4 in flight), 8 rows for the transformers engine
    assert started("engine.name=vllm").ray.batch_size == 0
    assert batch_size(started("engine.name=vllm")) == CPU_MAX_NUM_SEQS
    assert concurrent_batches(started("engine.name=vllm")) == 4
    assert batch_size(started("engine.name=vllm", "vllm.max_num_seqs=16")) == 16
    assert batch_size(started("engine.name=transformers")) == 8
    with pytest.raises(
        ConfigError, match="ray.max_concurrent_batches: must be 0 \\(auto\\) or 1 with engine.name transformers"
    ):
        started("engine.name=transformers", "ray.max_concurrent_batches=4")
    # the transformers engine's throughput mode is its own: vLLM takes any (its slots are vllm.max_num_seqs)
    assert started("engine.name=vllm", "transformers.max_batch_requests=8", "ray.batch_size=2").ray.batch_size == 2
    with pytest.raises(ConfigError, match="ray.batch_size: must be at least transformers.max_batch_requests"):
        started("engine.name=transformers", "transformers.max_batch_requests=8", "ray.batch_size=2")


def test_a_long_runs_auto_batches_grow_so_the_run_makes_at_most_a_thousand():
    from pipeline.engines.build import ACTOR_BATCHES, MAX_AUTO_BATCH, RUN_BATCHES, run_batch_size

    for batch in (batch_size(started("engine.name=vllm")), batch_size(started("engine.name=transformers"))):
        for actors in (1, 4, 16):
            most = min(RUN_BATCHES, ACTOR_BATCHES * actors)
            assert run_batch_size(batch, 20, actors) == batch  # a short run keeps the engine's batch
            for rows in (batch * most, batch * most + 1, 200_000, 1_000_000):
                grown = run_batch_size(batch, rows, actors)
                capped = grown == MAX_AUTO_BATCH // batch * batch
                assert grown % batch == 0 and (-(-rows // grown) <= most or capped), (batch, rows, actors)
                assert grown == batch or -(-rows // (grown - batch)) > most, (batch, rows, actors)  # no larger
            assert run_batch_size(batch, 10**9, actors) == MAX_AUTO_BATCH // batch * batch
    assert run_batch_size(64, 200_000, 1) == 1_024 and run_batch_size(64, 1_000_000, 16) == 1_024
    assert run_batch_size(8, 1_000_000, 8) == 1_000


def test_predictions_are_drafted_from_by_our_proposer_on_vllm_only():
    assert drafts_from_predictions(started("engine.name=vllm", "drafting.drafter=batch_suffix"))
    assert not drafts_from_predictions(started("engine.name=vllm", "drafting.drafter=vllm_ngram"))
    assert not drafts_from_predictions(started("engine.name=vllm", "drafting.drafter=batch_suffix", "drafting.w=0"))
    assert not drafts_from_predictions(started("engine.name=transformers", "drafting.drafter=batch_suffix"))


def test_each_engine_declares_the_sections_it_reads():
    """DecoderConfig is what every engine reads; a section one engine reads alone is its own."""
    assert "drafting" in engine_kind("vllm").sections and "drafting" in engine_kind("transformers").sections
    assert "transformers" not in engine_kind("vllm").sections and "transformers" in engine_kind("transformers").sections
