import pytest

from pipeline.config import load_config
from pipeline.stage import GenerationStage


@pytest.fixture(scope="module")
def stage(tiny_model_dir, tmp_path_factory):
    config = load_config(overrides=[f"model.name={tiny_model_dir}", "decoder.drafter=context_ngram",
                                    "decoder.max_new_tokens=12",
                                    f"model.cache_dir={tmp_path_factory.mktemp('cache')}"])
    return GenerationStage(config)


def test_every_row_comes_back_and_bad_rows_carry_an_error(stage):
    batch = {"id": ["good", "empty", "not-text", "too-long", "chat"],
             "prompt": ["def add(a, b):", "   ", 42, "word " * 1000,
                        [{"role": "user", "content": "Say hi"}]]}
    out = stage(batch).to_pydict()
    rows = dict(zip(out["id"], out["error"]))
    assert out["id"] == batch["id"]
    assert rows["good"] is None and rows["chat"] is None
    assert "request 'empty': the prompt is empty" in rows["empty"]
    assert "request 'not-text'" in rows["not-text"] and "int" in rows["not-text"]
    assert "request 'too-long'" in rows["too-long"] and "no room to generate" in rows["too-long"]
    good = out["id"].index("good")
    assert len(out["token_ids"][good]) == 12 and out["finish_reason"][good] == "length"
    assert out["num_target_calls"][good] >= 1 and out["drafter"][good] == "context_ngram"


def test_a_missing_input_column_is_named(stage):
    with pytest.raises(KeyError, match=r"missing column\(s\) \['prompt'\]"):
        stage({"id": ["a"]})
