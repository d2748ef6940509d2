#!/usr/bin/env python3
"""Hugging Face side of the tokenizer benchmark (bench/tokenizer/encode_bench.cpp is textgen's).

Writes DOCS (one JSON string per line, ~10 MB of mixed prose, code, whitespace, CJK, emoji, numbers;
deterministic) unless it exists, then times single-threaded `Tokenizer.encode` of every document for
each fixture family (one warm-up pass, best of three) and writes OUT_JSON:
  {"tokenizers": version, "bytes": N, "families": {family: {"seconds": s, "tokens": t}}}
Usage: tokenizer_bench_hf.py FIXTURES_DIR DOCS OUT_JSON
"""
import json
import os
import random
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_tokenizer_fixtures as fx  # noqa: E402  (text pools and TGI's Llama override)
import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

FAMILIES = ["gpt2", "llama2", "mistral", "llama3", "t5", "unigram-byte-fallback", "wordlevel",
            "bpe-suffix"]
TARGET_BYTES = 10 * 1024 * 1024


def make_docs(path):
    rng = random.Random(7)
    words = " ".join(fx.PROSE).split()
    pools = [fx.PROSE, fx.CODE, fx.SCRIPTS, fx.EMOJI, fx.DIGITS, fx.WHITESPACE, fx.MISC]
    weights = [40, 20, 8, 3, 5, 4, 5]
    total = 0
    with open(path, "w", encoding="utf-8") as f:
        while total < TARGET_BYTES:
            parts = []
            size = rng.randint(2000, 8000)
            n = 0
            while n < size:
                if rng.random() < 0.5:
                    s = " ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) + ". "
                else:
                    s = rng.choice(rng.choices(pools, weights)[0]) + rng.choice([" ", "\n", "\n\n", " "])
                parts.append(s)
                n += len(s.encode("utf-8"))
            doc = "".join(parts)
            total += len(doc.encode("utf-8"))
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")


def main():
    fixtures, docs_path, out_path = sys.argv[1:4]
    if not os.path.exists(docs_path):
        make_docs(docs_path)
    docs = [json.loads(l) for l in open(docs_path, encoding="utf-8")]
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    result = {"tokenizers": tokenizers.__version__, "bytes": nbytes, "docs": len(docs), "families": {}}
    for family in FAMILIES:
        d = os.path.join(fixtures, family)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        config = json.load(open(os.path.join(d, "tokenizer_config.json")))
        if config.get("tokenizer_class") in ("LlamaTokenizer", "LlamaTokenizerFast"):
            tok.post_processor = fx.llama_post_processor(tok, config)
        tokens = sum(len(tok.encode(doc).ids) for doc in docs)  # warm-up (and caches)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for doc in docs:
                tok.encode(doc)
            best = min(best, time.perf_counter() - t0)
        result["families"][family] = {"seconds": best, "tokens": tokens}
        print(f"hf {family}: {nbytes / best / 1e6:.2f} MB/s, {tokens / best / 1e6:.2f} M tokens/s", flush=True)
    json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
