"""The side-by-side comparison's arithmetic and its guard on too few prompts (no engine started)."""

import pytest

from jobs import benchmark
from jobs.benchmark.engines import Measured, Method, summarize


def measured(name: str, seconds: list[float], tokens_per_round: int = 100) -> Measured:
    return Measured(
        Method("vllm", name),
        batch=1,
        seconds=seconds,
        tokens=[tokens_per_round] * len(seconds),
        outputs=[[1, 2]],
        calls=tokens_per_round * len(seconds),
    )


def test_ratios_are_medians_of_the_ratios_within_each_round():
    # Tokens/s per round: plain 100, 25, 80; ours 200, 60, 90. Within the rounds ours ran 2.0x, 2.4x
    # and 1.125x plain: median 2.0. The ratio of the medians (90 / 80) would be 1.125.
    plain = measured("plain", [1.0, 4.0, 1.25])
    ours = measured("suffix:1:auto", [0.5, 100 / 60, 100 / 90])
    rows = {r["method"]: r for r in summarize([plain, ours])}
    assert rows["plain"]["tokens_per_second_rounds"] == [100.0, 25.0, 80.0]
    assert rows["suffix:1:auto"]["tokens_per_second"] == 90.0
    assert rows["suffix:1:auto"]["vs_plain"] == 2.0
    assert rows["suffix:1:auto"]["identical_fraction"] == 1.0


def test_a_dataset_too_small_for_every_run_to_take_new_prompts_is_refused_at_start(tmp_path):
    # GSM8K's fixture has 100 prompts; 2 rounds x 2 batch sizes x 30 need 120.
    with pytest.raises(SystemExit, match="needs 120 prompts .* gsm8k has 100"):
        benchmark.main(
            [
                "engines",
                "--dataset",
                "gsm8k",
                "--limit",
                "30",
                "--rounds",
                "2",
                "--batch",
                "1,16",
                "--out",
                str(tmp_path / "never.json"),
            ]
        )


def test_methods_take_turns_call_by_call_in_a_rotating_order():
    calls = []

    class Recording:
        def __init__(self, name):
            self.name = name

        def generate(self, requests):
            calls.append((self.name, [r.request_id for r in requests]))
            return [f"{self.name}:{r.request_id}" for r in requests]

    from jobs.benchmark.engines import run_methods
    from pipeline.engines.base import Request

    requests = [Request(str(i), [1], 4) for i in range(5)]
    out = run_methods(
        {"a": Recording("a"), "b": Recording("b"), "c": Recording("c")}, ["a", "b", "c"], requests, 2, first=1
    )
    assert [name for name, _ in calls] == ["b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert [ids for _, ids in calls[::3]] == [["0", "1"], ["2", "3"], ["4"]]
    assert out["a"][1] == [f"a:{i}" for i in range(5)] and all(seconds >= 0 for seconds, _ in out.values())


def test_each_call_takes_per_call_requests_so_the_engine_stays_full(monkeypatch):
    """--per-call: a batch size is the engine's running requests at most, and a call of more
    requests than that keeps it full for most of the call (a call of B drains from B to 1)."""
    from types import SimpleNamespace

    from jobs.benchmark import engines

    calls = []

    class Engine:
        tokenizer = None

        def __init__(self, name):
            self.name = name

        def generate(self, requests):
            calls.append((self.name, len(requests)))
            return [SimpleNamespace(token_ids=[1, 2], stats=SimpleNamespace(num_target_calls=1)) for _ in requests]

    monkeypatch.setattr(
        engines,
        "build_engines",
        lambda base, methods, batches: {(method, max(batches)): Engine(method.name) for method in methods},
    )
    monkeypatch.setattr(engines, "encode_prompt", lambda tokenizer, prompt, request_id: [1])
    methods = [Method("vllm", "plain"), Method("vllm", "batch_suffix:1:auto")]
    report = engines.compare([], methods, [f"p{i}" for i in range(24)], [4], 8, rounds=2, per_call=12)
    assert calls == [("plain", 12), ("batch_suffix:1:auto", 12), ("batch_suffix:1:auto", 12), ("plain", 12)]
    assert report["requests_per_call"] == {4: 12}
    calls.clear()
    report = engines.compare([], methods, [f"p{i}" for i in range(24)], [4], 8, rounds=2)
    assert [size for _, size in calls] == [4] * 12  # by default a call is one batch
    assert report["requests_per_call"] == {4: 4}


def test_a_negative_per_call_is_refused_naming_the_flag(tmp_path):
    with pytest.raises(SystemExit, match="--per-call -1: requests per generate call must be 0"):
        benchmark.main(["engines", "--per-call", "-1", "--out", str(tmp_path / "never.json")])
