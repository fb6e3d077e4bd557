"""The vLLM engine on the tiny random model: every drafter of ours as vLLM's proposer gives
exactly vLLM plain greedy's tokens, with drafts verified; bad requests fail alone; statistics are
filled. vLLM starts twice for the whole module (plain, and ours with the drafter swapped per test)."""

import dataclasses
import os

import pytest

from drafters.datastore import build_datastore
from pipeline.config import load_config
from pipeline.engines.base import Failed, Request, Result
from pipeline.loading.drafters import drafter_tables
from pipeline.engines.build import build_engine, checked_config
from drafters.primitives.sampling import SamplingParams

W = 4
PROMPTS = [
    "def fib(n):\n    if n < 2:\n        return n",
    "Count: one two three one two three one",
    "The cat sat on the mat. The cat",
    "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [",
]


def config(tiny_model_dir, *overrides):
    return checked_config(
        load_config(
            "configs/default.yaml",
            [
                "engine.name=vllm",
                f"model.name={tiny_model_dir}",
                "vllm.execution=eager",
                "vllm.cpu_kv_cache_gib=1",
                "vllm.max_model_len=384",
                "vllm.max_num_seqs=4",
                *overrides,
            ],
        )
    )


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    plain = build_engine(
        config(
            tiny_model_dir, "drafting.drafter=none", "drafting.w=0", "vllm.engine_args={enable_prefix_caching: false}"
        )
    )
    ours = build_engine(config(tiny_model_dir, "drafting.drafter=context_ngram", "drafting.w=auto"))
    yield plain, ours
    plain.close()
    ours.close()


