#!/usr/bin/env python3
"""Writes textgen's model reference fixtures with Hugging Face transformers.

Tiny random-weight float32 checkpoints of each supported architecture, saved with save_pretrained,
plus the Llama-2-style tokenizer of tests/reference/tokenizers/llama2, and reference.json with, per
prompt: input ids, the last position's logits, its top-5 log-probabilities, the last position's
hidden state after every layer (to locate a divergence), and 32 greedy tokens computed by full
recomputation (no KV cache) with the minimum top-1/top-2 logit gap seen (weights are scaled so greedy
choices are not near-ties).

Fixtures:
  llama-gqa          LlamaForCausalLM, 4 heads / 2 KV heads
  llama-tied-linear  tied embeddings, linear RoPE scaling (factor 2), rope_theta 500000
  llama-dynamic      dynamic-NTK RoPE scaling with max_position_embeddings 16 (exceeded while generating)
  mistral-sharded    MistralForCausalLM, sliding window 24 (exceeded), saved in several safetensors shards
  llama-rope-llama3  Llama 3.1 RoPE scaling: high, medium (smoothed) and low frequencies all present
  llama-rope-yarn    YaRN RoPE scaling: blended frequencies and the attention factor on cos/sin
  llama-bias-gelu    attention_bias and mlp_bias (q/k/v/o and gate/up/down biases), hidden_act
                     gelu_pytorch_tanh
  issue 15's families (family_jobs): GPT-NeoX, Falcon, BLOOM, OPT, MPT, GPT-BigCode and Code Llama
                     variants, each with its family's tokenizer (tests/reference/tokenizers/<family>)

reference.json also holds the model's RoPE inverse frequencies and attention scaling as transformers
computes them ("rope"), to compare textgen's with before any logits.

Run where transformers and torch are: the GPU machine, or this CPU through Debian unstable's
packages (float32 only); NAMES (comma-separated) builds only those fixtures:
    python3 tools/reference/make_model_fixtures.py TOKENIZER_DIR OUT_DIR [NAMES]
    bash tools/reference/sid-python.sh tools/reference/make_model_fixtures.py TOKENIZER_DIR OUT_DIR [NAMES]
"""
import json
import math
import os
import shutil
import sys

import torch
import transformers
from transformers import (BloomConfig, BloomForCausalLM, FalconConfig, FalconForCausalLM, GPTBigCodeConfig,
                          GPTBigCodeForCausalLM, GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, MptConfig, MptForCausalLM,
                          OPTConfig, OPTForCausalLM)

PROMPTS = [
    "The quick brown fox",
    "Kubernetes schedules pods onto nodes",
    "def add(a, b):\n    return",
    "In 1969, two astronauts",
]
NEW_TOKENS = 32


def scale_weights(model, seed):
    """Weights with enough spread that greedy argmaxes are clear (random init gives near-ties)."""
    g = torch.Generator().manual_seed(seed)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):  # projection and LayerNorm biases
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:  # norm weights
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif id(p) in embeddings:  # token (and learned position) embeddings
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / math.sqrt(p.shape[1])))


def reference(model, tokenizer_path, prompts):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tokenizer_path, "tokenizer.json"))
    rows = []
    for text in prompts:
        ids = tok.encode(text).ids  # <s> + text, as textgen's tokenizer gives it
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_hidden_states=True)
            last = out.logits[0, -1].double()
            logprobs = torch.log_softmax(last, -1)
            top = torch.topk(logprobs, 5)
            hidden = [h[0, -1].tolist() for h in out.hidden_states]
            # Greedy with the KV cache, as generate() and a paged-KV server run it.
            greedy, min_gap = [], float("inf")
            step = model(torch.tensor([ids]), use_cache=True)
            for _ in range(NEW_TOKENS):
                logits = step.logits[0, -1]
                two = torch.topk(logits, 2)
                min_gap = min(min_gap, float(two.values[0] - two.values[1]))
                nxt = int(two.indices[0])
                greedy.append(nxt)
                step = model(torch.tensor([[nxt]]), past_key_values=step.past_key_values, use_cache=True)
            # Greedy by full recomputation: equal to the above except where RoPE depends on the
            # sequence length (dynamic NTK), where cached keys keep the scale they were made with.
            seq, recompute = list(ids), []
            for _ in range(NEW_TOKENS):
                nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
                recompute.append(nxt)
                seq.append(nxt)
        rows.append({
            "text": text, "input_ids": ids, "last_logits": last.float().tolist(),
            "top5": [[int(i), float(v)] for v, i in zip(top.values, top.indices)],
            "hidden_last": hidden, "greedy": greedy, "greedy_recompute": recompute,
            "min_greedy_gap": min_gap,
        })
    return rows


