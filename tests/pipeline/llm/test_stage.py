import pytest

from pipeline.config import load_config
from pipeline.job import rows as job_rows
from pipeline.llm.stage import GenerationStage
from tests.job_in_process import generate, job_stage


@pytest.fixture(scope="module")
def stage(tiny_model_dir, tmp_path_factory):
    config = load_config(
        overrides=[
            "engine.name=transformers",
            f"model.name={tiny_model_dir}",
            "drafting.drafter=context_ngram",
            "sampling.max_new_tokens=12",
        ]
    )
    return job_stage(config)


def test_every_row_comes_back_and_bad_rows_carry_an_error(stage):
    batch = {
        "id": ["good", "empty", "not-text", "too-long", "chat"],
        "prompt": ["def add(a, b):", "   ", 42, "word " * 1000, [{"role": "user", "content": "Say hi"}]],
    }
    out = generate(stage, batch).to_pydict()
    rows = dict(zip(out["id"], out["error"]))
    assert out["id"] == batch["id"]
    assert rows["good"] is None and rows["chat"] is None
    assert "row 'empty': the prompt is empty" in rows["empty"]
    assert "row 'not-text'" in rows["not-text"] and "int" in rows["not-text"]
    assert "row 'too-long'" in rows["too-long"] and "no room to generate" in rows["too-long"]
    good = out["id"].index("good")
    assert len(out["generated_tokens"][good]) == 12 and out["finish_reason"][good] == "length"
    assert out["num_target_calls"][good] >= 1 and out["drafter"][good] == "context_ngram"


def test_rows_sample_with_their_own_settings_and_reproduce(stage):
    batch = {
        "id": ["greedy", "hot", "hot-again", "seeded", "bad-temperature", "bad-top-p"],
        "prompt": ["def add(a, b):"] * 6,
        "temperature": [None, 1.0, 1.0, 1.0, "warm", 0.5],
        "top_p": [None, None, None, 0.9, None, 2.0],
        "seed": [None, None, None, 11, None, None],
    }
    first, second = generate(stage, batch).to_pydict(), generate(stage, batch).to_pydict()
    assert first["generated_tokens"] == second["generated_tokens"], "same seeds and settings must give the same output"
    rows = {row_id: i for i, row_id in enumerate(first["id"])}
    assert (
        "row 'bad-temperature': sampling_params.temperature must be a number >= 0, got 'warm'"
        in first["error"][rows["bad-temperature"]]
    )
    assert (
        "row 'bad-top-p': sampling_params.top_p must be a number in (0, 1], got 2.0"
        in first["error"][rows["bad-top-p"]]
    )
    hot, again = rows["hot"], rows["hot-again"]
    assert first["error"][hot] is None and first["temperature"][hot] == 1.0
    # No seed given: each row gets its own (derived from sampling.seed and the id), recorded.
    assert (
        first["seed"][hot] != first["seed"][again]
        and first["generated_tokens"][hot] != first["generated_tokens"][again]
    )
    assert first["seed"][rows["seeded"]] == 11 and first["top_p"][rows["seeded"]] == 0.9
    assert first["temperature"][rows["greedy"]] == 0.0 and first["lenience"][rows["greedy"]] == 1.0


def test_a_self_draft_stage_reports_acceptance_rate_and_draft_cost(tiny_model_dir, tmp_path):
    config = load_config(
        overrides=[
            "engine.name=transformers",
            f"model.name={tiny_model_dir}",
            "drafting.drafter=draft_model",
            "transformers.k=1",
            "drafting.w=3",
            "transformers.draft_layers=1",
            "sampling.max_new_tokens=10",
            "sampling.temperature=0.7",
        ]
    )
    out = generate(job_stage(config), {"id": ["a", "b"], "prompt": ["def f(x):", "Hello"]}).to_pydict()
    assert out["error"] == [None, None] and out["drafter"] == ["draft_model"] * 2
    assert all(0 <= rate <= 1 for rate in out["acceptance_rate"]) and all(c > 0 for c in out["draft_cost_ratio"])
    assert all(calls > 0 for calls in out["num_draft_model_calls"])


def test_throughput_mode_returns_every_row_in_order_with_the_same_tokens(tiny_model_dir, tmp_path):
    batch = {
        "id": ["a", "bad", "b", "a", "c"],
        "prompt": ["def add(a, b):", "   ", "Hello there", "x = 1", "print('hi')"],
        "max_new_tokens": [12, None, 5, 9, 14],
    }
    outputs = []
    for requests in (1, 3):
        config = load_config(
            overrides=[
                "engine.name=transformers",
                f"model.name={tiny_model_dir}",
                "drafting.drafter=context_ngram",
                "sampling.max_new_tokens=12",
                f"transformers.max_batch_requests={requests}",
                f"ray.batch_size={max(requests, 2)}",
            ]
        )
        outputs.append(generate(job_stage(config), batch).to_pydict())
    one, many = outputs
    assert many["id"] == batch["id"]  # order kept, a repeated id included
    assert "row 'bad': the prompt is empty" in many["error"][1]
    assert many["generated_tokens"] == one["generated_tokens"] and [len(t or []) for t in many["generated_tokens"]] == [
        12,
        0,
        5,
        9,
        14,
    ]