@pytest.fixture(scope="module")
def requests(engines):
    from jobs.benchmark.datasets import encode_prompt

    tokenizer = engines[0].tokenizer
    return [Request(f"r{i}", encode_prompt(tokenizer, prompt, f"r{i}"), 48) for i, prompt in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def reference(engines, requests):
    return [result.token_ids for result in engines[0].generate(requests)]


def swap(ours, tiny_model_dir, drafter, *overrides):
    decoder = config(tiny_model_dir, f"drafting.drafter={drafter}", f"drafting.w={W}", *overrides).drafting
    ours.set_decoder(decoder, drafter_tables(dataclasses.replace(ours.config, drafting=decoder)))


DRAFTERS = ["context_ngram", "unigram", "bigram", "extended_bigram", "mixed", "batch_suffix"]


# Every drafter at a fixed w, and at w: auto all but extended_bigram, whose table at auto's w (16)
# takes two minutes to build here; auto's path through the proposer is the same for every drafter.
# extended_bigram's table at w = 4 (the model over every token of the vocabulary, 20-30 s) is built
# in the slow tier.
@pytest.mark.parametrize(
    "w,drafter",
    [pytest.param(str(W), drafter, marks=[pytest.mark.slow] * (drafter == "extended_bigram")) for drafter in DRAFTERS]
    + [("auto", drafter) for drafter in DRAFTERS if drafter != "extended_bigram"],
)
def test_each_drafter_on_vllm_is_vllm_plain_greedy(engines, requests, reference, tiny_model_dir, drafter, w):
    ours = engines[1]
    swap(ours, tiny_model_dir, drafter, "drafting.w=auto" if w == "auto" else f"drafting.w={W}")
    results = ours.generate(requests)
    assert [r.token_ids for r in results] == reference
    rows = {}
    for result in results:
        for strategy, count in result.stats.strategy_rows.items():
            rows[strategy] = rows.get(strategy, 0) + count
        stats = result.stats
        assert stats.num_generated_tokens == len(result.token_ids) == 48 or result.finish_reason == "eos"
        assert sum(stats.accepted_length_histogram) == stats.num_target_calls
    verified = {name: count for name, count in rows.items() if name != "none"}
    if w != "auto":  # auto may rightly find that drafts do not pay here (see the test below)
        assert verified, f"{drafter}: no draft was verified ({rows})"
    assert ours.columns()["drafter"] == drafter and ours.columns()["auto_w"] == (w == "auto")


class FixedCosts:
    """Stands in for the proposer's learned step costs: a step feeding n tokens costs a + b n."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def observe(self, tokens, seconds):
        pass

    def cost(self):
        from drafters.budget import LinearStepCost

        return LinearStepCost(self.a, self.b)


def set_costs(worker, a, b):
    worker.model_runner.drafter.costs = FixedCosts(a, b)


@pytest.mark.parametrize("per_token,drafts", [(0.0, True), (10.0, False)])
def test_auto_drafts_when_tokens_are_cheap_and_not_when_they_cost_a_step(
    engines, requests, reference, tiny_model_dir, per_token, drafts
):
    ours = engines[1]
    swap(ours, tiny_model_dir, "mixed", "drafting.w=auto")
    ours.collective_rpc(set_costs, (0.01, per_token))
    results = ours.generate(requests)
    assert [r.token_ids for r in results] == reference
    verified = sum(r.stats.num_verified_tokens - r.stats.num_target_calls for r in results)
    assert (verified > 0) == drafts


def test_context_drafts_are_accepted_and_save_steps(engines, requests, reference, tiny_model_dir):
    ours = engines[1]
    swap(ours, tiny_model_dir, "context_ngram", "drafting.ngram.min_q=1")
    results = ours.generate(requests)
    assert [r.token_ids for r in results] == reference
    accepted = sum(r.stats.strategy_accepted_tokens.get("context_ngram", 0) for r in results)
    calls = sum(r.stats.num_target_calls for r in results)
    assert accepted > 0 and calls < sum(len(r.token_ids) for r in results)
    assert accepted == sum(j * n for r in results for j, n in enumerate(r.stats.accepted_length_histogram))


def test_retrieval_on_vllm_is_vllm_plain_greedy(engines, requests, reference, tiny_model_dir, tmp_path):
    ours = engines[1]
    tokenizer = ours.tokenizer
    # A datastore of the reference outputs themselves: retrieval has something to find.
    build_datastore(
        [tokenizer.decode(ids) and ids for ids in reference], tmp_path / "ds", {"vocab_size": len(tokenizer)}
    )
    swap(ours, tiny_model_dir, "rest", f"drafting.datastore={tmp_path / 'ds'}")
    results = ours.generate(requests)
    assert [r.token_ids for r in results] == reference
    assert sum(r.stats.strategy_accepted_tokens.get("retrieval", 0) for r in results) > 0


def test_bad_requests_fail_alone_and_budgets_and_stops_hold(engines, requests, reference):
    plain, ours = engines
    too_long = Request("long", list(range(5, 400)), 10)
    empty = Request("empty", [], 10)
    short = dataclasses.replace(requests[0], request_id="short", max_new_tokens=3)
    results = ours.generate([too_long, requests[1], empty, short])
    assert isinstance(results[0], Failed) and "no room to generate" in results[0].message
    assert isinstance(results[2], Failed) and "encodes to no tokens" in results[2].message
    assert results[1].token_ids == reference[1] and results[3].token_ids == reference[0][:3]
    assert results[3].finish_reason == "length"
    refused, after = ours.generate([Request("oov", [requests[0].prompt_ids[0], 10**7], 4), requests[2]])
    assert isinstance(refused, Failed) and "request 'oov': vLLM refused it" in refused.message
    assert after.token_ids == reference[2][:48]  # the engine goes on
    text = plain.tokenizer.decode(reference[2], skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    stopped = ours.generate([dataclasses.replace(requests[2], stop=(stop,))])[0]
    assert isinstance(stopped, Result) and stopped.finish_reason == "stop" and stop not in stopped.text
    assert stopped.text == text[: text.index(stop)]


def test_each_engines_worker_samples_exactly(engines):
    """vLLM's sampling on each engine's worker, as our engine corrected it (cpu_sampling.py)."""
    from pipeline.engines.vllm.compat import sampling_is_exact

    ours = engines[1]
    assert ours.exact_sampling
    assert ours.collective_rpc(lambda worker: sampling_is_exact(worker.device)) == [True]


def test_vllms_other_sampling_settings_run_exactly_with_drafts(engines, requests, reference, tiny_model_dir):
    """Penalties, min_tokens and ignore_eos go to vLLM as given; with our drafts the tokens are
    exactly vLLM plain's with the same settings (its rejection sampler applies the penalties over
    the draft prefixes), and the settings do change them."""
    plain, ours = engines
    swap(ours, tiny_model_dir, "unigram")  # drafts every step, whatever the text
    settings = {"repetition_penalty": 1.5, "frequency_penalty": 0.5, "min_tokens": 8, "ignore_eos": True}
    penalised = [dataclasses.replace(r, engine_sampling=settings) for r in requests]
    expected = [r.token_ids for r in plain.generate(penalised)]
    results = ours.generate(penalised)
    assert [r.token_ids for r in results] == expected != reference
    assert sum(r.stats.num_verified_tokens - r.stats.num_target_calls for r in results) > 0
    bad = ours.generate([dataclasses.replace(requests[0], engine_sampling={"repetition_penalty": -1.0})])[0]
    assert isinstance(bad, Failed) and "sampling_params" in bad.message and "repetition_penalty" in bad.message


def test_log_probabilities_come_with_the_drafts_as_without_them(engines, requests, tiny_model_dir):
    """logprobs / prompt_logprobs asked: every generated position carries its token's log
    probability and the top ones', as vLLM plain gives them (with drafts: from the verifying
    forward), the prompt's positions theirs; the row's params are vLLM's own. The eager engines
    compile none of vLLM's sampler helpers on the way (an unseeded sample reaches the other)."""
    from torch._dynamo.utils import counters

    plain, ours = engines
    swap(ours, tiny_model_dir, "unigram")
    compiled_before = counters["frames"]["total"]
    asked = [dataclasses.replace(r, engine_sampling={"logprobs": 2, "prompt_logprobs": 1}) for r in requests]
    expected, results = plain.generate(asked), ours.generate(asked)
    plain.generate([dataclasses.replace(requests[0], sampling=SamplingParams(temperature=1.0))])
    assert counters["frames"]["total"] == compiled_before
    assert sum(r.stats.num_verified_tokens - r.stats.num_target_calls for r in results) > 0
    for want, got, request in zip(expected, results, asked):
        assert got.token_ids == want.token_ids and len(got.logprobs) == len(got.token_ids)
        for token, position, wanted in zip(got.token_ids, got.logprobs, want.logprobs):
            assert 2 <= len(position) <= 3 and position[token]["decoded_token"] is not None
            assert position[token]["logprob"] == pytest.approx(wanted[token]["logprob"], abs=1e-3)
            assert position[token]["rank"] == wanted[token]["rank"]
        assert len(got.prompt_logprobs) == len(request.prompt_ids) and got.prompt_logprobs[0] is None
        assert all(request.prompt_ids[i] in got.prompt_logprobs[i] for i in range(1, len(request.prompt_ids)))
    assert "logprobs=2" in results[0].params and results[0].params.startswith("SamplingParams(")
    unnamed = ours.generate([dataclasses.replace(requests[0], engine_sampling={"logprobs": 1, "detokenize": False})])[0]
    assert all(p["decoded_token"] is None for position in unnamed.logprobs for p in position.values())
    assert ours.generate(requests[:1])[0].logprobs is None


