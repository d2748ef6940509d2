#!/usr/bin/env python3
"""Writes textgen's T5 (T5ForConditionalGeneration) reference fixtures with Hugging Face transformers.

Tiny random-weight float32 encoder-decoder checkpoints, saved with save_pretrained (safetensors and
generation_config.json), with the SentencePiece Unigram tokenizer of tests/reference/tokenizers/t5
(its TemplateProcessing appends </s>, id 1), and reference.json: per prompt the input ids, the encoder's
last hidden state, the encoder's relative-position bucket table, 24 greedy tokens computed by full
recomputation (no cache; EOS does not stop it), the full logits of the first 4 decoding steps and the
top-5 log-probabilities of all 24, with the top-1/top-2 logit gaps (weights are scaled so greedy
choices are not near-ties). docs/t5.md says what a C++ implementation must match.

Fixtures (d_model 64, d_kv 16, 4 heads, d_ff 128, 2 encoder and 3 decoder layers, 32 buckets,
max_distance 64):
  t5-gated-gelu       FLAN-T5 / T5 v1.1: gated-gelu (gelu_new) FFN, separate lm_head, no head scaling;
                      config.json as the hub's FLAN-T5 ones say it ("tie_word_embeddings": false)
  t5-relu-tied        original T5: ReLU FFN, the head is the shared embedding, the decoder output scaled by
                      d_model**-0.5 before it; config.json as the hub's t5-small one says it
  t5-gated-gelu-tied  gated-gelu with the tied, scaled head, vocabulary padded past the tokenizer's
                      (640 rows for 585 ids, as T5's 32128 for 32100) and config.json exactly as
                      transformers 5.x writes it (with its derived "scale_decoder_outputs" key)

Every fixture is reloaded with from_pretrained and its references recomputed and compared (assert), so
the saved files, config.json included, mean to transformers what the references say.

Run where transformers and torch are (float32 only):
    bash tools/reference/sid-python.sh tools/reference/make_t5_fixtures.py TOKENIZER_DIR OUT_DIR [NAMES]
e.g. TOKENIZER_DIR tests/reference/tokenizers/t5, OUT_DIR tests/reference/models.
"""
import json
import math
import os
import shutil
import struct
import sys

import torch
import transformers
from transformers import T5Config, T5ForConditionalGeneration

PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Zürich café: naïve résumé, 東京 ☕ and ½ € — ok?",  # unknown pieces (<unk>, id 2) and NFKC (½)
    "summarize: The tokenizer turns text into a sequence of integers that a model can read, and the "
    "server batches requests while the accelerator stays busy. Continuous batching keeps going.",
]
# FLAN-style task prompts: their ids show the tokenizer appends </s> (id 1) and nothing before.
TASK_TEXTS = [
    "translate English to German: The house is wonderful.",
    "summarize: studies have shown that owning a dog is good for you",
    "Answer the following question. What is the capital of France?",
]
NEW_TOKENS = 24
FULL_LOGIT_STEPS = 4
DECODER_POSITIONS = 24
BUCKET_SWEEP = 300  # relative positions -300..300 for the bucket formula tables

COMMON = dict(d_model=64, d_kv=16, num_heads=4, d_ff=128, num_layers=2, num_decoder_layers=3,
              relative_attention_num_buckets=32, relative_attention_max_distance=64, dropout_rate=0.0,
              layer_norm_epsilon=1e-6, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
              is_encoder_decoder=True)

# name, feed_forward_proj, tied head, vocab_size, seed, residual-writer scale, config.json style ("hub" or
# "transformers"). Seeds and scales picked by trying a few for clear greedy gaps and varied tokens (a tied
# head favours repeating its input token: the relu-tied fixture still repeats on 3 of its 4 prompts).
JOBS = [
    ("t5-gated-gelu", "gated-gelu", False, None, 41, 2.5, "hub"),
    ("t5-relu-tied", "relu", True, None, 42, 2.0, "hub"),
    ("t5-gated-gelu-tied", "gated-gelu", True, 640, 44, 2.5, "transformers"),
]


