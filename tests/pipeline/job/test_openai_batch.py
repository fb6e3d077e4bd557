"""OpenAI Batch files (pipeline/job/openai_batch.py): lines checked and read as the job's rows, and
rows written back as OpenAI's output and error lines, each checked with the openai package's own
types. No engine here: the job runs a batch file in tests/pipeline/job/test_ray_job_vllm.py."""

import json
from pathlib import Path

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from pipeline.config import load_config
from pipeline.job import openai_batch
from pipeline.job.openai_batch import CHAT, COMPLETIONS, LineError, request_of
from pipeline.job.rows import request_row
from pipeline.llm.schema import BAD_INPUT

LINES = Path(__file__).resolve().parents[2] / "data" / "openai_batch.jsonl"


def line(url=CHAT, **body):
    return {
        "custom_id": "c1",
        "method": "POST",
        "url": url,
        "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}], **body},
    }


@pytest.mark.parametrize(
    "row, named",
    [
        (line(tools=[{"type": "function"}]), "body.tools is not run here"),
        (line(audio={"voice": "alloy"}), "body.audio is not run here"),
        (line(url="/v1/embeddings"), "url '/v1/embeddings' is not run here"),
        ({**line(), "method": "GET"}, "method must be 'POST'"),
        ({**line(), "custom_id": ""}, "custom_id must be a non-empty string"),
        (line(stream=True), "body.stream must be false"),
        (
            line(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
            "body.messages[0].content: 'image_url' parts are not run here",
        ),
        (line(messages=[{"role": "assistant", "content": None, "tool_calls": []}]), "body.messages[0].tool_calls"),
        (line(response_format={"type": "json_schema"}), "body.response_format must be"),
        (
            {"custom_id": "c1", "method": "POST", "url": COMPLETIONS, "body": {"prompt": [1, 2, 3]}},
            "body.prompt must be",
        ),
    ],
)
def test_a_line_we_do_not_run_names_the_field(row, named):
    with pytest.raises(LineError, match=named.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        request_of(row)


def test_a_request_keeps_what_changes_the_text_and_leaves_the_rest_aside():
    request = request_of(
        line(
            user="u-1",
            metadata={"k": "v"},
            store=True,
            stream=False,
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}
            ],
        )
    )
    assert request == {
        "url": CHAT,
        "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi there"}]},
    }


def test_a_line_becomes_the_processors_columns_with_openais_defaults():
    config = load_config(overrides=["sampling.max_new_tokens=50"])
    source = config.input
    rows = [
        openai_batch.batch_row(json.loads(text), source, f"f line {i}") if text.strip().endswith("}}") else None
        for i, text in enumerate(LINES.read_text().splitlines(), start=1)
    ]
    good = {row["id"]: row for row in rows if row is not None and not row.get(BAD_INPUT)}
    convert = request_row(config)
    chat = convert(good["request-2"])
    assert chat["messages"] == [{"role": "user", "content": "Write a haiku about the sea."}] and chat["prompt"] is None
    assert chat["sampling_params"] == {"max_tokens": 10, "temperature": 0.8, "top_p": 1.0, "n": 4, "seed": 7}
    assert chat["endpoint"] == CHAT
    text = convert(good["request-3"])
    assert text["prompt"] == "def add(a, b):" and text["endpoint"] == COMPLETIONS
    assert text["sampling_params"] == {
        "max_tokens": 8,
        "temperature": 0,
        "top_p": 1.0,
        "n": 1,
        "stop": ["\n\n"],
        "logprobs": 2,
    }
    predicted = convert(good["request-4"])
    assert predicted["prediction"] == "count = 1; print(count)" and predicted["predicted_from"] == "row"
    schema = convert(good["request-5"])["sampling_params"]
    assert json.loads(schema["structured_outputs"]["json"])["required"] == ["name", "age"]
    assert schema["logprobs"] == 2
    assert convert(good["request-1"])["sampling_params"]["temperature"] == 1.0  # OpenAI's default, not decoder's
    assert convert(good["request-9"])["sampling_params"]["max_tokens"] == 6
    bad = {row["id"]: row[BAD_INPUT] for row in rows if row is not None and row.get(BAD_INPUT)}
    assert bad == {
        "request-6": "f line 6: body.tools is not run here (the job runs model, max_tokens, temperature, "
        "top_p, seed, stop, n, logprobs, frequency_penalty, presence_penalty, messages, "
        "max_completion_tokens, top_logprobs, response_format, prediction on /v1/chat/completions)",
        "request-7": "f line 7: url '/v1/embeddings' is not run here; the job runs /v1/chat/completions and "
        "/v1/completions",
    }
    # The fingerprint follows the request: another message is another text.
    assert (
        convert(good["request-1"])["fingerprint"]
        != convert(
            {**good["request-1"], openai_batch.REQUEST: good["request-1"][openai_batch.REQUEST].replace("Hello", "Bye")}
        )["fingerprint"]
    )


