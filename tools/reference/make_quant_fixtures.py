#!/usr/bin/env python3
"""Writes textgen's pre-quantized GPT-Q and AWQ fixtures (issue 16) with Hugging Face transformers.

Each fixture is a tiny float32 Llama (make_model_fixtures.py's weights, prompts and reference format)
whose decoder-layer Linears (q/k/v/o, gate/up/down) are quantized by round-to-nearest per group (how
the bytes get their values; GPT-Q's Hessian-based search is not needed to exercise the format) and
stored byte for byte as the libraries store them. Embeddings, norms and the (tied) head stay dense.
reference.json is then recorded from the dequantized float32 model in transformers: the weights the
reference dequantizer gives, w[o, i] = (q - z) * s in float32 with s read from its float16.

Layouts (int32 tensors are little-endian; "packed along X, low bits first": element k of a word is
bits [k * bits, (k + 1) * bits)):
  GPT-Q (AutoGPTQ / GPTQModel / optimum, checkpoint_format "gptq" = "v1"):
    qweight int32 [in * bits / 32, out], packed along the inputs;
    qzeros  int32 [groups, out * bits / 32], packed along the outputs, storing zero - 1 (masked);
    scales  fp16  [groups, out];  g_idx int32 [in], the group of each input (permuted with desc_act).
    Symmetric: zero 2^(bits - 1). The "v1" zero is read back as (stored + 1) & (2^bits - 1).
  AWQ GEMM (AutoAWQ, version "gemm"):
    qweight int32 [in, out / 8], qzeros int32 [groups, out / 8]: word c holds outputs c*8 .. c*8+7 in
    AWQ's interleaved order: nibble k holds output c*8 + [0, 2, 4, 6, 1, 3, 5, 7][k];
    scales fp16 [groups, out]. Zero points: zero_point true.

Fixtures:
  llama-gptq-g32       4-bit, group 32, sym, desc_act false (g_idx = i // 32)
  llama-gptq-actorder  4-bit, group 32, asymmetric, desc_act true with a permuted g_idx
  llama-awq-g32        4-bit AWQ GEMM, group 32, zero_point true

Run where transformers and torch are (float32 references only on this CPU):
    bash tools/reference/sid-python.sh tools/reference/make_quant_fixtures.py TOKENIZER_DIR OUT_DIR [NAMES]
with TOKENIZER_DIR tests/reference/tokenizers/llama2 and OUT_DIR tests/reference/models.
"""
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_model_fixtures import PROMPTS, Tokenizer_vocab, reference, scale_weights  # noqa: E402

QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble k of a word holds output word * 8 + AWQ_ORDER[k]


