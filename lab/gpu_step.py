"""A GPU step's cost, measured, against the roofline the replay's projection uses
(jobs/benchmark/step_costs.py): for B running requests of context ctx each fed n tokens (1 + drafts), the
seconds of a decoder step's matrix products and attention for the named model shape, random bf16
weights, replayed as one CUDA graph (no launch overhead, as vLLM's CUDA graphs).

    python -m lab gpu-step --model 8b --gpu h100 --batch 1,16,64,256 --fed 1,2,3,5,9 \
        --context 320 --out gpu_step.json

Attention (`--attention`): `gqa` is torch's SDPA with grouped-query heads (one query row per fed
token and head: at 2 or more fed tokens torch picks a kernel that reads the KV cache once per query
head); `packed` folds each KV head's query heads and fed tokens into the query rows of one head
(B, KV heads, group x fed, dim), as FlashAttention's `pack_gqa` and FlashInfer's decode kernels do,
so the KV cache is read once per KV head however many tokens are fed (what vLLM's FlashAttention
backend does on Hopper). Both attend every fed token to the whole context + fed (non-causal among
the fed tokens: the same work within a few %).

Needs a CUDA GPU and torch only (no vLLM, no Ray: it runs on a bare GPU machine). What a step of
vLLM's also does (norms, rotary embeddings, sampling, the scheduler) is left out: a few % of a
large step, more of a small one, so the measured times are a lower bound on vLLM's step.
"""

from __future__ import annotations

import time

import numpy as np

from jobs.benchmark.arguments import integers
from jobs.benchmark.report import markdown_table
from jobs.benchmark.step_costs import GPUS, MODELS, RooflineStepCost

# hidden, intermediate, layers, query heads, KV heads, head dim, vocabulary
SHAPES = {"8b": (4096, 14336, 32, 32, 8, 128, 128256), "70b": (8192, 28672, 80, 64, 8, 128, 128256)}


def attend(q, keys, values, how: str = "gqa"):
    """q: (batch, heads, fed, dim) attended over keys, values: (batch, KV heads, context, dim);
    `how` is "gqa" or "packed" (the module's docstring). Both give the same result."""
    import torch.nn.functional as F

    if how == "gqa":
        return F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
    batch, heads, fed, dim = q.shape
    kv_heads = keys.shape[1]
    packed = q.reshape(batch, kv_heads, (heads // kv_heads) * fed, dim)
    return F.scaled_dot_product_attention(packed, keys, values).reshape(batch, heads, fed, dim)


class Layers:
    """One layer's weights, used by every layer (a step reads them once per layer all the same:
    they do not stay in a 50 MB L2), and the whole step as a function of the fed tokens x."""

    def __init__(self, shape: tuple, batch: int, fed: int, context: int, parts: str = "all", attention: str = "gqa"):
        import torch

        hidden, inner, self.layers, heads, kv_heads, dim, vocab = shape
        new = dict(device="cuda", dtype=torch.bfloat16)
        self.qkv = torch.randn(hidden, (heads + 2 * kv_heads) * dim, **new) * 0.02
        self.out = torch.randn(heads * dim, hidden, **new) * 0.02
        self.up = torch.randn(hidden, 2 * inner, **new) * 0.02
        self.down = torch.randn(inner, hidden, **new) * 0.02
        self.head = torch.randn(hidden, vocab, **new) * 0.02
        self.keys = torch.randn(self.layers, batch, kv_heads, context + fed, dim, **new)
        self.values = torch.randn(self.layers, batch, kv_heads, context + fed, dim, **new)
        self.shape = (batch, fed, heads, kv_heads, dim, inner)
        self.parts = parts  # "all", "linear" (the matrix products alone) or "attention" (alone)
        self.attention = attention  # "gqa" or "packed" (see the module's docstring)

    def step(self, x):
        import torch.nn.functional as F

        batch, fed, heads, kv_heads, dim, inner = self.shape
        linear, attention = self.parts in ("all", "linear"), self.parts in ("all", "attention")
        q = x[:, : heads * dim].reshape(batch, fed, heads, dim).transpose(1, 2)
        for layer in range(self.layers):
            if linear:
                q = (x @ self.qkv)[:, : heads * dim].view(batch, fed, heads, dim).transpose(1, 2)
            attended = attend(q, self.keys[layer], self.values[layer], self.attention) if attention else q
            if linear:
                x = x + attended.transpose(1, 2).reshape(batch * fed, heads * dim) @ self.out
                gate, up = (x @ self.up).split(inner, dim=-1)
                x = x + (F.silu(gate) * up) @ self.down
            else:
                q = attended
        return x @ self.head if linear else q


def step_seconds(
    shape: tuple, batch: int, fed: int, context: int, repeats: int, parts: str = "all", attention: str = "gqa"
) -> float:
    """Median seconds of one step feeding `fed` tokens to each of `batch` requests whose cache
    holds `context` tokens (attention over context + fed, non-causal: the same work)."""
    import torch

    layers = Layers(shape, batch, fed, context, parts, attention)
    x = torch.randn(batch * fed, shape[0], device="cuda", dtype=torch.bfloat16)  # hidden = heads x head dim here
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            layers.step(x)  # warm-up before capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layers.step(x)
        times = []
        for _ in range(repeats + 3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000)
    del graph, layers
    torch.cuda.empty_cache()
    return float(np.median(times[3:]))


def add_cli_args(parser) -> None:
    parser.add_argument("--model", default="8b", choices=sorted(SHAPES))
    parser.add_argument("--gpu", default="h100", choices=sorted(GPUS))
    parser.add_argument("--batch", type=integers, default=[1, 16, 64, 256])
    parser.add_argument("--fed", type=integers, default=[1, 2, 3, 5, 9], help="tokens fed per request (1 + drafts)")
    parser.add_argument("--context", type=int, default=320)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--attention", default="gqa", choices=("gqa", "packed"), help="see the module's docstring")


def step_row(args, batch: int, fed: int, base: dict | None) -> tuple[dict, dict]:
    """One (batch, fed) step measured in its parts against the roofline; (the row, the parts' seconds)."""
    roofline = RooflineStepCost(GPUS[args.gpu], MODELS[args.model], batch, args.context)
    seconds = {
        part: step_seconds(SHAPES[args.model], batch, fed, args.context, args.repeats, part, args.attention)
        for part in ("all", "linear", "attention")
    }
    base = base or seconds
    predicted = float(roofline.seconds(batch * fed))
    return {
        "batch": batch,
        "fed_per_request": fed,
        "seconds": round(seconds["all"], 6),
        "vs_one_token": round(seconds["all"] / base["all"], 3),
        "linear_seconds": round(seconds["linear"], 6),
        "linear_vs_one_token": round(seconds["linear"] / base["linear"], 3),
        "attention_seconds": round(seconds["attention"], 6),
        "roofline_seconds": round(predicted, 6),
        "roofline_vs_one_token": round(predicted / float(roofline.seconds(batch)), 3),
    }, seconds


def run(args) -> dict:
    import torch

    started, rows = time.time(), []
    for batch in args.batch:
        base = None
        for fed in args.fed:
            row, seconds = step_row(args, batch, fed, base)
            base = base or seconds
            rows.append(row)
    return {
        "device": torch.cuda.get_device_name(),
        "model": MODELS[args.model].name,
        "gpu_spec": GPUS[args.gpu].name,
        "context": args.context,
        "attention": args.attention,
        "torch": torch.__version__,
        "seconds": round(time.time() - started, 1),
        "rows": rows,
    }


def markdown(report: dict) -> str:
    return markdown_table(report["rows"])