def f32(x):
    """The shortest decimal that reads back as the same float32 (keeps reference.json small)."""
    v = struct.unpack("f", struct.pack("f", float(x)))[0]
    for p in range(6, 10):
        s = "%.*g" % (p, v)
        if struct.unpack("f", struct.pack("f", float(s)))[0] == v:
            return float(s)
    return v


def f32_list(t):
    return [f32(x) for x in t.flatten().tolist()] if t.dim() == 1 else [f32_list(r) for r in t]


def bucket(rel, bidirectional, num_buckets, max_distance):
    """transformers' own bucket function (a staticmethod of T5Attention)."""
    from transformers.models.t5.modeling_t5 import T5Attention
    return T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                                 max_distance=max_distance)


def bucket_table(q_len, k_len, bidirectional, cfg):
    """[q, k] bucket of memory_position - query_position, as T5Attention.compute_bias builds it."""
    rel = torch.arange(k_len)[None, :] - torch.arange(q_len)[:, None]
    return bucket(rel, bidirectional, cfg.relative_attention_num_buckets,
                  cfg.relative_attention_max_distance).tolist()


def bucket_sweeps(cfg):
    """The bucket of every relative position in -BUCKET_SWEEP..BUCKET_SWEEP, for this config and for the
    released T5 checkpoints' (32 buckets, max_distance 128), both directions: covers the exact, the
    logarithmic and the saturated ranges, and float32 rounding at the log buckets' edges."""
    rel = torch.arange(-BUCKET_SWEEP, BUCKET_SWEEP + 1)
    out = []
    for nb, md in ((cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance), (32, 128)):
        for bidir in (True, False):
            out.append({"num_buckets": nb, "max_distance": md, "bidirectional": bidir,
                        "first_relative_position": -BUCKET_SWEEP,
                        "buckets": bucket(rel, bidir, nb, md).tolist()})
    return out


def scale_weights(model, seed, d_kv, resid):
    """make_model_fixtures.py's scaling (weights with enough spread that greedy argmaxes are clear), with
    T5's attention-logit scale folded into q as T5's own init does (scores are not divided by sqrt(d_kv)),
    the sublayers' output projections (o, wo) times `resid` so they outweigh the token embedding in the
    residual stream (T5 does not scale embeddings), and ReLU's wo rows centred: ReLU outputs are all
    positive, so wo's row sums would add one input-independent vector that makes every step alike."""
    g = torch.Generator().manual_seed(seed)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied parameters appear once
            if p.dim() == 1:  # T5LayerNorm weights (no biases anywhere in T5)
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif id(p) in embeddings:  # shared token embedding and the relative_attention_bias tables
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                scale = 1.5 / math.sqrt(p.shape[1])
                if name.endswith(".q.weight"):
                    scale /= math.sqrt(d_kv)
                elif name.endswith(".o.weight") or name.endswith(".wo.weight"):
                    scale *= resid
                elif name == "lm_head.weight":
                    scale *= 2.0
                w = torch.randn(p.shape, generator=g)
                if name.endswith("DenseReluDense.wo.weight") and not model.config.is_gated_act:
                    w -= w.mean(dim=1, keepdim=True)
                p.copy_(w * scale)


def make_model(ffn, tied, vocab, seed, resid):
    config = T5Config(vocab_size=vocab, feed_forward_proj=ffn, tie_word_embeddings=tied, **COMMON)
    torch.manual_seed(seed)
    model = T5ForConditionalGeneration(config).eval()
    if not tied:
        # transformers 5.x builds every T5 with lm_head tied to shared (config.tie_word_embeddings is
        # forced True; only scale_decoder_outputs remembers the argument): give the head its own weight,
        # as FLAN-T5's checkpoints have, and keep save_pretrained from dropping it.
        model.lm_head.weight = torch.nn.Parameter(torch.empty(vocab, config.d_model))
        model.all_tied_weights_keys.pop("lm_head.weight", None)
    scale_weights(model, seed, config.d_kv, resid)
    assert (model.lm_head.weight is model.shared.weight) == tied
    assert model.config.scale_decoder_outputs == tied
    return model