def test_a_callers_own_run_of_vllm_gives_the_same_results(engines, requests, reference, tiny_model_dir):
    """The feeding benchmark's ideal: vLLM's LLM.generate over every request at once, on the engine
    and its proposer, instead of the engine's feeder."""
    from lab.feeding import all_at_once

    ours = engines[1]
    swap(ours, tiny_model_dir, "unigram")
    results = ours.generate(requests, all_at_once(ours))
    assert [r.token_ids for r in results] == reference
    assert sum(r.stats.num_verified_tokens - r.stats.num_target_calls for r in results) > 0


def test_vllms_other_engine_arguments_reach_it_as_given(engines):
    assert engines[0].feeder.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is False
    assert engines[1].feeder.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is True  # vLLM's default


def test_a_later_engine_in_the_process_reads_its_own_settings(engines, tiny_model_dir, monkeypatch):
    """vLLM caches its environment once an engine has started; another engine's settings (here two
    ranks and another cache size) must reach vLLM all the same."""
    import vllm.envs as envs

    from pipeline.engines.vllm.engine import set_vllm_environment

    for name in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # put back as it was after the test
    envs.enable_envs_cache()
    set_vllm_environment(
        config(tiny_model_dir, "vllm.tensor_parallel_size=2", "model.num_threads=2", "vllm.cpu_kv_cache_gib=3")
    )
    assert envs.VLLM_CPU_KVCACHE_SPACE == 3
    assert envs.VLLM_CPU_OMP_THREADS_BIND.count("|") == 1