@pytest.mark.parametrize("max_batch_requests,k,verify", [(1, 2, "batch"), (4, 2, "tree"), (4, 1, "batch")])
def test_the_verify_column_says_what_ran(tiny_model_dir, tmp_path, max_batch_requests, k, verify):
    # Throughput mode verifies each request's rows as a tree, whatever transformers.verify says.
    config = load_config(
        overrides=[
            "engine.name=transformers",
            f"model.name={tiny_model_dir}",
            f"transformers.max_batch_requests={max_batch_requests}",
            f"transformers.k={k}",
            "transformers.verify=batch",
            "sampling.max_new_tokens=4",
        ]
    )
    out = generate(job_stage(config), {"id": ["a", "b"], "prompt": ["def add(a, b):", "Hi"]}).to_pydict()
    assert out["verify"] == [verify, verify]
    assert all(share <= calls for share, calls in zip(out["forward_call_share"], out["num_target_calls"]))


def test_a_prediction_is_text_or_openais_form_and_anything_else_is_the_rows_error(stage):
    openai = {"type": "content", "content": "    return a + b"}
    parts = {"type": "content", "content": [{"type": "text", "text": "    return "}, {"type": "text", "text": "a + b"}]}
    batch = {
        "id": ["text", "openai", "parts", "number", "other"],
        "prompt": ["def add(a, b):"] * 5,
        "prediction": ["    return a + b", openai, parts, 7, {"type": "image", "content": "x"}],
    }
    out = generate(stage, batch).to_pydict()
    errors = dict(zip(out["id"], out["error"]))
    assert errors["text"] is None and errors["openai"] is None and errors["parts"] is None, errors
    assert (
        "row 'number': prediction must be text or OpenAI's {'type': 'content', 'content': ...}, got 7"
        in errors["number"]
    )
    assert "row 'other': prediction must be text or OpenAI's" in errors["other"]
    texts = dict(zip(out["id"], out["generated_text"]))
    assert texts["openai"] == texts["parts"] == texts["text"]


@pytest.mark.slow  # two vLLM engines built in this process: make test-slow
def test_an_auto_stage_switches_mode_on_its_measured_rows_and_the_rows_stay_the_same(tiny_model_dir):
    """drafting.speculation auto, measuring (a job of a million rows, windows of 0.3 s): the stage builds
    the other mode's engine in place, and the same rows (greedy, and sampled with their seeds) come
    out of both modes token for token, each row naming the drafter that ran it."""
    config = load_config(
        overrides=[
            "engine.name=vllm",
            f"model.name={tiny_model_dir}",
            "vllm.execution=eager",
            "vllm.cpu_kv_cache_gib=1",
            "vllm.max_model_len=256",
            "vllm.max_num_seqs=8",
            "sampling.max_new_tokens=16",
            "drafting.speculation_window_s=0.3",
        ]
    )
    stage = GenerationStage(config, job_rows.stage_settings(config, expected_rows=10**6))
    batch = {
        "id": [f"r{i}" for i in range(8)],
        "prompt": [f"Count from {i}: {i} {i + 1}" for i in range(8)],
        "temperature": [0.8 * (i % 2) for i in range(8)],
        "seed": list(range(8)),
    }
    try:
        first = generate(stage, batch).to_pydict()
        for _ in range(40):  # a window is 16 rows (twice the slots) and 0.3 busy seconds
            if stage.chooser.switches:
                break
            generate(stage, batch)
        again = generate(stage, batch).to_pydict()
    finally:
        stage.engine.close()
    switch = stage.chooser.switches[0]
    assert (switch["from"], switch["to"]) == ("batch_suffix", "none") and switch["restart_seconds"] > 0
    assert first["drafter"] == ["batch_suffix"] * 8 and again["drafter"] == ["none"] * 8
    assert again["generated_tokens"] == first["generated_tokens"] and again["error"] == [None] * 8
    assert stage.chooser.report()["windows"][0]["mode"] == "batch_suffix"


def test_a_row_asking_for_n_samples_gets_n_rows_each_its_own_text(stage):
    """Sample 0 samples with the row's seed (the text one sample of that seed gives), sample i with
    one derived from it and i; a row's samples are rows of their own, its other columns repeated."""
    one = generate(stage, {"id": ["s"], "prompt": ["def add(a, b):"], "temperature": [1.0], "seed": [5]}).to_pylist()
    rows = generate(
        stage,
        {
            "id": ["s", "g"],
            "prompt": ["def add(a, b):", "Hi"],
            "temperature": [1.0, None],
            "seed": [5, None],
            "n": [3, None],
        },
    ).to_pylist()
    assert [(row["id"], row["sample_index"]) for row in rows] == [("s", 0), ("s", 1), ("s", 2), ("g", 0)]
    assert rows[0]["generated_tokens"] == one[0]["generated_tokens"] and rows[0]["seed"] == 5
    assert len({row["seed"] for row in rows[:3]}) == 3 and len({tuple(row["generated_tokens"]) for row in rows[:3]}) > 1
    assert all(row["error"] is None for row in rows)
