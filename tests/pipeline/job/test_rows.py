"""The job's rows as the processor's: the preprocess's mapping (no model needed), the postprocess's
schema, and one prompt rule and one seed rule for the job and the processor alike."""

import pytest

from pipeline.config import load_config
from pipeline.job.rows import output_table, request_row
from pipeline.llm.row_values import rows_table
from drafters.primitives.sampling import request_seed
from pipeline.llm.schema import INFERENCE_ERROR, JOB_SCHEMA
from tests.job_in_process import generate, job_stage


@pytest.fixture(scope="module")
def config():
    return load_config(
        overrides=[
            "sampling.max_new_tokens=7",
            "sampling.temperature=0.5",
            "sampling.top_p=0.9",
            "sampling.seed=3",
            "input.id_column=uid",
        ]
    )


def test_a_job_row_becomes_messages_or_a_prompt_with_the_configs_settings(config):
    convert = request_row(config)
    text = convert(
        {
            "uid": 12,
            "prompt": "Hi",
            "messages": [{"role": "user", "content": "not this"}],
            "model": "elsewhere",
            "top_k": 5,
        }
    )
    # Input columns named like the processor's take no part: the job's prompt column is the prompt.
    assert (text["id"], text["prompt"], text["messages"], text["model"], text["tokenized_prompt"]) == (
        "12",
        "Hi",
        None,
        None,
        None,
    )
    # No seed: the stage derives it from sampling.seed and the id, as it does a processor's row.
    assert text["sampling_params"] == {
        "max_tokens": 7,
        "temperature": 0.5,
        "top_k": 5,
        "top_p": 0.9,
        "stop": [],
        "n": 1,
    }
    chat = convert(
        {
            "uid": "c",
            "prompt": [{"role": "user", "content": "Hi"}],
            "max_new_tokens": 2.0,
            "seed": 9,
            "temperature": float("nan"),
        }
    )  # NaN: a null in a pandas block
    assert chat["messages"] == [{"role": "user", "content": "Hi"}] and chat["prompt"] is None
    assert (chat["sampling_params"]["max_tokens"], chat["sampling_params"]["seed"]) == (2.0, 9)
    assert chat["sampling_params"]["temperature"] == 0.5


def test_a_row_is_changed_where_its_id_had_an_output_and_predicted_from_says_what_is_drafted_from(config):
    from pipeline.job.series import LAST_OUTPUT

    convert = request_row(config)  # the vLLM engine, the default drafter: predictions are drafted from
    last = convert({"uid": 1, "prompt": "Hi", LAST_OUTPUT: "before"})
    own = convert({"uid": 2, "prompt": "Hi", LAST_OUTPUT: "before", "prediction": "mine"})
    new = convert({"uid": 3, "prompt": "Hi"})
    assert [(row["prediction"], row["predicted_from"], row["changed"]) for row in (last, own, new)] == [
        ("before", "last_output", True),
        ("mine", "row", True),
        (None, None, False),
    ]
    plain = request_row(load_config(overrides=["engine.name=transformers"]))(
        {"id": 1, "prompt": "Hi", LAST_OUTPUT: "x"}
    )
    assert (plain["prediction"], plain["predicted_from"], plain["changed"]) == ("x", None, True)
    openai = convert({"uid": 4, "prompt": "Hi", "prediction": {"type": "content", "content": "theirs"}})
    assert (openai["prediction"], openai["predicted_from"]) == ("theirs", "row")  # OpenAI's form, as its text
    odd = convert({"uid": 5, "prompt": "Hi", "prediction": {"type": "image"}})
    assert odd["prediction"] == {"type": "image"}  # left for the stage to name in the row's error


def test_predicted_from_is_null_where_the_mode_that_ran_the_row_drafts_from_no_prediction():
    """drafting.speculation auto may run a row plain (drafter none) or with vLLM's own method: the
    prediction was not drafted from, whatever the preprocess expected."""
    rows = [
        {"id": str(i), INFERENCE_ERROR: "", "drafter": drafter, "predicted_from": "last_output"}
        for i, drafter in enumerate(["batch_suffix", "none", "vllm_ngram_gpu"])
    ]
    assert [row["predicted_from"] for row in output_table(rows_table(rows)).to_pylist()] == ["last_output", None, None]