def rtn(w, group_size, bits, sym, g_idx):
    """Round-to-nearest per group of inputs, as AutoGPTQ's and AutoAWQ's quantizers compute scales and
    zeros. w: [out, in] float32; g_idx: [in] group of each input. Returns q [out, in] int, zeros
    [groups, out] int, scales [groups, out] float16."""
    maxq = 2 ** bits - 1
    out, inp = w.shape
    groups = int(g_idx.max()) + 1
    scales = torch.empty(groups, out)
    zeros = torch.empty(groups, out, dtype=torch.int64)
    for g in range(groups):
        cols = (g_idx == g).nonzero().flatten()
        wg = w[:, cols]
        lo = torch.minimum(wg.min(1).values, torch.zeros(out))
        hi = torch.maximum(wg.max(1).values, torch.zeros(out))
        if sym:
            hi = torch.maximum(lo.abs(), hi)
            lo = -hi
        s = ((hi - lo) / maxq).clamp(min=1e-5)
        scales[g] = s
        zeros[g] = torch.full((out,), (maxq + 1) // 2) if sym else torch.round(-lo / s).clamp(0, maxq).long()
    scales = scales.half()
    s_in = scales.float()[g_idx].t()  # [out, in]
    z_in = zeros[g_idx].t()
    q = (torch.round(w / s_in) + z_in).clamp(0, maxq).long()
    return q, zeros, scales


def dequantize(q, zeros, scales, g_idx):
    """The reference dequantizer: w[o, i] = (q[o, i] - z[g_idx[i], o]) * s[g_idx[i], o] in float32."""
    return ((q - zeros[g_idx].t()).float() * scales.float()[g_idx].t()).float()


def to_int32(words):
    """uint32 values (int64 tensor) as the int32 the checkpoint stores."""
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def pack_rows(v, bits):
    """[n, m] ints -> [n * bits / 32, m] words, packed along the rows, low bits first."""
    per = 32 // bits
    v = v.reshape(-1, per, v.shape[1])
    words = torch.zeros(v.shape[0], v.shape[2], dtype=torch.int64)
    for k in range(per):
        words |= (v[:, k, :] & (2 ** bits - 1)) << (bits * k)
    return to_int32(words)


def pack_cols(v, bits, order=None):
    """[n, m] ints -> [n, m * bits / 32] words, packed along the columns (in `order` within a word)."""
    per = 32 // bits
    order = order or list(range(per))
    v = v.reshape(v.shape[0], -1, per)
    words = torch.zeros(v.shape[0], v.shape[1], dtype=torch.int64)
    for k in range(per):
        words |= (v[:, :, order[k]] & (2 ** bits - 1)) << (bits * k)
    return to_int32(words)


def gptq_tensors(w, group_size, bits, sym, desc_act, gen):
    inp = w.shape[1]
    if desc_act:  # act-order: inputs quantized in a permuted order, group k = the k-th block of it
        perm = torch.randperm(inp, generator=gen)
        g_idx = torch.empty(inp, dtype=torch.int64)
        g_idx[perm] = torch.arange(inp) // group_size
    else:
        g_idx = torch.arange(inp) // group_size
    q, zeros, scales = rtn(w, group_size, bits, sym, g_idx)
    tensors = {
        "qweight": pack_rows(q.t().contiguous(), bits),           # [in * bits / 32, out]
        "qzeros": pack_cols(zeros - 1, bits),                     # v1: zero - 1, masked
        "scales": scales.contiguous(),                            # [groups, out] fp16
        "g_idx": g_idx.to(torch.int32),                           # [in]
    }
    return tensors, dequantize(q, zeros, scales, g_idx)


def awq_tensors(w, group_size, gen):
    g_idx = torch.arange(w.shape[1]) // group_size
    q, zeros, scales = rtn(w, group_size, 4, False, g_idx)
    tensors = {
        "qweight": pack_cols(q.t().contiguous(), 4, AWQ_ORDER),   # [in, out / 8]
        "qzeros": pack_cols(zeros, 4, AWQ_ORDER),                 # [groups, out / 8]
        "scales": scales.contiguous(),                            # [groups, out] fp16
    }
    return tensors, dequantize(q, zeros, scales, g_idx)


def quant_config(kind):
    if kind == "awq":  # AutoAWQ's, as transformers' AwqConfig writes it
        return {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm",
                "modules_to_not_convert": None}
    desc_act = kind == "gptq-actorder"
    sym = not desc_act  # llama-gptq-g32 symmetric, llama-gptq-actorder not
    # GPTQModel / optimum's, as transformers' GPTQConfig writes it.
    return {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": desc_act, "sym": sym,
            "damp_percent": 0.01, "true_sequential": True, "static_groups": False, "lm_head": False,
            "checkpoint_format": "gptq", "pack_dtype": "int32",
            "meta": {"quantizer": ["textgen make_quant_fixtures.py (round-to-nearest)"]}}


def build(name, kind, outdir, tokenizer_dir, seed):
    vocab = Tokenizer_vocab(tokenizer_dir)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, bos_token_id=1,
                         eos_token_id=2, max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    scale_weights(model, seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    qc = quant_config(kind)
    state = {}
    with torch.no_grad():
        for mname, module in model.named_modules():
            if not (isinstance(module, torch.nn.Linear) and mname.split(".")[-1] in QUANTIZED):
                continue
            w = module.weight.detach().float()
            if kind == "awq":
                tensors, deq = awq_tensors(w, qc["group_size"], gen)
            else:
                tensors, deq = gptq_tensors(w, qc["group_size"], 4, qc["sym"], qc["desc_act"], gen)
            for k, v in tensors.items():
                state[f"{mname}.{k}"] = v
            module.weight.copy_(deq)  # the model transformers runs: the dequantized weights
    for k, v in model.state_dict().items():
        if k.endswith(".weight") and k[:-len(".weight")].split(".")[-1] in QUANTIZED:
            continue
        if k == "lm_head.weight" and config.tie_word_embeddings:
            continue
        state[k] = v.contiguous()
    d = os.path.join(outdir, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(d)
    model.generation_config.save_pretrained(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["architectures"] = ["LlamaForCausalLM"]  # save_pretrained's, which a bare config lacks
    cfg.setdefault("dtype", "float32")
    cfg["quantization_config"] = qc
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), d)
    tcfg = json.load(open(os.path.join(tokenizer_dir, "tokenizer_config.json")))
    if "add_eos_token" in tcfg:
        tcfg["add_eos_token"] = False
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=2)
    rows = reference(model, tokenizer_dir, PROMPTS)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "prompts": rows}
    rotary = next((m for m in model.modules() if hasattr(m, "inv_freq")), None)
    if rotary is not None:
        meta["rope"] = {"inv_freq": rotary.inv_freq.float().tolist(),
                        "attention_scaling": float(getattr(rotary, "attention_scaling", 1.0))}
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(meta, f)
    sizes = {f: os.path.getsize(os.path.join(d, f)) for f in sorted(os.listdir(d))}
    print(f"{name}: {sizes}, min greedy gap {min(r['min_greedy_gap'] for r in rows):.4f}")


def main():
    tokenizer_dir, outdir = sys.argv[1], sys.argv[2]
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
    jobs = [("llama-gptq-g32", "gptq-g32", 41), ("llama-gptq-actorder", "gptq-actorder", 42),
            ("llama-awq-g32", "awq", 44)]
    for name, kind, seed in jobs:
        if only is None or name in only:
            build(name, kind, outdir, tokenizer_dir, seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