def test_sampling_reproduces_with_the_seed(engines, requests):
    ours = engines[1]
    hot = [dataclasses.replace(r, sampling=SamplingParams(1.0, 0, 0.95, seed=7 + i)) for i, r in enumerate(requests)]
    first, second = ours.generate(hot), ours.generate(hot)
    assert [r.token_ids for r in first] == [r.token_ids for r in second]
    other = ours.generate([dataclasses.replace(hot[0], sampling=SamplingParams(1.0, 0, 0.95, seed=99))])[0]
    assert other.token_ids != first[0].token_ids


class FailingFor:
    """A context n-gram drafter that fails for the contexts starting with `prefix`: it raises, or
    (`junk`) returns a row that is not token ids."""

    def __init__(self, prefix: list[int], junk: bool = False):
        from drafters.context_ngram import ContextNgramDrafter

        self.inner, self.prefix, self.junk = ContextNgramDrafter(3, 1, 0), prefix, junk

    def propose(self, context, k, w):
        if context.tokens[: len(self.prefix)] == self.prefix:
            if self.junk:
                return [["not", "tokens"]]
            raise RuntimeError("a drafter bug for this request")
        return self.inner.propose(context, k, w)


@pytest.mark.parametrize("junk", [False, True])
def test_a_drafter_failing_for_one_request_costs_it_its_drafts_and_nothing_else(engines, requests, reference, junk):
    from drafters.per_request import PerRequestBatchDrafter
    from pipeline.engines.vllm.proposer import attach_drafter

    ours = engines[1]
    ours.collective_rpc(
        attach_drafter, (PerRequestBatchDrafter(FailingFor(requests[1].prompt_ids, junk), W, 3), W, False)
    )
    results = ours.generate(requests)
    assert [r.token_ids for r in results] == reference  # every row back, the engine never stopped
    failed = [r.stats.num_drafter_failed_steps for r in results]
    # every step that drafted for it (not the prefill's, nor the last, where no draft fits the budget)
    assert results[1].stats.num_target_calls - 2 <= failed[1] > 0
    assert failed[:1] + failed[2:] == [0, 0, 0]
    assert results[1].stats.num_verified_tokens == results[1].stats.num_target_calls  # no drafts for it
    assert sum(r.stats.num_verified_tokens - r.stats.num_target_calls for r in results) > 0  # the others drafted


def test_batches_stream_through_one_engine_without_draining(engines, requests, reference):
    """Two callers at once: a batch whose requests have very different lengths (one of 300
    tokens, three of 12) fills the 4 slots, then a batch of short requests comes. The short batch
    takes the slots the long batch's short requests free and comes back while its longest request
    still runs; the steps count the refilled slots."""
    import threading
    import time

    plain = engines[0]
    before = plain.steps()
    long_batch = [
        dataclasses.replace(r, request_id=f"long{i}", max_new_tokens=300 if i == 0 else 12)
        for i, r in enumerate(requests)
    ]
    short_batch = [dataclasses.replace(r, request_id=f"short{i}", max_new_tokens=2) for i, r in enumerate(requests)]
    finished = {}

    def run(name, batch):
        results = plain.generate(batch)
        finished[name] = (results, plain.steps())

    threads = [threading.Thread(target=run, args=("long", long_batch))]
    threads[0].start()
    while plain.steps().drain_steps <= before.drain_steps + 2:  # the long batch is running
        time.sleep(0.001)
    threads.append(threading.Thread(target=run, args=("short", short_batch)))
    threads[1].start()
    for thread in threads:
        thread.join()
    long_results, at_long = finished["long"]
    short_results, at_short = finished["short"]
    assert [r.token_ids[:48] for r in long_results[:1]] == reference[:1] and len(long_results[0].token_ids) == 300
    assert [r.token_ids for r in long_results[1:]] == [ids[:12] for ids in reference[1:]]
    assert [r.token_ids for r in short_results] == [ids[:2] for ids in reference]

    def steps_and_running(snapshot):
        return (
            snapshot.steps + snapshot.drain_steps - before.steps - before.drain_steps,
            snapshot.running + snapshot.drain_running - before.running - before.drain_running,
        )

    steps, running = steps_and_running(at_short)
    assert steps < 100, f"the short batch waited for the long one to drain ({steps} steps)"
    assert running >= 4 * 11 + 4 * 2  # the 4 slots full for the first 11 steps, then the short batch's 4
    steps, running = steps_and_running(at_long)
    assert at_long.slots == 4 and steps >= 299 and running <= 4 * steps


