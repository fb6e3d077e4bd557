import dataclasses

import pytest
import yaml

from pipeline.config import (AUTO_MAX, AUTO_MAX_VLLM_W, Config, ConfigError, DecoderConfig, EngineConfig, build,
                             load_config)


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults_load():
    config = load_config("configs/default.yaml")
    assert config.model.name == "smollm2-135m-instruct" and config.decoder.k >= 1


def test_unknown_key_is_named_with_the_allowed_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"decoder: unknown key\(s\) 'kk'; allowed: drafter, k, w"):
        load_config(write(tmp_path, "decoder:\n  kk: 3\n"))


def test_wrong_type_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match="decoder.k: must be an integer or 'auto', got 'four'"):
        load_config(write(tmp_path, "decoder:\n  k: four\n"))


def test_impossible_value_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match="decoder.k: must be an integer >= 1"):
        load_config(write(tmp_path, "decoder:\n  k: 0\n"))


def test_unknown_drafter_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="decoder.drafter: 'trigram' is not allowed; choose one of 'none', "
                                          "'context_ngram', 'unigram', 'bigram', 'extended_bigram', 'mixed', "
                                          "'draft_model'"):
        load_config(overrides=["decoder.drafter=trigram"])
    with pytest.raises(ConfigError, match="decoder.drafter: 'suffix' is not allowed \\('suffix' is now 'batch_suffix'"):
        load_config(overrides=["decoder.drafter=suffix"])


def test_overrides_are_typed_and_validated():
    config = load_config("configs/default.yaml", ["engine.name=transformers", "decoder.k=4", "decoder.stop=['END', '##']"])
    assert config.decoder.k == 4 and config.decoder.stop == ("END", "##")
    with pytest.raises(ConfigError, match="decoder.k: must be at most decoder.bigram_top_k"):
        load_config(overrides=["engine.name=transformers", "decoder.drafter=mixed", "decoder.k=64"])
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(overrides=["decoder.k"])


def test_sampling_settings_are_validated():
    config = load_config(overrides=["decoder.temperature=0.7", "decoder.top_p=0.9", "decoder.seed=5"])
    assert (config.decoder.temperature, config.decoder.top_p, config.decoder.seed) == (0.7, 0.9, 5)
    with pytest.raises(ConfigError, match=r"decoder.top_p: must be a number in \(0, 1\]"):
        load_config(overrides=["decoder.top_p=1.5"])
    with pytest.raises(ConfigError, match="decoder.temperature: must be a number >= 0"):
        load_config(overrides=["decoder.temperature=-1"])


def test_lenience_is_an_explicit_option_of_the_draft_model_only():
    config = load_config(overrides=["engine.name=transformers", "decoder.drafter=draft_model", "decoder.k=1",
                                    "decoder.lenience=0.5"])
    assert config.decoder.lenience == 0.5
    with pytest.raises(ConfigError, match="decoder.lenience: must be 1 unless decoder.drafter is 'draft_model'"):
        load_config(overrides=["decoder.drafter=context_ngram", "decoder.lenience=0.5"])
    with pytest.raises(ConfigError, match="decoder.k: must be 1 with drafter 'draft_model'"):
        load_config(overrides=["engine.name=transformers", "decoder.drafter=draft_model", "decoder.k=2"])


def test_throughput_mode_settings_are_checked():
    from pipeline.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="ray.batch_size: must be at least decoder.max_batch_requests"):
        load_config(overrides=["engine.name=transformers", "decoder.max_batch_requests=8", "ray.batch_size=2"])
    with pytest.raises(ConfigError, match="decoder.max_batch_requests"):
        load_config(overrides=["engine.name=transformers", "decoder.drafter=draft_model", "decoder.k=1",
                               "decoder.max_batch_requests=2", "ray.batch_size=4"])
    config = load_config(overrides=["decoder.max_batch_requests=8", "ray.batch_size=32"])
    assert config.decoder.max_batch_requests == 8


