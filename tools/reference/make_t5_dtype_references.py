#!/usr/bin/env python3
"""bfloat16 references for textgen's T5 fixtures, written with transformers on the GPU.

For each T5 fixture under MODELS_DIR (make_t5_fixtures.py's folders), loads the checkpoint with
T5ForConditionalGeneration in bfloat16 on CUDA and writes reference-bfloat16.json beside it: per
prompt, 24 greedy tokens by full recomputation from decoder_start_token_id (as the float32
reference: no cache, EOS does not stop it), each step's top-5 ids and top-1/top-2 logit gap (the
test tells a real mismatch from a near-tie that rounding may flip), and the first step's logits.
float16 is not recorded: textgen refuses it for T5 (its activations overflow).

Run on the GPU machine:
    python3 tools/reference/make_t5_dtype_references.py MODELS_DIR [NAMES]
"""
import json
import os
import sys

import torch
import transformers
from transformers import T5ForConditionalGeneration

STEPS = 24


def f32(x):
    return float(torch.tensor(x, dtype=torch.float32).item())


@torch.no_grad()
def record(model, enc_ids, start):
    enc = torch.tensor([enc_ids], device="cuda")
    dec = [start]
    out = {"greedy": [], "top5": [], "gaps": []}
    for step in range(STEPS):
        logits = model(input_ids=enc, decoder_input_ids=torch.tensor([dec], device="cuda")).logits
        row = logits[0, -1].float()
        top = torch.topk(row, 5)
        ids = [int(i) for i in top.indices]
        out["greedy"].append(ids[0])
        out["top5"].append(ids)
        out["gaps"].append(f32(top.values[0] - top.values[1]))
        if step == 0:
            out["first_logits"] = [f32(v) for v in row.cpu()]
        dec.append(ids[0])
    return out


def main():
    models_dir = sys.argv[1]
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else [
        n for n in sorted(os.listdir(models_dir)) if n.startswith("t5-")]
    for name in names:
        d = os.path.join(models_dir, name)
        with open(os.path.join(d, "reference.json")) as f:
            ref = json.load(f)
        model = T5ForConditionalGeneration.from_pretrained(d, dtype=torch.bfloat16).cuda().eval()
        start = model.config.decoder_start_token_id
        prompts = [dict(input_ids=p["input_ids"], **record(model, p["input_ids"], start))
                   for p in ref["prompts"]]
        out = {"transformers_version": transformers.__version__,
               "torch_version": torch.__version__,
               "device": torch.cuda.get_device_name(0),
               "dtype": "bfloat16", "prompts": prompts}
        with open(os.path.join(d, "reference-bfloat16.json"), "w") as f:
            json.dump(out, f, separators=(",", ":"))
        print(name, [p["greedy"][:8] for p in prompts])


if __name__ == "__main__":
    main()