def test_structured_outputs_vllm_refuses_fail_their_request_alone(engines, requests, reference):
    """(Valid structured output with our drafts: tests/test_smollm2_vllm.py, on a model that ends its JSON.)"""
    bad = Request("bad", requests[0].prompt_ids, 8, structured_outputs={"json": {"type": "object"}, "regex": "a+"})
    failed, ran = engines[1].generate([bad, requests[1]])
    assert isinstance(failed, Failed) and "structured_outputs" in failed.message
    assert ran.token_ids == reference[1]


def test_a_lora_adapter_reaches_vllm_with_its_request_and_fails_it_alone_without_enable_lora(
    engines, requests, reference, tmp_path
):
    """vLLM-CPU 0.32 cannot start with enable_lora (its Triton overrides fail at the worker's start),
    so here the adapter's request is refused by vLLM, alone; the adapter is named once per engine."""
    ours = engines[1]
    adapter = dataclasses.replace(requests[0], request_id="lora", adapter=str(tmp_path / "adapter"))
    refused, ran = ours.generate([adapter, requests[1]])
    assert isinstance(refused, Failed) and "vLLM refused it" in refused.message and "LoRA" in refused.message
    assert ran.token_ids == reference[1]
    first = ours.adapter(str(tmp_path / "adapter"))
    assert ours.adapter(str(tmp_path / "adapter")) is first and first.lora_path == str(tmp_path / "adapter")
    assert ours.adapter(str(tmp_path / "other")).lora_int_id == first.lora_int_id + 1


# Temperatures from near-greedy (drafts often right) to 1.0, with top-k and top-p.
HOT = [SamplingParams(0.05, 0, 1.0), SamplingParams(1.0, 0, 0.9), SamplingParams(0.7, 20, 1.0), SamplingParams(0.3)]


@pytest.fixture(scope="module")
def sampled(engines, requests, tmp_path_factory):
    """Plain sampling's tokens, each request with its own seed, in a sampled-only batch and in a
    batch of sampled and greedy rows; and a datastore of those texts (retrieval then drafts the
    very continuations: with the same seeds, drafts are accepted)."""
    hot = [dataclasses.replace(r, sampling=dataclasses.replace(HOT[i], seed=100 + i)) for i, r in enumerate(requests)]
    batches = {"sampled": hot, "mixed": [hot[0], requests[1], hot[2], requests[3]]}
    plain = {name: [r.token_ids for r in engines[0].generate(batch)] for name, batch in batches.items()}
    store = tmp_path_factory.mktemp("sampled-store") / "ds"
    build_datastore(plain["sampled"], store, {"vocab_size": len(engines[0].tokenizer)})
    return batches, plain, store


@pytest.mark.parametrize(
    "drafter", [pytest.param(d, marks=[pytest.mark.slow] * (d == "extended_bigram")) for d in DRAFTERS + ["rest"]]
)
def test_sampled_rows_are_plain_samplings_text_whatever_the_drafter_and_batch(
    engines, sampled, tiny_model_dir, drafter
):
    """A seed is a text (pipeline/engines/vllm/seeded_sampling.py): with drafts, at B = 4 (the batch
    in one call) and, for the default drafter, B = 1 (one request at a time), sampled-only and
    beside greedy rows, every row is plain sampling's with its seed."""
    batches, plain, store = sampled
    ours = engines[1]
    swap(
        ours, tiny_model_dir, drafter, *([f"drafting.datastore={store}"] if drafter in ("rest", "batch_suffix") else [])
    )
    checked = accepted = 0
    for name, batch in batches.items():
        together = ours.generate(batch)
        # (The keyed verification is the drafter's whatever it drafts: B = 1 once, with the default.)
        one_by_one = [ours.generate([request])[0] for request in batch] if drafter == "batch_suffix" else together
        assert [r.token_ids for r in together] == plain[name], name
        assert [r.token_ids for r in one_by_one] == plain[name], name
        sampled_rows = [r for r, request in zip(together + one_by_one, batch + batch) if not request.sampling.greedy]
        checked += sum(r.stats.num_checked_draft_tokens for r in sampled_rows)
        accepted += sum(j * n for r in sampled_rows for j, n in enumerate(r.stats.accepted_length_histogram))
    assert checked > 0, f"{drafter}: no draft of a sampled row was verified"
    if drafter in ("rest", "batch_suffix", "context_ngram"):
        assert accepted > 0, f"{drafter}: no draft token of a sampled row was accepted"


