#!/usr/bin/env python3
"""Half-precision references for textgen's model fixtures, written with transformers on the GPU.

For every fixture under MODELS_DIR (config.json + model.safetensors + reference.json from
make_model_fixtures.py) and each of float16 and bfloat16, loads the checkpoint in that dtype on CUDA
and writes reference-<dtype>.json beside it: per prompt, the last position's logits and 32 greedy
tokens decoded with the KV cache, with each step's top-5 token ids and the top-1/top-2 logit gap
(the test uses them to tell a real mismatch from a near-tie that rounding may flip).

It first adds one fixture, llama-hd128 (head size 128, GQA, prompts longer than a 16-row tile), so
that the tensor-core prefill kernel runs inside the whole model; its float32 reference comes from
make_model_fixtures.py's own code.

Run on the GPU machine; NAMES (comma-separated) records only those fixtures (and adds none):
    python3 tools/reference/make_dtype_references.py MODELS_DIR TOKENIZER_DIR [NAMES]
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_fixtures as fixtures  # noqa: E402

LONG_PROMPTS = [
    "The quick brown fox jumps over the lazy dog while the farmer watches from the old wooden "
    "fence, wondering whether the harvest will come in before the autumn rains arrive this year",
    "Kubernetes schedules pods onto nodes, restarts containers that fail, and scales deployments "
    "when the queue of waiting requests grows beyond what the current replicas can serve quickly",
    "def add(a, b):\n    return",
]


def add_hd128_fixture(models_dir, tokenizer_dir):
    d = os.path.join(models_dir, "llama-hd128")
    if os.path.exists(os.path.join(d, "reference.json")):
        return
    vocab = fixtures.Tokenizer_vocab(tokenizer_dir)
    config = LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, bos_token_id=1,
                         eos_token_id=2, rope_theta=10000.0, max_position_embeddings=512,
                         tie_word_embeddings=False)
    fixtures.PROMPTS = LONG_PROMPTS
    fixtures.build("llama-hd128", models_dir, tokenizer_dir, LlamaForCausalLM, config, 5)


def dtype_reference(model_dir, dtype):
    ref = json.load(open(os.path.join(model_dir, "reference.json")))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).cuda().eval()
    rows = []
    for p in ref["prompts"]:
        ids = p["input_ids"]
        with torch.no_grad():
            step = model(torch.tensor([ids], device="cuda"), use_cache=True)
            last = step.logits[0, -1].float()
            greedy, top5, gaps = [], [], []
            for _ in range(fixtures.NEW_TOKENS):
                logits = step.logits[0, -1].float()
                top = torch.topk(logits, 5)
                greedy.append(int(top.indices[0]))
                top5.append([int(i) for i in top.indices])
                gaps.append(float(top.values[0] - top.values[1]))
                step = model(torch.tensor([[greedy[-1]]], device="cuda"),
                             past_key_values=step.past_key_values, use_cache=True)
        rows.append({"text": p["text"], "input_ids": ids, "last_logits": last.tolist(),
                     "greedy": greedy, "top5": top5, "gaps": gaps})
    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "dtype": str(dtype).replace("torch.", ""), "attn_implementation":
            model.config._attn_implementation, "prompts": rows}


def main():
    models_dir, tokenizer_dir = sys.argv[1], sys.argv[2]
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
    if only is None:
        add_hd128_fixture(models_dir, tokenizer_dir)
    for name in sorted(os.listdir(models_dir)):
        d = os.path.join(models_dir, name)
        if not os.path.exists(os.path.join(d, "reference.json")) or (only and name not in only):
            continue
        for dtype in (torch.float16, torch.bfloat16):
            out = dtype_reference(d, dtype)
            path = os.path.join(d, f"reference-{out['dtype']}.json")
            with open(path, "w") as f:
                json.dump(out, f)
            fp32 = json.load(open(os.path.join(d, "reference.json")))["prompts"]
            agree = sum(a == b for r, q in zip(out["prompts"], fp32) for a, b in zip(r["greedy"], q["greedy"]))
            total = sum(len(r["greedy"]) for r in out["prompts"])
            err = max(max(abs(a - b) for a, b in zip(r["last_logits"], q["last_logits"]))
                      for r, q in zip(out["prompts"], fp32))
            print(f"{name} {out['dtype']}: greedy equal to float32 at {agree}/{total} steps, "
                  f"max last-logit error vs float32 {err:.4f}, attention {out['attn_implementation']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
