"""Draws the N-Grammys paper's Figure 1 for this machine: relative cost of a verification call.

    python -m jobs.plot_costs --model M --out DIR [--context-lengths 25,100,500]

One heatmap per context length ℓ: the time of a forward call over a [k, w+1] block divided by a
single-token call's, measured here (and cached per model and device, so the decoder's
`k: auto` reads the same numbers). Writes DIR/costs_l<ℓ>.png and DIR/costs.json.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from jobs.plots import save_heatmap
from pipeline.config import ModelConfig
from pipeline.engines.transformers import (
    GRID_CONTEXT,
    CostModel,
    cached_cost_model,
    measure,
    use_gqa_attention,
)
from pipeline.model_loading import cache_root, load_model


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=ModelConfig().name)
    parser.add_argument("--out", default="plots/costs", type=Path)
    parser.add_argument("--context-lengths", default=",".join(map(str, GRID_CONTEXT)),
                        type=lambda v: tuple(int(x) for x in v.split(",")))
    return parser.parse_args(argv)


def heatmap(costs: CostModel, index: int, path: Path) -> None:
    title = f"call time / single-token call, ℓ = {costs.context_lengths[index]}\n{costs.device}"
    save_heatmap(np.asarray(costs.relative[index]), [str(k) for k in costs.ks],  # [K, W]
                 [str(w - 1) for w in costs.widths], path, title)


def main(argv=None) -> list[Path]:
    args = parse_args(argv)
    loaded = load_model(ModelConfig(name=args.model))
    use_gqa_attention(loaded.model)  # the calls the transformers engine makes
    if args.context_lengths == GRID_CONTEXT:
        costs = cached_cost_model(loaded.model, loaded.fingerprint, cache_root(ModelConfig(name=args.model)))
    else:
        costs = measure(loaded.model, context_lengths=args.context_lengths)
    args.out.mkdir(parents=True, exist_ok=True)
    costs.save(args.out / "costs.json")
    paths = []
    for index, length in enumerate(costs.context_lengths):
        paths.append(args.out / f"costs_l{length}.png")
        heatmap(costs, index, paths[-1])
    print("\n".join(str(p) for p in paths))
    return paths


if __name__ == "__main__":
    main()