def sample(key, index, endpoint=CHAT, **values):
    return {
        "id": key,
        "sample_index": index,
        "endpoint": endpoint,
        "generated_text": f"text {index}",
        "generated_tokens": [5, 6],
        "finish_reason": "eos",
        "num_input_tokens": 7,
        "num_generated_tokens": 2,
        "accepted_prediction_tokens": 1,
        "rejected_prediction_tokens": 3,
        "logprobs": None,
        "model": "m",
        "error": None,
        **values,
    }


def test_rows_become_openais_output_and_error_lines_each_request_once():
    logprobs = [
        [
            {"token_id": 5, "token": "a", "logprob": -0.1, "rank": 1},
            {"token_id": 9, "token": "b", "logprob": -2.5, "rank": 2},
        ],
        [
            {"token_id": 6, "token": "c", "logprob": -0.7, "rank": 2},
            {"token_id": 4, "token": "d", "logprob": -0.6, "rank": 1},
        ],
    ]
    rows = [
        sample("c", 1),
        sample("c", 0),
        sample("t", 0, COMPLETIONS, finish_reason="length", logprobs=logprobs),
        sample("p", 0, logprobs=logprobs),
        sample("bad", 0, None, error="row 'bad': body.tools is not run here"),
        sample("late", 0, error="row 'late': vLLM refused it"),
    ]
    lines = list(openai_batch.response_lines(rows, "r1", 1700000000))
    assert [json.loads(text)["custom_id"] for _, text in lines] == ["c", "t", "p", "bad", "late"]
    answers = {json.loads(text)["custom_id"]: (ok, json.loads(text)) for ok, text in lines}
    ok, chat = answers["c"]
    assert ok and chat["error"] is None and chat["response"]["status_code"] == 200
    body = ChatCompletion.model_validate(chat["response"]["body"])
    assert [c.index for c in body.choices] == [0, 1] and body.choices[1].message.content == "text 1"
    assert (
        body.choices[0].finish_reason == "stop" and body.usage.completion_tokens == 4 and body.usage.prompt_tokens == 7
    )
    assert body.usage.completion_tokens_details.accepted_prediction_tokens == 2
    assert body.usage.completion_tokens_details.rejected_prediction_tokens == 6
    completion = Completion.model_validate(answers["t"][1]["response"]["body"])
    assert completion.choices[0].text == "text 0" and completion.choices[0].finish_reason == "length"
    assert completion.choices[0].logprobs.tokens == ["a", "c"] and completion.choices[0].logprobs.token_logprobs == [
        -0.1,
        -0.7,
    ]
    assert completion.choices[0].logprobs.top_logprobs == [{"a": -0.1, "b": -2.5}, {"d": -0.6, "c": -0.7}]
    content = ChatCompletion.model_validate(answers["p"][1]["response"]["body"]).choices[0].logprobs.content
    assert [(t.token, t.logprob, [e.token for e in t.top_logprobs]) for t in content] == [
        ("a", -0.1, ["a", "b"]),
        ("c", -0.7, ["d", "c"]),
    ]
    for key in ("bad", "late"):
        ok, failed = answers[key]
        assert not ok and failed["response"] is None and failed["error"]["code"] == "invalid_request"
    assert answers["bad"][1]["error"]["message"] == "row 'bad': body.tools is not run here"


def test_the_output_files_are_written_whole(tmp_path):
    result = openai_batch.write_outputs(str(tmp_path), "r1", [[sample("a", 0)], [sample("b", 0, error="no")]])
    assert (result["requests"], result["failed_requests"]) == (1, 1)
    assert [
        json.loads(text)["custom_id"] for text in (tmp_path / "openai" / "output.jsonl").read_text().splitlines()
    ] == ["a"]
    assert [
        json.loads(text)["custom_id"] for text in (tmp_path / "openai" / "errors.jsonl").read_text().splitlines()
    ] == ["b"]

    def broken():
        yield [sample("c", 0)]
        raise RuntimeError("a read failed")

    with pytest.raises(RuntimeError):
        openai_batch.write_outputs(str(tmp_path), "r2", broken())
    assert sorted(p.name for p in (tmp_path / "openai").iterdir()) == ["errors.jsonl", "output.jsonl"]  # no torn file
    assert [
        json.loads(text)["custom_id"] for text in (tmp_path / "openai" / "output.jsonl").read_text().splitlines()
    ] == ["a"]
