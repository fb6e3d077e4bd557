import dataclasses
import json

import pytest
import yaml

from pipeline.config import (
    AUTO_MAX,
    Config,
    ConfigError,
    DraftingConfig,
    EngineConfig,
    TransformersConfig,
    build,
    load_config,
)
from pipeline.engines.build import checked_config


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults_load():
    config = load_config("configs/default.yaml")
    assert config.model.name == "smollm2-135m-instruct" and config.transformers.k >= 1


def test_unknown_key_is_named_with_the_allowed_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"drafting: unknown key\(s\) 'kk'; allowed: drafter, w, speculation,"):
        load_config(write(tmp_path, "drafting:\n  kk: 3\n"))
    with pytest.raises(
        ConfigError, match=r"^decoder: the section is no more; its keys are in drafting, sampling, transformers now$"
    ):
        load_config(write(tmp_path, "decoder:\n  kk: 3\n"))
    with pytest.raises(ConfigError, match=r"^drafting.auto_w is resolved, not set: set drafting.w: auto$"):
        load_config(write(tmp_path, "drafting:\n  auto_w: true\n"))


def test_wrong_type_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match="transformers.k: must be an integer or 'auto', got 'four'"):
        load_config(write(tmp_path, "transformers:\n  k: four\n"))


def test_impossible_value_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match="transformers.k: must be an integer >= 1"):
        load_config(write(tmp_path, "transformers:\n  k: 0\n"))


# decoder.<key> -> (its section now, a value)
MOVED = {
    "k": ("transformers", 4),
    "verify": ("transformers", "tree"),
    "lenience": ("transformers", 0.5),
    "max_batch_requests": ("transformers", 2),
    "max_batch_tokens": ("transformers", 64),
    "draft_model": ("transformers", "self"),
    "draft_layers": ("transformers", 2),
    "max_new_tokens": ("sampling", 16),
    "n": ("sampling", 2),
    "stop": ("sampling", ["\n\n"]),
    "temperature": ("sampling", 0.5),
    "top_k": ("sampling", 5),
    "top_p": ("sampling", 0.9),
    "seed": ("sampling", 7),
}


@pytest.mark.parametrize("key", sorted(MOVED))
def test_a_key_that_moved_out_of_the_decoder_section_is_refused_naming_its_new_key(tmp_path, key):
    """The transformers engine's settings and the sampling settings are sections of their own:
    decoder.<key> fails at load, in a file, in --set and in a Config built from a mapping alike,
    naming its new key."""
    section, value = MOVED[key]
    message = rf"^decoder.{key} moved to {section}.{key}: set {section}.{key} instead$"
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, yaml.safe_dump({"decoder": {key: value}})))
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"decoder.{key}={json.dumps(value)}"])
    with pytest.raises(ConfigError, match=message):
        build(Config, {"decoder": {key: value}})
    moved = load_config(None, ["engine.name=transformers", f"{section}.{key}={json.dumps(value)}"])
    assert getattr(getattr(moved, section), key) == (tuple(value) if isinstance(value, list) else value)


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [
        ("engine.max_num_seqs", "vllm.max_num_seqs", 8),
        ("engine.vllm_args", "vllm.engine_args", {"kv_cache_dtype": "auto"}),
        ("engine.speculation", "drafting.speculation", "off"),
        ("engine.prediction_w", "drafting.prediction_w", 0),
    ],
)
def test_a_key_that_moved_out_of_the_engine_section_is_refused_naming_its_new_key(old, new, value):
    """The engine section says which engine and what its failures may cost; vLLM's own settings are
    the vllm section, the speculation mode the drafting section's."""
    with pytest.raises(ConfigError, match=rf"^{old} moved to {new}: set {new} instead$"):
        load_config(None, [f"{old}={json.dumps(value)}"])
    section, key = new.split(".")
    assert getattr(getattr(load_config(None, [f"{new}={json.dumps(value)}"]), section), key) == value


def test_unknown_drafter_lists_the_valid_ones():
    with pytest.raises(
        ConfigError,
        match="drafting.drafter: 'trigram' is not allowed; choose one of 'none', "
        "'context_ngram', 'unigram', 'bigram', 'extended_bigram', 'mixed', "
        "'draft_model'",
    ):
        load_config(overrides=["drafting.drafter=trigram"])
    with pytest.raises(
        ConfigError, match="drafting.drafter: 'suffix' is not allowed \\('suffix' is now 'batch_suffix'"
    ):
        load_config(overrides=["drafting.drafter=suffix"])