def test_engine_slots_are_apart_from_the_ray_batch():
    from pipeline.config import CPU_MAX_NUM_SEQS, concurrent_batches

    # On vLLM the Ray batch only sizes the blocks Ray moves: the engine's slots are its own.
    config = load_config(overrides=["engine.name=vllm", "engine.max_num_seqs=256", "ray.batch_size=64"])
    assert config.engine.max_num_seqs == 256
    assert concurrent_batches(config) == 13  # 3 x 256 slots in 64-row batches, plus one
    assert concurrent_batches(load_config(overrides=["engine.name=vllm", "ray.batch_size=8"])) == \
        3 * CPU_MAX_NUM_SEQS // 8 + 1
    assert concurrent_batches(load_config(overrides=["engine.name=vllm", "ray.max_concurrent_batches=3"])) == 3
    assert concurrent_batches(load_config(overrides=["engine.name=transformers"])) == 1
    with pytest.raises(ConfigError, match="ray.max_concurrent_batches: must be 0 \\(auto\\) or 1 with engine.name transformers"):
        load_config(overrides=["engine.name=transformers", "ray.max_concurrent_batches=4"])
    with pytest.raises(ConfigError, match="engine.max_num_seqs: must be an integer >= 0"):
        load_config(overrides=["engine.max_num_seqs=-1"])
    with pytest.raises(ConfigError, match="engine.max_num_batched_tokens: must be an integer >= 0"):
        load_config(overrides=["engine.max_num_batched_tokens=-5"])
    for override, message in (("engine.max_restarts=-1", "engine.max_restarts: must be an integer >= 0"),
                              ("engine.hang_timeout_s=-1", "engine.hang_timeout_s: must be a number of seconds >= 0"),
                              ("engine.restart_window_s=0", "engine.restart_window_s: must be a number of seconds > 0")):
        with pytest.raises(ConfigError, match=message):
            load_config(overrides=[override])
    assert load_config(overrides=["engine.name=vllm", "decoder.max_batch_requests=8", "ray.batch_size=2"]).ray.batch_size == 2


def test_model_dtype_auto_is_float32_without_a_gpu():
    from pipeline.model_loading import dtype_name

    config = load_config("configs/default.yaml")
    assert config.model.dtype == "auto" and dtype_name(config.model) == "float32"  # no GPU in this process
    assert dtype_name(load_config(overrides=["model.dtype=bfloat16"]).model) == "bfloat16"


def test_engine_auto_is_vllm_where_it_is_installed_and_is_recorded_resolved():
    from pipeline.config import installed_engine

    assert load_config("configs/default.yaml").engine.name == installed_engine()
    assert load_config(overrides=["engine.name=transformers"]).engine.name == "transformers"
    with pytest.raises(ConfigError, match="engine.name: 'gpu' is not allowed; choose one of 'auto', 'vllm', 'transformers'"):
        load_config(overrides=["engine.name=gpu"])


@pytest.mark.parametrize("override,field", [
    ("decoder.k=2", "decoder.k"), ("decoder.k=auto", "decoder.k"), ("decoder.verify=tree", "decoder.verify"),
    ("decoder.max_batch_tokens=64", "decoder.max_batch_tokens"), ("ray.num_gpus_per_actor=2", "ray.num_gpus_per_actor")])
def test_vllm_refuses_what_it_cannot_honour_naming_the_field(override, field):
    """What only the transformers engine does is refused on vLLM, not silently run some other way."""
    with pytest.raises(ConfigError, match=rf"^{field}: must be .*engine.name"):
        load_config("configs/default.yaml", ["engine.name=vllm", override])
    load_config("configs/default.yaml", ["engine.name=transformers", override])


def test_tensor_parallel_ranks_take_one_gpu_each_on_vllm_only():
    split = load_config("configs/default.yaml", ["engine.name=vllm", "engine.tensor_parallel_size=2",
                                                 "ray.num_gpus_per_actor=2"])
    assert (split.engine.tensor_parallel_size, split.ray.num_gpus_per_actor) == (2, 2)
    with pytest.raises(ConfigError, match=r"^ray.num_gpus_per_actor: .*engine.tensor_parallel_size \(2\)"):
        load_config("configs/default.yaml", ["engine.name=vllm", "engine.tensor_parallel_size=2",
                                             "ray.num_gpus_per_actor=1"])
    with pytest.raises(ConfigError, match="^engine.tensor_parallel_size: must be 1 with engine.name transformers"):
        load_config("configs/default.yaml", ["engine.name=transformers", "engine.tensor_parallel_size=2"])
    with pytest.raises(ConfigError, match="^engine.pipeline_parallel_size: must be 1: vLLM 0.32 cannot speculate"):
        load_config("configs/default.yaml", ["engine.name=vllm", "engine.pipeline_parallel_size=2"])


def test_vllm_refuses_the_draft_model():
    with pytest.raises(ConfigError, match="decoder.drafter: must be a point drafter with engine.name vllm"):
        load_config(overrides=["engine.name=vllm", "decoder.drafter=draft_model"])


def test_a_draft_model_with_tree_verification_is_refused_not_run_as_batch():
    with pytest.raises(ConfigError, match=r"decoder.verify: must be 'batch' with drafter 'draft_model'"):
        load_config(overrides=["engine.name=transformers", "decoder.drafter=draft_model", "decoder.k=1",
                               "decoder.max_batch_requests=1", "ray.batch_size=1", "decoder.verify=tree"])


