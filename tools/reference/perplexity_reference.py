#!/usr/bin/env python3
"""An independent re-computation of bench_perplexity (bench/runtime/perplexity.cpp) with transformers.

The model runs in float32 on the CPU; for each --quantize format its linear layers (all but the
tied head) are replaced by the format's dequantized weights and activation scheme, written here
in torch from the formats' definitions (textgen/kernels/quant_gemm.h) rather than from textgen's
code: bitsandbytes nf4/fp4 (absmax per block of 64 inputs, nearest code), LLM.int8 (int8 weights per
output channel, outlier columns |x| >= 6 kept in full, other columns int8 per row), EETQ (the same
weights, activations as they are), fp8 (e4m3 weights with one scale per stacked tensor, dynamic
per-tensor e4m3 activations). The text is tokenized and windowed exactly as bench_perplexity does.

  bash tools/reference/sid-python.sh tools/reference/perplexity_reference.py models/demo \
      bench/data/python-3.11-docs-heldout.txt [--window 512] [--documents] [--formats all]
"""
import argparse
import json
import math

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0]
FP4 = [0.0, 1 / 192, 2 / 3, 1.0, 1 / 3, 0.5, 1 / 6, 0.25, -0.0, -1 / 192, -2 / 3, -1.0, -1 / 3, -0.5,
       -1 / 6, -0.25]
FORMATS = ["none", "bitsandbytes", "bitsandbytes-nf4", "bitsandbytes-fp4", "eetq", "fp8"]


def block_of(n):
    b = 64
    while b > 2 and n % b:
        b -= 2
    return b


def table_quantize(w, table):
    """Blockwise absmax along the inputs, each value the nearest code (ties to the lower code)."""
    out, inp = w.shape
    b = block_of(inp)
    blocks = w.reshape(out, inp // b, b)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    x = torch.where(amax > 0, blocks / amax, torch.zeros_like(blocks))
    t = torch.tensor(table, dtype=torch.float32)
    # Nearest value; argmin keeps the first (lower code) of equal distances, as the thresholds do
    # for nf4 (fp4's ties fall on its sign bit: irrelevant at a distance of 0).
    idx = (x.unsqueeze(-1) - t).abs().argmin(dim=-1)
    return (t[idx] * amax).reshape(out, inp)


def int8_rowwise(w):
    amax = w.abs().amax(dim=1, keepdim=True)
    q = torch.where(amax > 0, torch.round(w * (127.0 / amax)), torch.zeros_like(w)).clamp(-127, 127)
    return q * (amax / 127.0)


def fp8_e4m3(x):
    """Saturating round-to-nearest-even onto e4m3fn."""
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)


def fp8_tensor(w):
    mul = 448.0 / max(w.abs().max().item(), 1e-12)
    return fp8_e4m3(w * mul) / mul


class QuantLinear(torch.nn.Module):
    def __init__(self, weight, act):
        super().__init__()
        self.weight = weight
        self.act = act

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1]).float()
        if self.act == "llm.int8":
            outlier_cols = (x.abs() >= 6.0).any(dim=0)
            inlier = x.abs() < 6.0
            amax = torch.where(inlier, x.abs(), torch.zeros_like(x)).amax(dim=1, keepdim=True)
            q = torch.where(amax > 0, torch.round(x * (127.0 / amax)) * (amax / 127.0), torch.zeros_like(x))
            x = torch.where(outlier_cols.unsqueeze(0), x, q)
        elif self.act == "fp8":
            amax = x.abs().max().item()
            s = amax / 448.0 if amax > 0 else 1.0
            x = fp8_e4m3(x / s) * s
        return (x @ self.weight.t()).reshape(*shape[:-1], -1)


def quantize_model(model, fmt):
    if fmt == "none":
        return
    for layer in model.model.layers:
        groups = [[layer.self_attn, ["q_proj", "k_proj", "v_proj"]], [layer.self_attn, ["o_proj"]],
                  [layer.mlp, ["gate_proj", "up_proj"]], [layer.mlp, ["down_proj"]]]
        for parent, names in groups:
            ws = [getattr(parent, n).weight.data.float() for n in names]
            stacked = torch.cat(ws, dim=0)  # textgen quantizes q/k/v and gate/up as one tensor
            if fmt in ("bitsandbytes-nf4", "bitsandbytes-fp4"):
                deq, act = table_quantize(stacked, NF4 if fmt.endswith("nf4") else FP4), None
            elif fmt == "bitsandbytes":
                deq, act = int8_rowwise(stacked), "llm.int8"
            elif fmt == "eetq":
                deq, act = int8_rowwise(stacked), None
            else:
                deq, act = fp8_tensor(stacked), "fp8"
            row = 0
            for n, w in zip(names, ws):
                setattr(parent, n, QuantLinear(deq[row:row + w.shape[0]], act))
                row += w.shape[0]


def tokens_of(model_dir, text_file, documents):
    tok = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    text = open(text_file, encoding="utf-8").read()
    if not documents:
        return tok.encode(text).ids
    ids = []
    for d in text.split("\f")[1:]:
        if "\n" in d:
            ids.extend(tok.encode(d.split("\n", 1)[1]).ids + [2])
    return ids


def perplexity(model, ids, window):
    nll, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, window):
            x = torch.tensor(ids[s:s + window]).unsqueeze(0)
            if x.shape[1] < 2:
                break
            logits = model(input_ids=x).logits[0].double()
            lp = torch.log_softmax(logits[:-1], dim=-1)
            nll -= lp.gather(1, x[0, 1:].unsqueeze(1)).sum().item()
            count += x.shape[1] - 1
    return math.exp(nll / count), count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--documents", action="store_true")
    ap.add_argument("--formats", default="all")
    a = ap.parse_args()
    torch.set_num_threads(1)
    ids = tokens_of(a.model, a.text, a.documents)
    formats = FORMATS if a.formats == "all" else a.formats.split(",")
    results, base = [], None
    for fmt in formats:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
        model.eval()
        quantize_model(model, fmt)
        ppl, count = perplexity(model, ids, a.window)
        if fmt == "none":
            base = ppl
        delta = None if base is None or fmt == "none" else 100 * (ppl / base - 1)
        results.append({"quantize": fmt, "perplexity": ppl, "predictions": count, "vs_none_percent": delta})
        print(f"{fmt:18s} {ppl:10.4f} {'' if delta is None else f'{delta:+.2f}%'}", flush=True)
    print(json.dumps({"reference": "transformers float32", "tokens": len(ids), "window": a.window,
                      "results": results}))


if __name__ == "__main__":
    main()