def step_logits(model, enc_ids, dec_ids):
    """Logits of the last decoder position by full recomputation (encoder and decoder, no cache)."""
    out = model(input_ids=torch.tensor([enc_ids]), decoder_input_ids=torch.tensor([dec_ids]), use_cache=False)
    return out.logits[0, -1]


def greedy_cached(model, enc_ids, start):
    """The same greedy loop through the KV cache (self- and cross-attention), as a server runs it."""
    enc = model.get_encoder()(input_ids=torch.tensor([enc_ids]))
    out = model(encoder_outputs=enc, decoder_input_ids=torch.tensor([[start]]), use_cache=True)
    tokens = []
    for _ in range(NEW_TOKENS):
        nxt = int(out.logits[0, -1].argmax())
        tokens.append(nxt)
        out = model(encoder_outputs=enc, decoder_input_ids=torch.tensor([[nxt]]),
                    past_key_values=out.past_key_values, use_cache=True)
    return tokens


def reference_row(model, text, ids):
    cfg = model.config
    start = cfg.decoder_start_token_id
    with torch.no_grad():
        enc = model.get_encoder()(input_ids=torch.tensor([ids])).last_hidden_state[0]  # [len, d_model]
        dec, greedy, gaps, top5, full = [start], [], [], [], []
        for step in range(NEW_TOKENS):
            logits = step_logits(model, ids, dec)  # [vocab]
            two = torch.topk(logits, 2)
            gaps.append(float(two.values[0] - two.values[1]))
            logprobs = torch.log_softmax(logits.double(), -1)
            top = torch.topk(logprobs, 5)
            top5.append([[int(i), f32(v)] for v, i in zip(top.values, top.indices)])
            if step < FULL_LOGIT_STEPS:
                full.append(f32_list(logits))
            nxt = int(two.indices[0])
            greedy.append(nxt)  # EOS (1) is a token like any other here: it does not stop the loop
            dec.append(nxt)
        cached = greedy_cached(model, ids, start)
    assert cached == greedy, f"cached greedy {cached} != recomputed {greedy}"
    return {
        "text": text, "input_ids": ids,
        "encoder_last_hidden_state": f32_list(enc),
        "encoder_bucket_table": bucket_table(len(ids), len(ids), True, cfg),
        "greedy": greedy,
        "decoder_logits": {"full": full, "top5_logprobs": top5, "top1_top2_gaps": [f32(g) for g in gaps]},
        "min_greedy_gap": min(gaps),
    }


def check_reload(d, rows):
    """Reloads the saved fixture with transformers and recomputes its references (assert)."""
    model = T5ForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval()
    for row in rows:
        ids = row["input_ids"]
        with torch.no_grad():
            enc = model.get_encoder()(input_ids=torch.tensor([ids])).last_hidden_state[0]
            assert torch.allclose(enc, torch.tensor(row["encoder_last_hidden_state"]), atol=1e-5, rtol=1e-5)
            dec = [model.config.decoder_start_token_id]
            for step, want in enumerate(row["greedy"]):
                logits = step_logits(model, ids, dec)
                if step < FULL_LOGIT_STEPS:
                    assert torch.allclose(logits, torch.tensor(row["decoder_logits"]["full"][step]),
                                          atol=1e-4, rtol=1e-5), f"{d}: step {step} logits differ"
                got = int(logits.argmax())
                assert got == want, f"{d}: step {step} greedy {got} != {want}"
                dec.append(got)
    return model


