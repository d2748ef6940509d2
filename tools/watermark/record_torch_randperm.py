#!/usr/bin/env python3
"""Records torch.randperm on a seeded CPU generator, the draw behind TGI's watermark green lists
(WatermarkLogitsProcessor: torch.Generator().manual_seed(15485863 * previous_token), then
torch.randperm(vocab)), into tests/reference/watermark/torch_randperm.json. textgen's
torchCpuRandperm (base/src/watermark.cpp) is tested against it. Run where torch is installed (the
GPU machine): python3 tools/watermark/record_torch_randperm.py OUT.json"""
import json
import sys

import torch

HASH_KEY = 15485863


def main(out_path):
    cases = []
    for vocab, prevs, keep in [
        (10, [0, 1, 2, 7], None),
        (4096, [0, 1, 2, 3, 17, 1000, 4095], None),
        (32000, [1, 2, 31999], 512),
        (128256, [1, 128000, 300000], 512),
    ]:
        for prev in prevs:
            g = torch.Generator(device="cpu")
            g.manual_seed(HASH_KEY * prev)
            perm = torch.randperm(vocab, device="cpu", generator=g).tolist()
            cases.append({
                "previous": prev,
                "vocab": vocab,
                "seed": HASH_KEY * prev,
                "prefix": perm if keep is None else perm[:keep],
                "green_half_sum": sum(perm[: int(vocab * 0.5)]),
            })
    with open(out_path, "w") as f:
        json.dump({"torch": torch.__version__, "hash_key": HASH_KEY, "cases": cases}, f)
        f.write("\n")
    print(f"recorded {len(cases)} permutations with torch {torch.__version__}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/reference/watermark/torch_randperm.json")
