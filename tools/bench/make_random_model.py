#!/usr/bin/env python3
"""Writes a random-weight checkpoint with real shapes for the GPU benchmarks (real weights
cannot be downloaded here): config.json and safetensors shards of ~2 GB with an index, as the hub
stores them. Speed does not depend on the values; they are N(0, 0.02) like a fresh init (norm
weights 1, biases 0).

Llama shapes are written from a table of their tensors; the other families (FAMILY_SHAPES) take
their tensor names and shapes from transformers' own class, built on the meta device (no memory).

T5 shapes (T5_SHAPES: FLAN-T5-XL for bench_t5, and a tiny one for quick runs) are written from a
table of T5ForConditionalGeneration's tensors, scaled so that bfloat16 activations stay finite and
of order 1 through every layer: T5 neither scales its embeddings nor its attention scores, so the
values are those of a trained model's magnitude rather than a fresh init (see t5_tensors).

    python3 tools/bench/make_random_model.py OUT_DIR [--shape llama-2-7b] [--dtype bfloat16]
                                             [--gptq-bits 4|8]
    python3 tools/bench/make_random_model.py /tmp/flan-t5-xl --shape flan-t5-xl

--gptq-bits (Llama shapes) writes the decoder layers' linear weights as a GPT-Q checkpoint
(AutoGPTQ's v1 layout: qweight, qzeros holding zero - 1, float16 scales, g_idx; group 128,
symmetric) with random codes, as a pre-quantized hub checkpoint would be stored.
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file

SHAPES = {
    # hidden, layers, heads, kv heads, intermediate, vocab, max positions
    "llama-2-7b": (4096, 32, 32, 32, 11008, 32000, 4096),
    "llama-2-13b": (5120, 40, 40, 40, 13824, 32000, 4096),
    "llama-2-70b": (8192, 80, 64, 8, 28672, 32000, 4096),
    "llama-3-8b": (4096, 32, 32, 8, 14336, 128256, 8192),
    "tiny": (256, 2, 4, 2, 512, 1000, 2048),
    # A ~0.5B Llama for CPU load-time benchmarks (bench_quantize_load).
    "llama-0.5b": (2048, 8, 16, 16, 5632, 32000, 2048),
}


# Published configs of the issue-15 benchmark shapes (tiiuae/falcon-7b, bigcode/starcoder).
FAMILY_SHAPES = {
    "falcon-7b": ("FalconConfig", dict(
        vocab_size=65024, hidden_size=4544, num_hidden_layers=32, num_attention_heads=71,
        multi_query=True, parallel_attn=True, bias=False, alibi=False,
        new_decoder_architecture=False, layer_norm_epsilon=1e-5, max_position_embeddings=2048,
        bos_token_id=11, eos_token_id=11)),
    "starcoder-15b": ("GPTBigCodeConfig", dict(
        vocab_size=49152, n_embd=6144, n_layer=40, n_head=48, n_inner=24576, n_positions=8192,
        multi_query=True, activation_function="gelu_pytorch_tanh", layer_norm_epsilon=1e-5,
        bos_token_id=0, eos_token_id=0)),
    "falcon-tiny": ("FalconConfig", dict(
        vocab_size=1000, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
        multi_query=True, parallel_attn=True, bias=False, alibi=False)),
    "starcoder-tiny": ("GPTBigCodeConfig", dict(
        vocab_size=1000, n_embd=256, n_layer=2, n_head=4, n_positions=2048, multi_query=True,
        activation_function="gelu_pytorch_tanh")),
}


# d_model, d_kv, heads, d_ff, encoder layers, decoder layers, vocab (google/flan-t5-xl's config; its
# head is an untied lm_head, its FFN gated-gelu, 32 relative buckets over a distance of 128).
T5_SHAPES = {
    "flan-t5-xl": (2048, 64, 32, 5120, 24, 24, 32128),
    "t5-test": (256, 64, 4, 512, 2, 2, 1000),
}


def t5_tensors(shape, dtype, randn):
    """(config dict, [(name, make)]) of a T5ForConditionalGeneration checkpoint as the hub stores
    it: [out, in] linear weights without biases, the bias tables on block 0 of each stack only,
    shared.weight as the one embedding (the stacks' embed_tokens are tied to it and not saved).

    Scales: embeddings and bias tables N(0, 1), norm weights 1, each linear N(0, 1)/sqrt(in) (its
    outputs keep the inputs' magnitude), q an extra 1/sqrt(d_kv) (T5 does not scale its scores; a
    trained q carries that factor), so scores, the residual stream and the logits stay O(1)."""
    d, d_kv, heads, d_ff, enc_layers, dec_layers, vocab = T5_SHAPES[shape]
    inner = heads * d_kv
    buckets = 32
    config = {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_model": d,
        "d_kv": d_kv, "num_heads": heads, "d_ff": d_ff, "num_layers": enc_layers,
        "num_decoder_layers": dec_layers, "vocab_size": vocab, "feed_forward_proj": "gated-gelu",
        "is_encoder_decoder": True, "relative_attention_num_buckets": buckets,
        "relative_attention_max_distance": 128, "layer_norm_epsilon": 1e-6,
        "tie_word_embeddings": False, "decoder_start_token_id": 0, "pad_token_id": 0,
        "eos_token_id": 1, "n_positions": 512, "dtype": str(dtype).replace("torch.", ""),
    }

    def linear(name, out, inp, extra=1.0):
        return [(name, lambda: randn(extra / inp ** 0.5, out, inp))]

    def ones(name):
        return [(name, lambda: torch.ones(d, dtype=dtype))]

    def attention(p, block):
        t = linear(p + "q.weight", inner, d, 1.0 / d_kv ** 0.5)
        t += linear(p + "k.weight", inner, d) + linear(p + "v.weight", inner, d)
        t += linear(p + "o.weight", d, inner)
        if block == 0 and p.endswith("SelfAttention."):
            t += [(p + "relative_attention_bias.weight", lambda: randn(1.0, buckets, heads))]
        return t

    def ffn(p):
        return (linear(p + "wi_0.weight", d_ff, d) + linear(p + "wi_1.weight", d_ff, d) +
                linear(p + "wo.weight", d, d_ff))

    tensors = [("shared.weight", lambda: randn(1.0, vocab, d))]
    for i in range(enc_layers):
        p = f"encoder.block.{i}.layer."
        tensors += ones(p + "0.layer_norm.weight") + attention(p + "0.SelfAttention.", i)
        tensors += ones(p + "1.layer_norm.weight") + ffn(p + "1.DenseReluDense.")
    tensors += ones("encoder.final_layer_norm.weight")
    for i in range(dec_layers):
        p = f"decoder.block.{i}.layer."
        tensors += ones(p + "0.layer_norm.weight") + attention(p + "0.SelfAttention.", i)
        tensors += ones(p + "1.layer_norm.weight") + attention(p + "1.EncDecAttention.", i)
        tensors += ones(p + "2.layer_norm.weight") + ffn(p + "2.DenseReluDense.")
    tensors += ones("decoder.final_layer_norm.weight")
    tensors += linear("lm_head.weight", vocab, d)
    return config, tensors


def family_tensors(shape, dtype, rand):
    """(config dict, [(name, make)]) from transformers' class for `shape`, built on meta."""
    import transformers
    cls_name, kwargs = FAMILY_SHAPES[shape]
    config = getattr(transformers, cls_name)(**kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    tensors, seen = [], set()
    for name, p in model.state_dict(keep_vars=True).items():
        if id(p) in seen:  # a tied head shares the embedding's storage: saved once
            continue
        seen.add(id(p))
        shp = tuple(p.shape)
        if name.endswith(".bias"):
            tensors.append((name, lambda shp=shp: torch.zeros(shp, dtype=dtype)))
        elif len(shp) == 1:
            tensors.append((name, lambda shp=shp: torch.ones(shp, dtype=dtype)))
        else:
            tensors.append((name, lambda shp=shp: rand(*shp)))
    out = config.to_dict()
    out["architectures"] = [type(model).__name__]
    out.pop("torch_dtype", None)
    out["dtype"] = str(dtype).replace("torch.", "")
    return out, tensors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="llama-2-7b",
                    choices=sorted(SHAPES) + sorted(FAMILY_SHAPES) + sorted(T5_SHAPES))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--gptq-bits", type=int, choices=[4, 8])
    args = ap.parse_args()
    if args.gptq_bits and args.shape not in SHAPES:
        ap.error("--gptq-bits applies to the Llama shapes only")
    dtype = getattr(torch, args.dtype)
    os.makedirs(args.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(std, *shape):
        return (torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32) * std).to(dtype).cpu()

    def rand(*shape):
        return randn(0.02, *shape)

    if args.shape in T5_SHAPES:
        config, tensors = t5_tensors(args.shape, dtype, randn)
        with open(os.path.join(args.out, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        return write_shards(args, tensors)
    if args.shape in FAMILY_SHAPES:
        config, tensors = family_tensors(args.shape, dtype, rand)
        with open(os.path.join(args.out, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        return write_shards(args, tensors)
    h, layers, heads, kv, inter, vocab, maxpos = SHAPES[args.shape]
    hd = h // heads
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
        "intermediate_size": inter, "vocab_size": vocab, "max_position_embeddings": maxpos,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "torch_dtype": args.dtype,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    }
    bits, group = args.gptq_bits, 128
    if bits:
        config["quantization_config"] = {
            "quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": False,
            "sym": True, "checkpoint_format": "gptq"}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    def linear(name, out, inp):
        """(name, make) pairs of one linear layer: dense, or GPT-Q's four tensors."""
        if not bits:
            return [(name + ".weight", lambda: rand(out, inp))]
        pack = 32 // bits
        zero = (1 << (bits - 1)) - 1  # v1 stores zero - 1
        word = 0
        for k in range(pack):
            word |= zero << (bits * k)
        word = word - (1 << 32) if word >= 1 << 31 else word
        code_std = (1 << bits) / 12.0 ** 0.5  # uniform codes about the zero point
        return [
            (name + ".qweight", lambda: torch.randint(-(1 << 31), (1 << 31) - 1, (inp // pack, out),
                                                      generator=gen, device=dev, dtype=torch.int32).cpu()),
            (name + ".qzeros", lambda: torch.full((inp // group, out // pack), word, dtype=torch.int32)),
            (name + ".scales", lambda: torch.full((inp // group, out), 0.02 / code_std, dtype=torch.float16)),
            (name + ".g_idx", lambda: torch.arange(inp, dtype=torch.int32) // group),
        ]

    def ones(n):
        return torch.ones(n, dtype=dtype)

    tensors = [("model.embed_tokens.weight", lambda: rand(vocab, h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors += [(p + "input_layernorm.weight", lambda: ones(h))]
        tensors += linear(p + "self_attn.q_proj", heads * hd, h)
        tensors += linear(p + "self_attn.k_proj", kv * hd, h)
        tensors += linear(p + "self_attn.v_proj", kv * hd, h)
        tensors += linear(p + "self_attn.o_proj", h, heads * hd)
        tensors += [(p + "post_attention_layernorm.weight", lambda: ones(h))]
        tensors += linear(p + "mlp.gate_proj", inter, h)
        tensors += linear(p + "mlp.up_proj", inter, h)
        tensors += linear(p + "mlp.down_proj", h, inter)
    tensors += [("model.norm.weight", lambda: ones(h)), ("lm_head.weight", lambda: rand(vocab, h))]
    return write_shards(args, tensors)


def write_shards(args, tensors):

    # Shards of at most ~2 GB, each written as soon as it is full (bounded host memory).
    limit = 2 << 30
    weight_map, total, files = {}, 0, 0
    shard, shard_bytes = {}, 0

    def write(tensors_of_shard):
        nonlocal files
        files += 1
        fname = f"model-{files:05d}.safetensors"
        save_file(tensors_of_shard, os.path.join(args.out, fname), metadata={"format": "pt"})
        for k in tensors_of_shard:
            weight_map[k] = fname

    for name, make in tensors:
        t = make()
        size = t.numel() * t.element_size()
        if shard and shard_bytes + size > limit:
            write(shard)
            shard, shard_bytes = {}, 0
        shard[name] = t
        shard_bytes += size
        total += size
    if shard:
        write(shard)
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    print(f"{args.shape} {args.dtype}: {total / 1e9:.2f} GB in {files} shards at {args.out}")


if __name__ == "__main__":
    main()