def build(name, outdir, tokenizer_dir, ffn, tied, vocab, seed, resid, style):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    vocab = vocab or tok.get_vocab_size(False)
    model = make_model(ffn, tied, vocab, seed, resid)
    d = os.path.join(outdir, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    model.save_pretrained(d, safe_serialization=True)
    config_path = os.path.join(d, "config.json")
    config = json.load(open(config_path))
    if style == "hub":
        # As the hub's checkpoints (written by transformers 4.x) say it: tie_word_embeddings is the
        # switch for both the tied head and the d_model**-0.5 scaling; no scale_decoder_outputs key.
        config["tie_word_embeddings"] = tied
        config.pop("scale_decoder_outputs", None)
        with open(config_path, "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")
    shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), d)
    shutil.copy(os.path.join(tokenizer_dir, "tokenizer_config.json"), d)

    cfg = model.config
    rows = [reference_row(model, text, tok.encode(text).ids) for text in PROMPTS]
    reloaded = check_reload(d, rows)
    assert reloaded.config.scale_decoder_outputs == tied
    assert (reloaded.lm_head.weight is reloaded.shared.weight) == tied or not tied and \
        not torch.equal(reloaded.lm_head.weight, reloaded.shared.weight)
    from safetensors import safe_open
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        tensors = sorted(f.keys())
        assert ("lm_head.weight" in tensors) == (not tied), tensors
        assert all(f.get_slice(k).get_dtype() == "F32" for k in tensors)

    meta = {
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "config": {
            "architecture": "T5ForConditionalGeneration", "vocab_size": cfg.vocab_size,
            "tokenizer_ids": tok.get_vocab_size(True), "d_model": cfg.d_model, "d_kv": cfg.d_kv,
            "num_heads": cfg.num_heads, "d_ff": cfg.d_ff, "num_layers": cfg.num_layers,
            "num_decoder_layers": cfg.num_decoder_layers,
            "relative_attention_num_buckets": cfg.relative_attention_num_buckets,
            "relative_attention_max_distance": cfg.relative_attention_max_distance,
            "layer_norm_epsilon": cfg.layer_norm_epsilon, "dropout_rate": cfg.dropout_rate,
            "feed_forward_proj": cfg.feed_forward_proj, "dense_act_fn": cfg.dense_act_fn,
            "is_gated_act": cfg.is_gated_act, "tied_lm_head": tied,
            "lm_head_input_scale": cfg.d_model ** -0.5 if tied else 1.0,
            "config_json_style": style, "pad_token_id": cfg.pad_token_id, "eos_token_id": cfg.eos_token_id,
            "decoder_start_token_id": cfg.decoder_start_token_id, "seed": seed, "residual_writer_scale": resid,
            "dtype": "float32",
            "tensors": tensors,
        },
        "greedy_new_tokens": NEW_TOKENS,
        "greedy_note": "greedy by full recomputation from decoder_start_token_id; EOS does not stop it; "
                       "equal to the KV-cached loop",
        "tokenizer_check": [{"text": t, "input_ids": tok.encode(t).ids, "tokens": tok.encode(t).tokens}
                            for t in TASK_TEXTS],
        "decoder_bucket_table": bucket_table(DECODER_POSITIONS, DECODER_POSITIONS, False, cfg),
        "bucket_sweeps": bucket_sweeps(cfg),
        "prompts": rows,
        "min_greedy_gap": min(r["min_greedy_gap"] for r in rows),
    }
    for t in meta["tokenizer_check"]:
        assert t["input_ids"][-1] == 1 and t["tokens"][-1] == "</s>" and t["input_ids"].count(1) == 1
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(meta, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    sizes = {f: os.path.getsize(os.path.join(d, f)) for f in sorted(os.listdir(d))}
    print(f"{name}: min greedy gap {meta['min_greedy_gap']:.4f} (per prompt "
          f"{[round(r['min_greedy_gap'], 4) for r in rows]}), prompt lengths {[len(r['input_ids']) for r in rows]}")
    print(f"  greedy: {[r['greedy'] for r in rows]}")
    print(f"  files: {sizes}, total {sum(sizes.values())}")


def main():
    tokenizer_dir, outdir = sys.argv[1], sys.argv[2]
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
    for name, ffn, tied, vocab, seed, resid, style in JOBS:
        if only is None or name in only:
            build(name, outdir, tokenizer_dir, ffn, tied, vocab, seed, resid, style)
    return 0


if __name__ == "__main__":
    sys.exit(main())