def test_placement_and_series_settings_are_checked_naming_the_field():
    assert load_config(overrides=["ray.accelerator_type=A100"]).ray.accelerator_type == "A100"
    with pytest.raises(ConfigError, match="ray.accelerator_type: must be one of Ray's accelerator names"):
        load_config(overrides=["ray.accelerator_type=A1OO"])
    with pytest.raises(ConfigError, match="ray.wait_for_actors_s: must be a number of seconds > 0"):
        load_config(overrides=["ray.wait_for_actors_s=0"])
    with pytest.raises(ConfigError, match="job.series: must be a name without"):
        load_config(overrides=["job.series=a/b"])
    with pytest.raises(ConfigError, match="decoder.suffix_min_probability: must be a number in"):
        load_config(overrides=["decoder.suffix_min_probability=0"])
    with pytest.raises(ConfigError, match=r"decoder.suffix_max_match: must be an integer >= decoder.ngram_max_q \(3\)"):
        load_config(overrides=["decoder.suffix_max_match=2"])
    with pytest.raises(ConfigError, match=r"decoder.suffix_min_match: must be an integer from 1 to decoder.ngram_max_q \(3\)"):
        load_config(overrides=["decoder.suffix_min_match=4"])


def test_vllm_args_refuse_what_the_config_sets_naming_the_field():
    with pytest.raises(ConfigError, match="^engine.vllm_args.max_num_seqs: must be left out: engine.max_num_seqs sets it"):
        load_config("configs/default.yaml", ["engine.name=vllm", "engine.vllm_args={max_num_seqs: 4}"])
    with pytest.raises(ConfigError, match="^engine.vllm_args: must be a mapping"):
        load_config("configs/default.yaml", ["engine.name=vllm", "engine.vllm_args=[1]"])
    config = load_config("configs/default.yaml", ["engine.name=vllm", "engine.vllm_args={enable_prefix_caching: false}"])
    assert config.engine.vllm_args == {"enable_prefix_caching": False}


def _leaves(mapping: dict, prefix: str = ""):
    for key, value in mapping.items():
        if isinstance(value, dict) and not prefix:
            yield from _leaves(value, key)
        else:
            yield f"{prefix}.{key}", value


def test_the_demo_config_holds_only_what_it_changes_from_the_defaults():
    """The dataclasses hold every default: configs/default.yaml may set only what differs."""
    data = yaml.safe_load(open("configs/default.yaml"))
    defaults = Config()
    leaves = dict(_leaves(data))
    assert leaves, "the demo config sets nothing"
    for name, value in leaves.items():
        section, key = name.split(".")
        assert getattr(getattr(defaults, section), key) != value, f"{name} repeats its default {value!r}"


def test_auto_is_resolved_by_the_classes_the_same_for_every_caller():
    assert DecoderConfig().auto_w and DecoderConfig().w == AUTO_MAX["w"]
    assert DecoderConfig(w="auto", k="auto").auto_k
    assert build(Config, {"engine": {"name": "vllm"}, "decoder": {"w": "auto"}}).decoder.w == AUTO_MAX_VLLM_W
    assert load_config(None, ["engine.name=vllm"]).decoder == Config(engine=EngineConfig(name="vllm")).decoder
    assert not load_config(None, ["decoder.w=3"]).decoder.auto_w
    with pytest.raises(ConfigError, match="decoder.w: must be an integer or 'auto'"):
        load_config(None, ["decoder.w=always"])


@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_show_config_prints_every_setting_and_reads_back_the_same(tmp_path, engine):
    from jobs.generate import config_yaml

    config = load_config("configs/default.yaml", ["decoder.stop=['END']", f"engine.name={engine}"])
    text = config_yaml(config)
    (tmp_path / "all.yaml").write_text(text)
    assert load_config(tmp_path / "all.yaml") == config
    # `w: auto` as such (not the engine's limit), so the file reads right on the other engine too
    assert yaml.safe_load(text)["decoder"]["w"] == "auto"
    other = "vllm" if engine == "transformers" else "transformers"
    assert load_config(tmp_path / "all.yaml", [f"engine.name={other}"]).decoder.w == load_config(
        None, [f"engine.name={other}"]).decoder.w
    every_field = sum(len(dataclasses.fields(getattr(config, section.name))) for section in dataclasses.fields(config))
    assert len(list(_leaves(yaml.safe_load(text)))) == every_field - 2  # auto_k, auto_w: said by k and w