def test_overrides_are_typed_and_validated():
    config = load_config(
        "configs/default.yaml", ["engine.name=transformers", "transformers.k=4", "sampling.stop=['END', '##']"]
    )
    assert config.transformers.k == 4 and config.sampling.stop == ("END", "##")
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(overrides=["drafting.w"])


def test_sampling_settings_are_validated():
    config = load_config(overrides=["sampling.temperature=0.7", "sampling.top_p=0.9", "sampling.seed=5"])
    assert (config.sampling.temperature, config.sampling.top_p, config.sampling.seed) == (0.7, 0.9, 5)
    with pytest.raises(ConfigError, match=r"sampling.top_p: must be a number in \(0, 1\]"):
        load_config(overrides=["sampling.top_p=1.5"])
    with pytest.raises(ConfigError, match="sampling.temperature: must be a number >= 0"):
        load_config(overrides=["sampling.temperature=-1"])


@pytest.mark.parametrize(
    "override,message",
    [
        ("transformers.lenience=0", r"transformers.lenience: must be a number in \(0, 1\]"),
        ("transformers.max_batch_requests=0", "transformers.max_batch_requests: must be an integer >= 1"),
        ("transformers.max_batch_tokens=1", r"transformers.max_batch_tokens: must be 0 \(no cap\) or at least"),
        ("transformers.draft_layers=0", "transformers.draft_layers: must be an integer >= 1"),
        ("transformers.verify=graph", "transformers.verify: 'graph' is not allowed; choose one of 'batch', 'tree'"),
    ],
)
def test_the_transformers_section_checks_its_own_shape_at_load(override, message):
    """Its fields on their own, whatever the engine (what it refuses with other sections is the
    engine's: tests/pipeline/engines/transformers/test_settings.py)."""
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])


def test_throughput_mode_defaults_follow_the_drafter():
    assert load_config(overrides=["drafting.drafter=context_ngram"]).transformers.max_batch_requests == 4
    assert load_config(overrides=["drafting.drafter=draft_model"]).transformers.max_batch_requests == 1
    config = load_config(overrides=["transformers.max_batch_requests=8", "ray.batch_size=32"])
    assert config.transformers.max_batch_requests == 8


