"""replay --project: what a replay's rows would run at on a GPU (or this CPU's vLLM engine), and what
drafting.speculation auto would choose at each batch size (jobs/benchmark/replay.py replays the rows;
this module projects them: the formulas are in `projection`'s and `cpu_projection`'s docstrings)."""

from __future__ import annotations

from jobs.benchmark.step_costs import GPUS, MODELS
from pipeline.engines import speculation
from pipeline.engines.speculation import Chooser


def auto_projection(rows: list[dict], args) -> list[dict]:
    """What drafting.speculation auto gives at each batch size (pipeline/engines/speculation.py), from the
    projected tokens/s of its candidates: ours as vLLM runs it (synchronously; with the step budget,
    and drafting from the predictions where the rows have them), plain (asynchronously on a GPU) and,
    on a GPU, vllm_ngram standing for `ngram_gpu` (asynchronous). The actor's own Chooser runs over
    --actor-hours of work, each switch costing --restart-seconds with nothing generated; a short
    job (`rule`) runs the rule's mode. Ratios against plain as the user runs it (async on a GPU)."""
    gpu = args.project != "cpu"
    parts = ("gpu", "host", "drafter") if gpu else ("gpu", "drafter")
    budget = f"_budget_{args.project.replace('-', '_')}"
    ours = "ours_prediction" if any(r["method"] == "ours_prediction" for r in rows) else "ours"
    auto = []
    for batch in sorted({row["batch"] for row in rows}):
        found = {row["method"]: row for row in rows if row["batch"] == batch}
        if "plain" not in found or ours not in found:
            continue
        rates = {
            "ours": rate(found.get(ours + budget, found[ours]), *parts),
            speculation.PLAIN: rate(found["plain"], "gpu") if gpu else rate(found["plain"], *parts),
        }
        ngram = found.get("vllm_ngram_gpu", found.get("vllm_ngram"))
        if gpu and ngram is not None:
            rates["vllm_ngram_gpu"] = rate(ngram, "gpu")
        predicted = ours == "ours_prediction"
        platform = "gpu" if gpu else "cpu"
        rule = speculation.platform_rule(platform, batch, predicted)
        short = rates[Chooser(modes=tuple(rates), platform=platform, running=batch, predictions=predicted).mode]
        plain = rates[speculation.PLAIN]
        for hours in args.actor_hours:
            measured, chooser = simulate_auto(rates, platform, batch, predicted, 3600 * hours, args.restart_seconds)
            auto.append(
                {
                    "batch": batch,
                    "actor_hours": hours,
                    "ours": ours + budget if ours + budget in found else ours,
                    **{f"{name}_tokens_per_second": round(value, 1) for name, value in rates.items()},
                    "rule": rule.mode,
                    "rule_measures": rule.measure,
                    "rows_with_predictions": predicted,
                    "short_job_vs_plain": round(short / plain, 3),
                    "auto_drafter": chooser.mode,
                    "auto_switches": len(chooser.switches),
                    "auto_tokens_per_second": round(measured, 1),
                    "auto_vs_plain": round(measured / plain, 3),
                    "auto_vs_ours": round(measured / rates["ours"], 3),
                    "best": max(rates, key=rates.get),
                    "auto_vs_best": round(measured / max(rates.values()), 3),
                }
            )
    return auto


def simulate_auto(
    rates: dict[str, float], platform: str, running: int, predicted: bool, seconds: float, restart_seconds: float
):
    """An actor's Chooser (its engine `running` requests at once, on `platform`, its rows with
    predictions or not, as the job tells it) over `seconds` of work at each mode's tokens/s `rates`:
    a batch of `running` rows a second; a switch costs `restart_seconds` with nothing generated.
    Returns (its tokens/s, the chooser)."""
    chooser = Chooser(
        modes=tuple(rates),
        platform=platform,
        running=running,
        expected_rows=int(seconds) * running,
        predictions=predicted,
    )
    chooser.restart_seconds = restart_seconds
    busy = clock = tokens = 0.0
    while clock < seconds:
        made = rates[chooser.mode]
        busy, clock, tokens = busy + 1.0, clock + 1.0, tokens + made
        target = chooser.observe(busy, int(made), running, running if predicted else 0)
        if target is not None:
            chooser.switched(target, 0.0, restart_seconds)
            clock += restart_seconds
    return tokens / clock, chooser


def rate(row: dict, *parts: str) -> float:
    """A replayed row's projected tokens/s with the named parts of its projected seconds."""
    return row["tokens_per_step"] * row["request_steps"] / sum(row["projected_seconds"][p] for p in parts)


def decoding_rate(row: dict) -> float:
    """A replayed row's projected tokens/s without its prompts' prefill (`--project cpu`)."""
    spent = row["projected_seconds"]
    return row["tokens_per_step"] * row["request_steps"] / (spent["gpu"] - spent["prefill"] + spent["drafter"])