def test_a_prediction_is_drafted_from_first_and_changes_no_token(engines, requests, reference, sampled, tiny_model_dir):
    """The rows' expected answers, edited (a token dropped, two inserted), as predictions: drafted
    through the edits (most tokens come from them), and every token is plain decoding's, greedy
    and sampled (drafters/prediction.py)."""
    ours = engines[1]
    swap(ours, tiny_model_dir, "context_ngram")
    edited = [ids[:10] + ids[11:30] + [5, 6] + ids[30:] for ids in reference]
    results = ours.generate([dataclasses.replace(r, prediction=tuple(ids)) for r, ids in zip(requests, edited)])
    assert [r.token_ids for r in results] == reference
    from_prediction = sum(r.stats.strategy_accepted_tokens.get("prediction", 0) for r in results)
    assert from_prediction > 0.6 * sum(map(len, reference)), [r.stats.strategy_accepted_tokens for r in results]
    # OpenAI's names for the same count, and the prediction's tokens drafted and not accepted.
    assert sum(r.stats.accepted_prediction_tokens for r in results) == from_prediction
    assert all(r.stats.rejected_prediction_tokens >= 0 for r in results)
    assert sum(r.stats.rejected_prediction_tokens for r in results) > 0  # the inserted tokens were drafted past
    batches, plain, _ = sampled
    hot = [dataclasses.replace(r, prediction=tuple(ids)) for r, ids in zip(batches["sampled"], plain["sampled"])]
    results = ours.generate(hot)
    assert [r.token_ids for r in results] == plain["sampled"]
    assert sum(r.stats.strategy_accepted_tokens.get("prediction", 0) for r in results) > 0.6 * sum(
        map(len, plain["sampled"])
    )


# Last in the module: closing this third engine tears down vLLM's process-wide parallel groups,
# which the module's engines need for every later step.
@pytest.mark.slow  # a third vLLM engine (about 10 s): make test-slow
def test_vllm_generates_with_a_model_the_transformers_engine_refuses(tiny_gemma3_dir):
    engine = build_engine(config(tiny_gemma3_dir, "drafting.drafter=context_ngram", "drafting.w=3"))
    try:
        result = engine.generate([Request("g", engine.tokenizer("Hello there")["input_ids"], 8)])[0]
    finally:
        engine.close()
    assert isinstance(result, Result) and len(result.token_ids) == 8 and result.stats.num_target_calls >= 1


def test_the_engine_reports_the_step_cost_its_proposer_measured(engines, requests, reference):
    plain, ours = engines
    ours.generate(requests[:2])
    a, b = ours.steps().step_cost  # a step's seconds, and per token fed (StepCostFit)
    assert a > 0 and b > 0
    assert plain.steps().step_cost is None  # no proposer of ours: nothing measured


def test_requests_with_the_same_common_settings_share_one_sampling_params():
    """As LLM.generate shares its one; a request with settings of its own gets its own, and what
    vLLM refuses is named with the request, cached or not."""
    from pipeline.engines.errors import RequestError
    from pipeline.engines.vllm.request_params import vllm_params

    greedy = [Request(str(i), [1, 2], 4) for i in range(3)]
    assert vllm_params(greedy[0], 4) is vllm_params(greedy[1], 4) is vllm_params(greedy[2], 4)
    assert vllm_params(greedy[0], 5).max_tokens == 5 and vllm_params(greedy[0], 5).detokenize is False
    hot = SamplingParams(temperature=0.7, top_p=0.9, seed=11)
    sampled = vllm_params(Request("s", [1], 4, stop=("\n",), sampling=hot), 4)
    assert (sampled.seed, sampled.top_p, sampled.stop, sampled.detokenize) == (11, 0.9, ["\n"], True)
    predicted = vllm_params(Request("p", [1], 4, prediction=(5, 6)), 4)
    assert predicted is not vllm_params(greedy[0], 4) and predicted.extra_args == {"prediction": [5, 6]}
    named = vllm_params(Request("n", [1], 4, engine_sampling={"logprobs": 2}), 4)
    assert named.logprobs == 2 and named.detokenize is True
    for request in (Request("bad", [1], 4, sampling=SamplingParams(top_p=0.0, temperature=1.0)),) * 2:
        with pytest.raises(RequestError, match="request 'bad': sampling_params: .*top_p"):
            vllm_params(request, 4)