def test_engine_settings_check_their_own_shape_at_load():
    with pytest.raises(ConfigError, match="vllm.max_num_seqs: must be an integer >= 0"):
        load_config(overrides=["vllm.max_num_seqs=-1"])
    with pytest.raises(ConfigError, match="vllm.max_num_batched_tokens: must be an integer >= 0"):
        load_config(overrides=["vllm.max_num_batched_tokens=-5"])
    for override, message in (
        ("engine.max_restarts=-1", "engine.max_restarts: must be an integer >= 0"),
        ("engine.hang_timeout_s=-1", "engine.hang_timeout_s: must be a number of seconds >= 0"),
        ("engine.restart_window_s=0", "engine.restart_window_s: must be a number of seconds > 0"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(overrides=[override])
    # What an engine cannot honour is its own check, when the job starts (tests/pipeline/engines/test_build.py)
    assert (
        load_config(overrides=["engine.name=transformers", "ray.max_concurrent_batches=4"]).ray.max_concurrent_batches
        == 4
    )


def test_model_dtype_auto_is_float32_without_a_gpu():
    from pipeline.loading.model import dtype_name

    config = load_config("configs/default.yaml")
    assert config.model.dtype == "auto" and dtype_name(config.model) == "float32"  # no GPU in this process
    assert dtype_name(load_config(overrides=["model.dtype=bfloat16"]).model) == "bfloat16"


def test_engine_auto_is_vllm_where_it_is_installed_and_is_recorded_resolved():
    from pipeline.config import installed_engine

    assert load_config("configs/default.yaml").engine.name == installed_engine()
    assert load_config(overrides=["engine.name=transformers"]).engine.name == "transformers"
    with pytest.raises(
        ConfigError, match="engine.name: 'gpu' is not allowed; choose one of 'auto', 'vllm', 'transformers'"
    ):
        load_config(overrides=["engine.name=gpu"])


def test_placement_and_series_settings_are_checked_naming_the_field():
    assert load_config(overrides=["ray.accelerator_type=A100"]).ray.accelerator_type == "A100"
    with pytest.raises(ConfigError, match="ray.accelerator_type: must be one of Ray's accelerator names"):
        load_config(overrides=["ray.accelerator_type=A1OO"])
    with pytest.raises(ConfigError, match="ray.wait_for_actors_s: must be a number of seconds > 0"):
        load_config(overrides=["ray.wait_for_actors_s=0"])
    with pytest.raises(ConfigError, match="job.series: must be a name without"):
        load_config(overrides=["job.series=a/b"])
    with pytest.raises(ConfigError, match="drafting.suffix.min_probability: must be a number in"):
        load_config(overrides=["drafting.suffix.min_probability=0"])
    with pytest.raises(
        ConfigError, match=r"drafting.suffix.max_match: must be an integer >= drafting.ngram.max_q \(3\)"
    ):
        load_config(overrides=["drafting.suffix.max_match=2"])
    with pytest.raises(
        ConfigError, match=r"drafting.suffix.min_match: must be an integer from 1 to drafting.ngram.max_q \(3\)"
    ):
        load_config(overrides=["drafting.suffix.min_match=4"])


def test_vllm_args_refuse_what_the_config_sets_naming_the_field():
    with pytest.raises(
        ConfigError, match="^vllm.engine_args.max_num_seqs: must be left out: vllm.max_num_seqs sets it"
    ):
        load_config("configs/default.yaml", ["engine.name=vllm", "vllm.engine_args={max_num_seqs: 4}"])
    with pytest.raises(ConfigError, match="^vllm.engine_args: must be a mapping"):
        load_config("configs/default.yaml", ["engine.name=vllm", "vllm.engine_args=[1]"])
    config = load_config(
        "configs/default.yaml", ["engine.name=vllm", "vllm.engine_args={enable_prefix_caching: false}"]
    )
    assert config.vllm.engine_args == {"enable_prefix_caching": False}


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
    assert DraftingConfig().auto_w and DraftingConfig().w == AUTO_MAX["w"]
    assert TransformersConfig(k="auto").auto_k and TransformersConfig(k="auto").k == AUTO_MAX["k"]
    assert build(Config, {"engine": {"name": "vllm"}, "drafting": {"w": "auto"}}).drafting.w == AUTO_MAX["w"]
    assert load_config(None, ["engine.name=vllm"]).drafting == Config(engine=EngineConfig(name="vllm")).drafting
    assert checked_config(load_config(None, ["engine.name=vllm"])) == checked_config(
        Config(engine=EngineConfig(name="vllm"))
    )
    assert not load_config(None, ["drafting.w=3"]).drafting.auto_w
    with pytest.raises(ConfigError, match="drafting.w: must be an integer or 'auto'"):
        load_config(None, ["drafting.w=always"])


@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_show_config_prints_every_setting_and_reads_back_the_same(tmp_path, engine):
    from jobs.generate import config_yaml

    config = load_config("configs/default.yaml", ["sampling.stop=['END']", f"engine.name={engine}"])
    text = config_yaml(config)
    (tmp_path / "all.yaml").write_text(text)
    assert load_config(tmp_path / "all.yaml") == config
    # `w: auto` as such (not the engine's limit), so the file reads right on the other engine too
    assert yaml.safe_load(text)["drafting"]["w"] == "auto"
    other = "vllm" if engine == "transformers" else "transformers"
    assert (
        checked_config(load_config(tmp_path / "all.yaml", [f"engine.name={other}"])).drafting.w
        == checked_config(load_config(None, [f"engine.name={other}"])).drafting.w
    )
    started = checked_config(load_config(None, ["transformers.k=auto", "engine.name=transformers"]))
    assert yaml.safe_load(config_yaml(started))["transformers"]["k"] == "auto"
    every_field = sum(len(dataclasses.fields(getattr(config, section.name))) for section in dataclasses.fields(config))
    assert len(list(_leaves(yaml.safe_load(text)))) == every_field - 2  # auto_k, auto_w: said by k and w