def build(name, outdir, tokenizer_dir, cls, config, seed, shard=None):
    torch.manual_seed(seed)
    model = cls(config).eval()
    scale_weights(model, seed)
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    kwargs = {"safe_serialization": True}
    if shard:
        kwargs["max_shard_size"] = shard
    model.save_pretrained(d, **kwargs)
    shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), d)
    # A generation model's usual Llama config: <s> added, </s> not (the tokenizer fixture sets
    # add_eos_token to exercise TGI's override; prompts must not end in </s>).
    config = json.load(open(os.path.join(tokenizer_dir, "tokenizer_config.json")))
    if "add_eos_token" in config:
        config["add_eos_token"] = False
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    rows = reference(model, tokenizer_dir, PROMPTS)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "prompts": rows}
    rotary = next((m for m in model.modules() if hasattr(m, "inv_freq")), None)
    if rotary is not None:
        meta["rope"] = {"inv_freq": rotary.inv_freq.float().tolist(),
                        "attention_scaling": float(getattr(rotary, "attention_scaling", 1.0))}
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(meta, f)
    gaps = [r["min_greedy_gap"] for r in rows]
    print(f"{name}: files {sorted(os.listdir(d))}, min greedy gap {min(gaps):.4f}")
    print("  config.json:", open(os.path.join(d, "config.json")).read().replace("\n", " ")[:900])