def test_the_postprocess_writes_the_jobs_schema_with_each_rows_error_or_none():
    rows = [
        {
            "id": "y",
            "generated_text": "ok",
            "generated_tokens": [1],
            INFERENCE_ERROR: "",
            "extra": 1,
            "params": "SamplingParams(...)",
        },
        {
            "id": "x",
            "generated_text": "",
            "generated_tokens": [],
            "num_generated_tokens": 0,
            INFERENCE_ERROR: "row 'x': why",
            "drafter": "mixed",
        },
    ]
    good, failed = output_table(rows_table(rows)).to_pylist()
    assert (good["generated_text"], good["generated_tokens"], good["error"]) == ("ok", [1], None)
    assert failed["error"] == "row 'x': why" and failed["drafter"] == "mixed"
    assert (failed["generated_text"], failed["num_generated_tokens"]) == ("", 0)  # as the processor's error row
    table = output_table(rows_table(rows))
    assert table.schema == JOB_SCHEMA  # the job's schema, whatever else the row held
    assert not {"text", "token_ids", "num_prompt_tokens", "params", "prompt", INFERENCE_ERROR} & set(table.column_names)


def test_the_job_and_a_processor_prompt_and_seed_a_row_alike(tiny_model_dir):
    """A job row's text prompt is a user's message, templated as the processor templates messages;
    a row without a seed samples with one derived from the configured seed and its id, whichever
    path it takes and whatever else is in its batch: the same text."""
    from pipeline.llm import vLLMEngineProcessorConfig
    from pipeline.llm.stage import GenerationStage, StageSettings

    job = load_config(
        overrides=[
            "engine.name=transformers",
            f"model.name={tiny_model_dir}",
            "sampling.max_new_tokens=8",
            "sampling.temperature=0.9",
            "sampling.seed=7",
            "drafting.drafter=none",
            "drafting.w=0",
        ]
    )
    rows = {"id": ["a", "b", "c"], "prompt": ["Say hi", "Count to three", "Say hi"]}
    out = generate(job_stage(job), rows).to_pydict()
    processor = vLLMEngineProcessorConfig(
        model_source=str(tiny_model_dir),
        engine="transformers",
        engine_kwargs={"seed": 7},
        id_column="id",
        drafting={"drafter": "none", "w": 0},
    )
    stage = GenerationStage(processor.pipeline_config(), StageSettings(seed=7, id_column="id"))
    params = {"temperature": 0.9, "max_tokens": 8}
    alone = stage(
        rows_table([{"id": "c", "messages": [{"role": "user", "content": "Say hi"}], "sampling_params": params}])
    ).to_pylist()[0]
    assert alone["prompt_token_ids"] == out["prompt_token_ids"][2]
    assert alone["seed"] == out["seed"][2] == request_seed(7, "c")
    assert alone["generated_tokens"] == out["generated_tokens"][2]
    assert out["generated_tokens"][0] != out["generated_tokens"][2]  # the same prompt, another id: another sample


def test_a_processor_with_an_id_column_names_rows_by_their_id(tiny_model_dir):
    from pipeline.llm import vLLMEngineProcessorConfig
    from pipeline.llm.stage import GenerationStage, StageSettings

    config = vLLMEngineProcessorConfig(model_source=str(tiny_model_dir), engine="transformers", id_column="item")
    stage = GenerationStage(config.pipeline_config(), StageSettings(continue_on_error=True, id_column="item"))
    rows = [
        {"item": 5, "prompt": "Hi", "sampling_params": {"max_tokens": 0}},
        {"item": None, "prompt": "Hi", "sampling_params": {"max_tokens": 2}},
    ]
    bad, unnamed = stage(rows_table(rows)).to_pylist()
    assert bad[INFERENCE_ERROR].startswith("row '5': sampling_params.max_tokens must be")
    assert "has no 'item'" in unnamed[INFERENCE_ERROR]


