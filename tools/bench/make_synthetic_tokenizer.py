#!/usr/bin/env python3
"""A byte-level BPE tokenizer.json of a real model's vocabulary size, for benchmarks of constrained
decoding on random-weight checkpoints (no model hub here): the vocabulary of a byte-level fixture
(tests/reference/tokenizers/llama3), then pairs of its tokens joined (seeded) until SIZE ids, as
bench_grammar pads its vocabulary. Ids 0-2 are special (<s>, </s>, <unk>: Llama-2's BOS and EOS are
1 and 2). Only decoding matters (the engine's grammar masks read each id's bytes).

Usage: make_synthetic_tokenizer.py OUT_DIR [--size 32000] [--fixture DIR] [--seed 0]
"""
import argparse
import json
import os
import random

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--size", type=int, default=32000)
ap.add_argument("--fixture", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "reference",
                                                  "tokenizers", "llama3"))
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()
src = json.load(open(os.path.join(a.fixture, "tokenizer.json")))
special = {t["content"] for t in src["added_tokens"]}
base = [t for t in src["model"]["vocab"] if t not in special]
rng = random.Random(a.seed)
vocab, seen = {}, set()
for i, name in enumerate(["<unk>", "<s>", "</s>"]):
    vocab[name] = i
    seen.add(name)
for t in base:
    if len(vocab) >= a.size:
        break
    if t not in seen:
        vocab[t] = len(vocab)
        seen.add(t)
while len(vocab) < a.size:
    t = rng.choice(base) + rng.choice(base)
    if t not in seen:
        vocab[t] = len(vocab)
        seen.add(t)
tok = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True} for c, i in vocab.items() if i < 3],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "post_processor": None,
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []},
}
os.makedirs(a.out, exist_ok=True)
json.dump(tok, open(os.path.join(a.out, "tokenizer.json"), "w"))
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "unk_token": "<unk>"}, open(os.path.join(a.out, "tokenizer_config.json"), "w"))
print(f"{a.out}: {len(vocab)} ids")
