"""A model an engine cannot run is refused when the job starts, naming the model and the reason,
instead of failing in every actor with every row lost."""
import pytest

from pipeline.config import load_config
from pipeline.engines.build import ModelRefused, check_engine_can_run


def test_the_transformers_engine_refuses_sliding_window_attention_at_start(tiny_gemma3_dir, tiny_model_dir, tmp_path):
    config = load_config("configs/default.yaml", ["engine.name=transformers", f"model.name={tiny_gemma3_dir}",
                                                  f"job.output={tmp_path}"])
    with pytest.raises(ModelRefused, match=rf"model.name '{tiny_gemma3_dir}': engine.name transformers cannot decode "
                                           r"it: .*DynamicSlidingWindowLayer.*Use engine.name: vllm"):
        check_engine_can_run(config, tiny_gemma3_dir)
    # The job fails at start too: tests/pipeline/test_ray_job.py.
    check_engine_can_run(load_config(overrides=["engine.name=transformers", f"model.name={tiny_model_dir}"]),
                         tiny_model_dir)


def test_vllm_takes_what_transformers_refuses(tiny_gemma3_dir):
    check_engine_can_run(load_config(overrides=["engine.name=vllm", f"model.name={tiny_gemma3_dir}"]), tiny_gemma3_dir)
