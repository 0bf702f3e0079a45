"""How well conditioned Algorithm 1's updates are on a trained model, layer by layer: the evidence behind
docs/models.md's account of why the open loop holds on Qwen2.5 0.5B (Thm 9, a matrix) and not on Gemma 3
270M (Thm 10, a scale).

    python benchmarks/output_rule_conditioning.py --model qwen2.5-0.5b [--dtype float32] [--tokens 4]

For each generated token (greedy, with the context) the open loop (`naive`) patches every layer; per layer
it prints, as medians over tokens:
- hidden_rel: max |x′_l − x_l| / max |x_l|, the patched pass against the with-context pass;
- ‖y‖, the outer matrix's input at the query (Thm 9 divides by ‖y‖²), and for Gemma min |h|, the post-MLP
  norm's normalized input (Thm 10 divides by it elementwise);
- out_gain: how much more the output update can amplify an input change than the original output map does:
  Thm 9: ‖ΔW′‖₂ / ‖W′‖₂ with ‖ΔW′‖₂ = ‖r‖ / ‖y‖ (rank 1); Thm 10: max |m + Δm| / max |m| (m the scale as the
  norm applies it);
- in_gain: the same for the input update (Thm 7), max over W_gate, W_up: ‖ΔW‖₂ / ‖W‖₂, ‖ΔW‖₂ =
  ‖W (z_C − z)‖ / ‖z‖.
The patched tensors are the ones the patched pass ran with (`patched_pass(keep=...)`), differenced against
the model's own; nothing is recomputed from formulas here. Not a test; prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

PROMPT = "Write a single-sentence weather forecast for Mars, from the perspective of a slightly annoyed robot."


def spectral(W, cache: dict, key: str) -> float:
    import torch

    if key not in cache:
        cache[key] = float(torch.linalg.matrix_norm(W.double(), ord=2))
    return cache[key]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()

    import torch

    from experiments.core.runtime import resolve_dtype
    from experiments.patching.load import load_checked
    from experiments.patching.patcher import Patcher
    from experiments.patching.rules.scale import scale_input
    from experiments.zoo.prompts import encode_prompt

    torch.set_num_threads(a.threads)
    bundle = load_checked(a.model, resolve_dtype(a.dtype), "cpu")
    patcher = Patcher(bundle.model, "naive")
    adapter = patcher.adapter
    if not (adapter.rule.takes_ridge or adapter.rule.post_norm):  # a matrix (Thm 9) or a post-norm scale (Thm 10)
        sys.exit(f"{a.model}: its output rule is {adapter.output_rule}; this table is for Thm 9 (outer weight) "
                 f"and Thm 10 (scale)")
    ids = encode_prompt(bundle, PROMPT)["input_ids"]
    cache, query = patcher.start({"input_ids": ids})
    norms: dict = {}
    rows: dict[int, dict[str, list[float]]] = {}
    for _ in range(a.tokens):
        step = patcher.context_step({"input_ids": query}, cache)
        logits, caps, cache = step.logits, step.targets, step.cache
        keep: dict = {}
        result = patcher.patched_pass(query, step, keep=keep)
        for index, (layer, cap) in enumerate(zip(patcher.layers, caps, strict=True)):
            row = rows.setdefault(index, {})
            prefix = patcher.layer_names[index] + "."
            row.setdefault("hidden_rel", []).append(result.hidden_rel[index])
            in_gain = 0.0
            for name in adapter.input_matrices:
                W = layer.get_parameter(name).double()
                dW = keep[prefix + name].double() - W
                # ΔW is rank 1: its Frobenius norm is its 2-norm, without an SVD per layer and token
                in_gain = max(in_gain, float(torch.linalg.matrix_norm(dW)) / spectral(W, norms, prefix + name))
            row.setdefault("in_gain", []).append(in_gain)
            P = layer.get_parameter(adapter.output_param).double()
            dP = keep[prefix + adapter.output_param].double() - P
            if not adapter.rule.post_norm:  # Thm 9: W_down
                y = cap.values["y"].double()
                row.setdefault("|y|", []).append(float(y.norm()))
                row.setdefault("out_gain", []).append(float(torch.linalg.matrix_norm(dP))  # rank 1, as ΔW
                                                      / spectral(P, norms, prefix + adapter.output_param))
            else:  # Thm 10: the post-MLP scale (Gemma stores m − 1)
                offset = adapter.scale_offset
                h = scale_input(adapter.owner(layer), cap.values["d"], torch.float64)
                row.setdefault("min|h|", []).append(float(h.abs().min()))
                row.setdefault("out_gain", []).append(float((P + offset + dP).abs().max() / (P + offset).abs().max()))
        query = logits.argmax().view(1, 1)
    keys = list(rows[0])
    print(f"{a.model} {a.dtype}, naive (Alg. 1), {a.tokens} tokens, medians over tokens")
    print("layer" + "".join(f"{k:>13}" for k in keys))
    for index, row in rows.items():
        print(f"{index:>5}" + "".join(f"{statistics.median(row[k]):>13.3g}" for k in keys))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
