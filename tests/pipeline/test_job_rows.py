"""The job's rows as the processor's: the preprocess's mapping (no model needed), the postprocess's
error rows, and a processor's rows named by their id."""
import pyarrow as pa
import pytest

from pipeline.config import load_config
from pipeline.job_rows import output_row, output_table, request_row
from pipeline.output import SCHEMA
from pipeline.rows import INFERENCE_ERROR
from pipeline.sampling import request_seed


@pytest.fixture(scope="module")
def config():
    return load_config(overrides=["decoder.max_new_tokens=7", "decoder.temperature=0.5", "decoder.top_p=0.9",
                                  "decoder.seed=3", "input.id_column=uid"])


def test_a_job_row_becomes_messages_or_a_prompt_with_the_configs_settings(config):
    convert = request_row(config)
    text = convert({"uid": 12, "prompt": "Hi", "messages": [{"role": "user", "content": "not this"}],
                    "model": "elsewhere", "top_k": 5})
    # Input columns named like the processor's take no part: the job's prompt column is the prompt.
    assert (text["id"], text["prompt"], text["messages"], text["model"], text["tokenized_prompt"]) == ("12", "Hi", None,
                                                                                                      None, None)
    assert text["sampling_params"] == {"max_tokens": 7, "temperature": 0.5, "top_k": 5, "top_p": 0.9, "stop": [],
                                       "seed": request_seed(3, "12")}
    chat = convert({"uid": "c", "prompt": [{"role": "user", "content": "Hi"}], "max_new_tokens": 2.0, "seed": 9,
                    "temperature": float("nan")})  # NaN: a null in a pandas block
    assert chat["messages"] == [{"role": "user", "content": "Hi"}] and chat["prompt"] is None
    assert (chat["sampling_params"]["max_tokens"], chat["sampling_params"]["seed"]) == (2.0, 9)
    assert chat["sampling_params"]["temperature"] == 0.5


def test_an_error_row_is_written_with_its_generated_columns_null():
    failed = output_row({"id": "x", "generated_text": "", "generated_tokens": [], "num_generated_tokens": 0,
                         "num_input_tokens": 0, INFERENCE_ERROR: "row 'x': why", "drafter": "mixed"})
    assert failed["error"] == "row 'x': why" and failed["drafter"] == "mixed"
    assert all(failed[name] is None for name in ("text", "token_ids", "generated_text", "num_generated_tokens",
                                                 "num_input_tokens"))
    good = output_row({"id": "y", "generated_text": "ok", "generated_tokens": [1], INFERENCE_ERROR: ""})
    assert (good["text"], good["token_ids"], good["error"]) == ("ok", [1], None)
    table = output_table(pa.Table.from_pylist([{"id": "y", "generated_text": "ok", INFERENCE_ERROR: "", "extra": 1}]))
    assert table.schema == SCHEMA  # the job's schema, whatever else the row held


def test_a_processor_with_an_id_column_names_rows_by_their_id(tiny_model_dir):
    from pipeline.llm import vLLMEngineProcessorConfig
    from pipeline.stage import GenerationStage, rows_table

    config = vLLMEngineProcessorConfig(model_source=str(tiny_model_dir), engine="transformers")
    stage = GenerationStage(config.pipeline_config(), continue_on_error=True, id_column="item")
    rows = [{"item": 5, "prompt": "Hi", "sampling_params": {"max_tokens": 0}},
            {"item": None, "prompt": "Hi", "sampling_params": {"max_tokens": 2}}]
    bad, unnamed = stage(rows_table(rows)).to_pylist()
    assert bad[INFERENCE_ERROR].startswith("row '5': sampling_params.max_tokens must be")
    assert "has no 'item'" in unnamed[INFERENCE_ERROR]


def test_the_job_encodes_prompts_as_it_always_has(tiny_model_dir, tmp_path):
    """A job row's prompt is encoded by pipeline/prompts.encode_prompt (the chat template's own token
    ids, the generation prompt after any last message), its message checks included; a processor
    row with the same messages is templated as ray.data.llm does."""
    from pipeline.job_rows import generate, job_stage
    from pipeline.prompts import encode_prompt

    config = load_config(overrides=["engine.name=transformers", f"model.name={tiny_model_dir}", "decoder.max_new_tokens=2"])
    stage = job_stage(config)
    prefill = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    out = generate(stage, {"id": ["text", "prefill", "no-content", "inf"],
                           "prompt": ["Say hi", prefill, [{"role": "user"}], "Say hi"],
                           "max_new_tokens": [None, None, None, float("inf")]}).to_pydict()
    tokenizer = stage.engine.tokenizer
    assert out["prompt_token_ids"][:2] == [encode_prompt(tokenizer, "Say hi", "text"), encode_prompt(tokenizer, prefill, "p")]
    assert out["error"][:2] == [None, None]
    assert "row 'no-content': message 0 needs a string 'role' and 'content'" in out["error"][2]
    assert "row 'inf': sampling_params.max_tokens must be an integer >= 1, got inf" in out["error"][3]