def test_the_jobs_prompts_are_templated_and_checked_by_the_one_rule(tiny_model_dir):
    """A text prompt is one user message with the generation prompt, the template's text tokenized
    (for this tokenizer, the template's own ids); messages that end with the assistant's are
    continued; bad messages and settings are the row's error, naming it."""
    from jobs.benchmark.datasets import encode_prompt

    config = load_config(
        overrides=["engine.name=transformers", f"model.name={tiny_model_dir}", "sampling.max_new_tokens=2"]
    )
    stage = job_stage(config)
    prefill = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    out = generate(
        stage,
        {
            "id": ["text", "prefill", "no-content", "inf", "blank"],
            "prompt": ["Say hi", prefill, [{"role": "user"}], "Say hi", "   "],
            "max_new_tokens": [None, None, None, float("inf"), None],
        },
    ).to_pydict()
    tokenizer = stage.engine.tokenizer
    assert out["prompt_token_ids"][0] == encode_prompt(tokenizer, "Say hi", "text")
    continued = tokenizer.apply_chat_template(prefill, tokenize=False, continue_final_message=True)
    assert out["prompt_token_ids"][1] == list(tokenizer(continued)["input_ids"])
    assert out["error"][:2] == [None, None]
    assert "row 'no-content': message 0 needs a string 'role' and 'content'" in out["error"][2]
    assert "row 'inf': sampling_params.max_tokens must be an integer >= 1, got inf" in out["error"][3]
    assert "row 'blank': the prompt is empty" in out["error"][4]
    assert list(out) == JOB_SCHEMA.names


def test_a_rows_fingerprint_is_the_same_however_its_values_were_read():
    """A JSON column with a missing value is read as floats in that block (pandas): 5 and 5.0, and
    messages with or without null keys, fingerprint alike; another prompt does not."""
    from pipeline.config import load_config
    from pipeline.job.series import row_fingerprint, settings_fingerprint

    config = load_config(overrides=["input.prompt_column=messages"])
    settings = settings_fingerprint(config)
    messages = [{"role": "user", "content": "hi"}]
    as_ints = {"id": 7, "messages": messages, "max_new_tokens": 5}
    as_floats = {"id": 7, "messages": [{"role": "user", "content": "hi", "name": None}], "max_new_tokens": 5.0}
    assert row_fingerprint(config, settings, as_ints) == row_fingerprint(config, settings, as_floats)
    edited = dict(as_ints, messages=[{"role": "user", "content": "hi!"}])
    assert row_fingerprint(config, settings, edited) != row_fingerprint(config, settings, as_ints)


def test_the_tasks_that_convert_rows_load_no_engine(config, tmp_path):
    """A Ray worker that runs the preprocess or the write unpickles these functions: in a new
    process that imports neither torch nor an engine (they cost each new worker 8-9 s)."""
    import subprocess
    import sys

    from ray import cloudpickle

    (tmp_path / "functions.pkl").write_bytes(cloudpickle.dumps((request_row(config), output_table)))
    code = (
        "import sys; from ray import cloudpickle; convert, write = cloudpickle.loads(open(sys.argv[1], 'rb').read()); "
        "names = ('torch', 'transformers', 'vllm', 'numba', 'pipeline.engines.base'); "
        "print(sorted(m for m in names if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "functions.pkl")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_a_series_written_before_the_later_settings_keeps_its_fingerprints():
    """The digests of 5886a25 (before sampling.n and a row's `n`, and before the sampling settings
    left the decoder section for their own): a nightly series regenerates nothing for a setting it
    does not use or a section that moved; one that asks for samples is another text."""
    from pipeline.job.series import row_fingerprint, settings_fingerprint

    for overrides, settings, row in (
        ([], "32c146b9d3c0255d", "7c52a0a7d8483213"),
        (["sampling.temperature=0.7"], "b7391e08e7ecd6da", "581bcfb0f307cad2"),
    ):
        config = load_config(overrides=overrides)
        assert settings_fingerprint(config) == settings
        assert row_fingerprint(config, settings, {"id": "a", "prompt": "hi", "temperature": 0.5}) == row
        assert row_fingerprint(config, settings, {"id": "a", "prompt": "hi", "temperature": 0.5, "n": 2}) != row
        assert settings_fingerprint(load_config(overrides=[*overrides, "sampling.n=4"])) != settings


def test_a_model_directory_fingerprints_alike_by_any_path_to_it(tmp_path, monkeypatch):
    """A nightly run started from another directory, or given the model's path another way, is the
    same series: a local model's path counts as its absolute path; a name that is no path as written."""
    from pipeline.job.series import settings_fingerprint

    (tmp_path / "models" / "m").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    relative, absolute = (
        load_config(overrides=[f"model.name={name}"]) for name in ("models/m", tmp_path / "models" / "m")
    )
    assert settings_fingerprint(relative) == settings_fingerprint(absolute)
    monkeypatch.chdir(tmp_path / "models")
    assert settings_fingerprint(load_config(overrides=["model.name=m"])) == settings_fingerprint(absolute)
    assert settings_fingerprint(load_config(overrides=["model.name=org/other"])) != settings_fingerprint(absolute)
