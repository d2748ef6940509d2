#!/usr/bin/env python3
"""float16 and bfloat16 references for the pre-quantized GPT-Q, AWQ and Marlin fixtures, on the GPU.

make_quant_fixtures.py records each fixture's float32 reference from the dequantized model in
transformers. This script rebuilds that same dequantized model in memory (the fixture's seed and
make_quant_fixtures.py's own code; it first checks that the rebuilt float32 model reproduces
reference.json's logits on the CPU), casts it to float16 and bfloat16 on CUDA (each dequantized
weight rounded to the dtype once) and writes reference-float16.json / reference-bfloat16.json beside
the fixture, in make_dtype_references.py's format: per prompt the last position's logits and 32
greedy tokens with each step's top-5 ids and top-1/top-2 gap. runtime_cuda_test's fixture tests
pick them up, so the CUDA backend's half-precision quantized kernels (the tensor-core GEMV, the tile
kernel, the dequantize + cuBLASLt prefill) run inside whole models against transformers.

The fp8 fixtures are not covered: their references model textgen's activation quantization with a
float32 pre-hook, which half precision would change.

Run on the GPU machine (transformers, torch with CUDA, tokenizers, safetensors):
    python3 tools/reference/make_quant_dtype_references.py tests/reference/models \
        tests/reference/tokenizers/llama2 [NAMES]
"""
import json
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_fixtures as fixtures  # noqa: E402
import make_quant_fixtures as quant  # noqa: E402

JOBS = {"llama-gptq-g32": ("gptq-g32", 41), "llama-gptq-actorder": ("gptq-actorder", 42),
        "llama-awq-g32": ("awq", 44), "llama-marlin": ("marlin", 48)}


def rebuild(name, tokenizer_dir):
    """The fixture's dequantized float32 model, as make_quant_fixtures.build made it."""
    kind, seed = JOBS[name]
    captured = {}

    def capture(_name, model, *_args, **_kwargs):
        captured["model"] = model

    write = quant.write_fixture
    quant.write_fixture = capture
    try:
        quant.build(name, kind, None, tokenizer_dir, seed)
    finally:
        quant.write_fixture = write
    return captured["model"]


def check_float32(model, model_dir):
    """The rebuilt model gives reference.json's last-position logits (CPU, float32)."""
    ref = json.load(open(os.path.join(model_dir, "reference.json")))
    worst = 0.0
    with torch.no_grad():
        for p in ref["prompts"]:
            logits = model(torch.tensor([p["input_ids"]])).logits[0, -1]
            worst = max(worst, float((logits - torch.tensor(p["last_logits"])).abs().max()))
    if worst > 1e-4:
        raise RuntimeError(f"{model_dir}: the rebuilt model differs from reference.json by {worst}")
    return worst


def dtype_reference(model, ref, dtype):
    model = model.to(dtype).cuda().eval()
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
            "dtype": str(dtype).replace("torch.", ""),
            "attn_implementation": model.config._attn_implementation,
            "weights": "the dequantized float32 weights rounded to the dtype once", "prompts": rows}


def main():
    models_dir, tokenizer_dir = sys.argv[1], sys.argv[2]
    names = sys.argv[3].split(",") if len(sys.argv) > 3 else sorted(JOBS)
    for name in names:
        d = os.path.join(models_dir, name)
        model = rebuild(name, tokenizer_dir)
        err = check_float32(model, d)
        ref = json.load(open(os.path.join(d, "reference.json")))
        for dtype in (torch.float16, torch.bfloat16):
            out = dtype_reference(rebuild(name, tokenizer_dir), ref, dtype)
            with open(os.path.join(d, f"reference-{out['dtype']}.json"), "w") as f:
                json.dump(out, f)
            agree = sum(a == b for r, q in zip(out["prompts"], ref["prompts"])
                        for a, b in zip(r["greedy"], q["greedy"]))
            total = sum(len(r["greedy"]) for r in out["prompts"])
            print(f"{name} {out['dtype']}: rebuilt float32 within {err:.1e} of reference.json; greedy "
                  f"equal to float32 at {agree}/{total} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