def cpu_projection(rows: list[dict], host: dict) -> dict:
    """Each row's projected tokens/s on this CPU's vLLM engine (`--project cpu`) against plain
    decoding's at its batch size: a replayed step t that feeds n_t tokens takes c(n_t) (host and
    device: step_costs.py's CpuStepCost over the --host-step report) and d_t for the drafter, on
    the same cores one after the other: tokens / Σ_t (c(n_t) + d_t), a request's first step feeding its
    whole prompt (its prefill: the same for every method, on this CPU about as long as the
    answers' decoding for corpus work; `decoding_vs_plain` leaves it out). The live benchmark
    (--throughput --engine vllm) on the same machine measures what this projects, with its drift;
    the projection has none, so it tells apart differences of a few % that live runs cannot."""
    projected = []
    for batch in sorted({row["batch"] for row in rows}):
        plain = next((r for r in rows if r["batch"] == batch and r["method"] == "plain"), None)
        for row in (r for r in rows if r["batch"] == batch):
            spent = row["projected_seconds"]
            entry = {
                "method": row["method"],
                "batch": batch,
                "tokens_per_second": round(rate(row, "gpu", "drafter"), 1),
                "prefill_share": round(spent["prefill"] / (spent["gpu"] + spent["drafter"]), 3),
            }
            if plain is not None:
                entry["vs_plain"] = round(rate(row, "gpu", "drafter") / rate(plain, "gpu", "drafter"), 3)
                entry["decoding_vs_plain"] = round(decoding_rate(row) / decoding_rate(plain), 3)
            projected.append(entry)
    measured = ", ".join(
        f"B {r['batch']}: {r['host_ms_per_step'] + r['device_ms_per_step']:.1f}" for r in host["median"]
    )
    return {
        "gpu": "none: this CPU",
        "model": host.get("model", ""),
        "formula": "tokens/s = sum tokens / sum_t (c(n_t) + d_t), n_t counting a request's prompt at its first step; "
        "c(n) = a plain step of n requests on this CPU's "
        f"vLLM engine, host and device, ms (--host-step): {measured}",
        "rows": projected,
    }


def projection(rows: list[dict], name: str, measured: dict | None = None, host: dict | None = None) -> dict:
    """Each row's projected tokens/s against plain decoding's at its batch size. A replayed step t
    of B_t running requests that feeds n_t tokens (one per request plus their drafts) over requests
    of mean context ctx_t takes c(n_t, ctx_t) on the GPU (jobs/benchmark/step_costs.py's roofline, or with
    `measured` (--step-costs) the step cost measured on that GPU), h(B_t) on the host (scheduling,
    inputs, outputs: `host`, --host-step, measured by jobs.benchmark.host_step; 0 without it) and
    d_t for the drafter on the CPU (vLLM runs a `custom_class` or `suffix` proposer between steps;
    plain runs none, d_t = 0):

        synchronous (how vLLM 0.32 runs ours and its `suffix`):  tokens / Σ_t (c_t + h(B_t) + d_t)
        asynchronous (plain vLLM's default on a GPU; `ngram_gpu`): tokens / Σ_t c_t

    the host and a device-side drafter's work overlapping the GPU's steps (taken as fully hidden:
    an upper bound for the asynchronous side). Ratios: `vs_plain_async` (each row as it runs today,
    synchronous, against plain vLLM with async scheduling: what a GPU user compares us with),
    `vs_vllm_suffix` (against vLLM's suffix method, both synchronous),
    `vs_plain_sync` (against plain without it), `async_vs_plain_async` (each row as if it ran
    asynchronously: ours under model runner V2 with a device-side drafter; vllm_ngram stands for
    `ngram_gpu`, whose V2 kernel looks up the same n-grams on the GPU)."""
    gpu, model = (part.lower() for part in name.split("-"))
    projected = []
    for batch in sorted({row["batch"] for row in rows}):
        plain = next((r for r in rows if r["batch"] == batch and r["method"] == "plain"), None)
        suffix = next((r for r in rows if r["batch"] == batch and r["method"] == "vllm_suffix"), None)
        for row in (r for r in rows if r["batch"] == batch):
            entry = {
                "method": row["method"],
                "batch": batch,
                "tokens_per_second": round(rate(row, "gpu", "host", "drafter"), 1),
                "tokens_per_second_async": round(rate(row, "gpu"), 1),
            }
            if plain is not None:
                plain_async, plain_sync = rate(plain, "gpu"), rate(plain, "gpu", "host", "drafter")
                entry["vs_plain_async"] = round(entry["tokens_per_second"] / plain_async, 3)
                entry["vs_plain_sync"] = round(entry["tokens_per_second"] / plain_sync, 3)
                entry["async_vs_plain_async"] = round(entry["tokens_per_second_async"] / plain_async, 3)
            if suffix is not None:  # both synchronous, as vLLM runs them today
                entry["vs_vllm_suffix"] = round(entry["tokens_per_second"] / rate(suffix, "gpu", "host", "drafter"), 3)
            projected.append(entry)
    return {
        "gpu": GPUS[gpu].name,
        "model": MODELS[model].name,
        "formula": projection_formula(measured, host),
        "rows": projected,
    }


def projection_formula(measured: dict | None, host: dict | None) -> str:
    """The projection's formula in words, with where its step and host costs come from."""
    step = (
        f"c(n, B) measured (MeasuredStepCost over --step-costs, context {measured['context']}, {measured['device']})"
        if measured is not None
        else "c(n, ctx) = max((2 P + B ctx kv) / bandwidth, 2 P n / flops)"
    )
    source = (
        "this CPU's vLLM host milliseconds per step, scaled to another host by jobs.benchmark.host_speed"
        if host is not None and "scaled_by" in host
        else "this CPU's vLLM host milliseconds per step"
    )
    hosted = (
        f"h(B) = {source} (--host-step): "
        + ", ".join(f"B {r['batch']}: {r['host_ms_per_step']}" for r in host["median"])
        if host is not None
        else "h(B) = 0 (no --host-step)"
    )
    return (
        f"synchronous: tokens/s = sum tokens / sum_t (c(n_t) + h(B_t) + d_t); asynchronous: "
        f"sum tokens / sum_t c(n_t); {step}; {hosted}"
    )