def main():
    tokenizer_dir, outdir = sys.argv[1], sys.argv[2]
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
    vocab = Tokenizer_vocab(tokenizer_dir)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, bos_token_id=1,
                  eos_token_id=2)
    def rope(cls, theta, scaling, **kw):
        """The config, with RoPE scaling given the way this transformers version takes it."""
        if scaling is None:
            return cls(rope_theta=theta, **kw, **common)
        try:
            return cls(rope_theta=theta, rope_scaling=scaling, **kw, **common)
        except Exception:
            return cls(rope_parameters=dict(scaling, rope_theta=theta), **kw, **common)

    jobs = [
        ("llama-gqa", LlamaForCausalLM,
         lambda: rope(LlamaConfig, 10000.0, None, max_position_embeddings=256, tie_word_embeddings=False), 1, None),
        ("llama-tied-linear", LlamaForCausalLM,
         lambda: rope(LlamaConfig, 500000.0, {"rope_type": "linear", "factor": 2.0}, max_position_embeddings=256,
                      tie_word_embeddings=True), 2, None),
        ("llama-dynamic", LlamaForCausalLM,
         lambda: rope(LlamaConfig, 10000.0, {"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=16,
                      tie_word_embeddings=False), 3, None),
        ("mistral-sharded", MistralForCausalLM,
         lambda: rope(MistralConfig, 10000.0, None, max_position_embeddings=256, sliding_window=24,
                      tie_word_embeddings=False), 4, "400KB"),
        # head_dim 16: wavelengths 6.3, 19.9, 62.8, 199, ... against 8 (high) and 64 (low).
        ("llama-rope-llama3", LlamaForCausalLM,
         lambda: rope(LlamaConfig, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 8.0, "original_max_position_embeddings": 64},
                      max_position_embeddings=512, tie_word_embeddings=False), 6, None),
        # factor = max_position_embeddings / original, as transformers versions differ on which wins.
        ("llama-rope-yarn", LlamaForCausalLM,
         lambda: rope(LlamaConfig, 10000.0, {"rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 32},
                      max_position_embeddings=128, tie_word_embeddings=False), 7, None),
        # Biases on every projection (o and down: added once under tensor parallelism) and GELU tanh.
        ("llama-bias-gelu", LlamaForCausalLM,
         lambda: rope(LlamaConfig, 10000.0, None, max_position_embeddings=256, tie_word_embeddings=False,
                      attention_bias=True, mlp_bias=True, hidden_act="gelu_pytorch_tanh"), 8, None),
    ]
    jobs += family_jobs(os.path.dirname(os.path.abspath(tokenizer_dir)))
    if only is not None:
        jobs = [j for j in jobs if j[0] in only]
    failed = []
    for job in jobs:
        name, cls, make_config, seed, shard = job[:5]
        tok_dir = job[5] if len(job) > 5 else tokenizer_dir
        try:
            build(name, outdir, tok_dir, cls, make_config(), seed, shard)
        except Exception:
            import traceback
            traceback.print_exc()
            failed.append(name)
    print("failed:", failed or "none")
    return 1 if failed else 0


def family_jobs(tokenizers_root):
    """Issue 15's families: tiny (hidden 64, 4 heads of 16, 2 layers, MLP 128 where the config sets it,
    ~700-token vocabularies), each with its own tokenizer. Kept small: fixtures travel to the GPU machine."""
    def tok(name):
        return os.path.join(tokenizers_root, name)
    def vocab(name, pad_to=1):
        v = Tokenizer_vocab(tok(name))
        return (v + pad_to - 1) // pad_to * pad_to
    neox = tok("gpt-neox")
    return [
        # Pythia-style: parallel residual, a quarter of each head rotated, vocabulary padded past the
        # tokenizer's (as Pythia's 50304 rows over 50277 tokens).
        ("gptneox-parallel", GPTNeoXForCausalLM, lambda: GPTNeoXConfig(
            vocab_size=vocab("gpt-neox", 128), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, hidden_act="gelu", rotary_pct=0.25, rotary_emb_base=10000,
            max_position_embeddings=256, layer_norm_eps=1e-5, use_parallel_residual=True,
            tie_word_embeddings=False, bos_token_id=0, eos_token_id=0), 21, None, neox),
        ("gptneox-sequential", GPTNeoXForCausalLM, lambda: GPTNeoXConfig(
            vocab_size=vocab("gpt-neox"), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, hidden_act="gelu", rotary_pct=0.5, rotary_emb_base=20000,
            max_position_embeddings=256, layer_norm_eps=1e-5, use_parallel_residual=False,
            tie_word_embeddings=False, bos_token_id=0, eos_token_id=0), 22, None, neox),
        # Falcon-7B: multi-query, parallel attention and MLP under one LayerNorm, rotary, no biases.
        ("falcon-mqa-rotary", FalconForCausalLM, lambda: FalconConfig(
            vocab_size=vocab("falcon"), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            multi_query=True, parallel_attn=True, bias=False, alibi=False, new_decoder_architecture=False,
            ffn_hidden_size=128,
            layer_norm_epsilon=1e-5, max_position_embeddings=256,
            bos_token_id=11, eos_token_id=11), 23, None, tok("falcon")),
        # Falcon-RW: ALiBi, every head its own K/V, sequential residual, biases.
        ("falcon-alibi", FalconForCausalLM, lambda: FalconConfig(
            vocab_size=vocab("falcon"), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            multi_query=False, parallel_attn=False, bias=True, alibi=True, new_decoder_architecture=False,
            ffn_hidden_size=128,
            layer_norm_epsilon=1e-5, max_position_embeddings=256, bos_token_id=11, eos_token_id=11),
         24, None, tok("falcon")),
        # Falcon-40B: the new decoder architecture, 2 KV groups, ln_attn and ln_mlp.
        ("falcon-new", FalconForCausalLM, lambda: FalconConfig(
            vocab_size=vocab("falcon"), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_kv_heads=2, new_decoder_architecture=True, ffn_hidden_size=128, parallel_attn=True,
            bias=False, alibi=False,
            layer_norm_epsilon=1e-5, max_position_embeddings=256,
            bos_token_id=11, eos_token_id=11), 25, None, tok("falcon")),
        # Falcon2-11B's variant: the new decoder with one input_layernorm for both branches.
        ("falcon-new-one-norm", FalconForCausalLM, lambda: FalconConfig(
            vocab_size=vocab("falcon"), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_kv_heads=2, new_decoder_architecture=True, num_ln_in_parallel_attn=1,
            ffn_hidden_size=128, parallel_attn=True, bias=False, alibi=False,
            layer_norm_epsilon=1e-5, max_position_embeddings=256,
            bos_token_id=11, eos_token_id=11), 33, None, tok("falcon")),
        # BLOOM: ALiBi, LayerNorm on the word embeddings, GELU (tanh), tied head.
        ("bloom", BloomForCausalLM, lambda: BloomConfig(
            vocab_size=vocab("bloom"), hidden_size=64, n_layer=2, n_head=4, layer_norm_epsilon=1e-5,
            bos_token_id=1, eos_token_id=2, pad_token_id=3), 26, None, tok("bloom")),
        # The same weights with each half's residual taken after its LayerNorm.
        ("bloom-post-ln", BloomForCausalLM, lambda: BloomConfig(
            vocab_size=vocab("bloom"), hidden_size=64, n_layer=2, n_head=4, layer_norm_epsilon=1e-5,
            apply_residual_connection_post_layernorm=True,
            bos_token_id=1, eos_token_id=2, pad_token_id=3), 26, None, tok("bloom")),
        # OPT-125m style: pre-LayerNorm, learned positions (offset 2), ReLU, tied head.
        ("opt-pre", OPTForCausalLM, lambda: OPTConfig(
            vocab_size=vocab("opt"), hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
            max_position_embeddings=256, do_layer_norm_before=True, word_embed_proj_dim=64,
            activation_function="relu", enable_bias=True, bos_token_id=2, eos_token_id=2, pad_token_id=1),
         27, None, tok("opt")),
        # OPT-350m style: post-LayerNorm, embeddings of 32 projected in and out.
        ("opt-post-proj", OPTForCausalLM, lambda: OPTConfig(
            vocab_size=vocab("opt"), hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
            max_position_embeddings=256, do_layer_norm_before=False, word_embed_proj_dim=32,
            activation_function="relu", enable_bias=True, bos_token_id=2, eos_token_id=2, pad_token_id=1),
         28, None, tok("opt")),
        # MPT-7B style: ALiBi, clip_qkv, no biases, tied head. transformers 5.12 ignores alibi_bias_max
        # (slopes always use 8) and expansion_ratio (the MLP is always 4 x d_model): the non-default
        # values here check that textgen ignores them as it does.
        ("mpt-clip", MptForCausalLM, lambda: MptConfig(
            vocab_size=vocab("gpt-neox", 64), d_model=64, n_heads=4, n_layers=2, expansion_ratio=2,
            max_seq_len=256, no_bias=True, layer_norm_epsilon=1e-5,
            attn_config={"alibi": True, "alibi_bias_max": 12, "clip_qkv": 2.0, "qk_ln": False},
            bos_token_id=0, eos_token_id=0), 29, None, neox),
        # SantaCoder/StarCoder: multi-query, fused c_attn, learned positions, GELU (tanh), tied head.
        ("bigcode-mqa", GPTBigCodeForCausalLM, lambda: GPTBigCodeConfig(
            vocab_size=vocab("starcoder"), n_positions=256, n_embd=64, n_layer=2, n_head=4, n_inner=128,
            activation_function="gelu_pytorch_tanh", multi_query=True, layer_norm_epsilon=1e-5,
            bos_token_id=0, eos_token_id=0), 30, None, tok("starcoder")),
        # GPTBigCode without multi_query (every head its own K/V): c_attn read per head, not [q; k; v].
        ("bigcode-mha", GPTBigCodeForCausalLM, lambda: GPTBigCodeConfig(
            vocab_size=vocab("starcoder"), n_positions=256, n_embd=64, n_layer=2, n_head=4, n_inner=None,
            activation_function="gelu_pytorch_tanh", multi_query=False, layer_norm_epsilon=1e-5,
            bos_token_id=0, eos_token_id=0), 32, None, tok("starcoder")),
        # Code Llama: Llama with rope_theta 1e6 and a 16k context.
        ("codellama", LlamaForCausalLM, lambda: LlamaConfig(
            vocab_size=vocab("llama2"), hidden_size=64, intermediate_size=176, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
            rope_theta=1000000.0, max_position_embeddings=16384, tie_word_embeddings=False),
         31, None, tok("llama2")),
    ]


def Tokenizer_vocab(tokenizer_dir):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json")).get_vocab_size(True)


if __name__ == "__main__":
    sys.exit(main())
