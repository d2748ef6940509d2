#!/usr/bin/env python3
"""Writes textgen's pre-quantized GPT-Q, AWQ, fp8 and Marlin fixtures (issue 16) with Hugging Face transformers.

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

  fp8 (vLLM / AutoFP8 / TGI quant_method "fp8"; llm-compressor's "compressed-tensors"):
    weight F8_E4M3 [out, in] under the layer's own name; weight_scale F32, [] per tensor (AutoFP8:
    w * (448 / absmax) cast with saturation, the reciprocal stored), [out] or [out, 1] per channel
    (absmax of the row / 448); input_scale F32 [] when the activations are static. w = e4m3(q) * s.

  Marlin (IST-DASLab/marlin's Layer.pack; vLLM's quant_method "marlin", TGI's --quantize marlin):
    4-bit symmetric codes q = clamp(round(w / s) + 8, 0, 15) of the [in, out] weight w (fp16, with
    s = 2 absmax / 15 per group, as Marlin's GPT-Q quantizer computes it), w = (q - 8) * s.
    B int32 [in / 16, out * 2]: q cut into 16x16 tiles (a tile row = 16 inputs; its tiles in output
    order, each row-major), every 1024 codes of a tile row reordered by Marlin's permutation
    (marlin_perm below), packed 8 to a word, low nibble first. s fp16 [groups, out], flattened and
    reordered in runs of 64 (an 8x8 transpose) with several groups, of 32 with one.

Fixtures:
  llama-gptq-g32       4-bit, group 32, sym, desc_act false (g_idx = i // 32)
  llama-gptq-actorder  4-bit, group 32, asymmetric, desc_act true with a permuted g_idx
  llama-awq-g32        4-bit AWQ GEMM, group 32, zero_point true
  llama-fp8            quant_method "fp8", activation_scheme "static": per-tensor weight_scale [],
                       input_scale [] calibrated on the fixture prompts (absmax / 448 of each
                       layer's input in the dequantized model) times 1.0 / 1.25 / 1.5 for q / k / v
                       and 1.0 / 1.25 for gate / up, so the stacked layers' scales differ, all times
                       the smallest margin c in 1, 1.01, ... that leaves no prefill activation of
                       the prompts within 1e-6 (relative) of an e4m3 rounding boundary
  llama-fp8-channel    "compressed-tensors" float-quantized (FP8-Dynamic's config): weight_scale
                       [out, 1] per channel, input_activations dynamic per token
  llama-fp8-dynamic    quant_method "fp8", activation_scheme "dynamic", weight_scale [out] per channel
  llama-marlin         quant_method "marlin", group_size 128, on a Llama of hidden 128 and
                       intermediate 384 (Marlin's shapes: inputs % 128, outputs % 64), 2 layers: the
                       layers of 128 inputs have one group (Marlin's per-channel scale order),
                       down_proj three; embeddings stored in float16 (the model's values are
                       float16's, so the reference is unchanged) to keep the fixture under 1 MB

What the fp8 references compute: transformers' LlamaForCausalLM in float32 on the dequantized weights,
with each quantized Linear's input fake-quantized by a forward pre-hook exactly as textgen's runtime
layout defines kFp8 (kernels/include/textgen/kernels/quant_gemm.h): x' = e4m3(clamp(x / s, +-448)) * s,
s the static input scale (for q/k/v and gate/up the largest of the stacked layers', TGI's and vLLM's
rule) or, dynamic, absmax(x over the whole forward call) / 448. transformers itself has no fp8 W8A8
path on the CPU, so this hook is the reference's model of the activations, not an upstream kernel.
llama-fp8-channel's per-token dynamic activations are not modelled by the runtime layout: textgen
keeps them in the compute dtype (W8A16), and so does its reference (no hook).

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


def marlin_perm():
    """Position x of a 1024-code run of a Marlin tile row holds element perm[x] of the run's 4 tiles
    (tile perm[x] // 256, row-major within it): warp thread i takes tile columns i // 4 and
    i // 4 + 8 at tile rows 2 (i % 4) + {0, 1, 8, 9} in each tile, evens of each 8 first."""
    perm = []
    for i in range(32):
        frag = [16 * (2 * (i % 4) + dr) + i // 4 + 8 * half for half in (0, 1) for dr in (0, 1, 8, 9)]
        for tile in range(4):
            perm += [frag[m] + 256 * tile for m in (0, 2, 4, 6, 1, 3, 5, 7)]
    assert sorted(perm) == list(range(1024))
    return torch.tensor(perm)


def marlin_scale_perm(groups):
    if groups > 1:  # runs of 64: an 8x8 transpose
        return torch.tensor([a + 8 * b for a in range(8) for b in range(8)])
    return torch.tensor([2 * a + b for a in range(4) for b in (0, 1, 8, 9, 16, 17, 24, 25)])


def marlin_pack(weight, scales):
    """Layer.pack's bytes: weight [out, in] float16 holding (q - 8) * s, scales [groups, out]
    float16. Codes are recomputed from the fp16 weight in fp16 as Layer.pack does. Returns B int32
    [in / 16, out * 2], s float16 [groups, out] (both permuted) and the codes [in, out]."""
    out, k = weight.shape
    groups = scales.shape[0]
    w = weight.t()  # [in, out]
    s_in = scales.repeat_interleave(k // groups, 0)  # [in, out]: each input's group scale
    q = (torch.round(w / s_in).int() + 8).clamp(0, 15)
    t = q.reshape(k // 16, 16, out // 16, 16).permute(0, 2, 1, 3).reshape(k // 16, out * 16)
    t = t.reshape(-1, 1024)[:, marlin_perm()].reshape(k // 16, out * 16).long()
    words = torch.zeros(k // 16, out * 2, dtype=torch.int64)
    for m in range(8):
        words |= t[:, m::8] << (4 * m)
    sperm = marlin_scale_perm(groups)
    s = scales.reshape(-1, len(sperm))[:, sperm].reshape(groups, out)
    return to_int32(words), s.contiguous(), q


def marlin_unpack(B, s, out, k):
    """An independent reader of the layout: each code found from its (input, output) position, each
    scale from its own; returns codes [in, out] and scales [groups, out]."""
    inv = torch.argsort(marlin_perm())  # inv[element] = its position in the run
    kk, nn = torch.meshgrid(torch.arange(k), torch.arange(out), indexing="ij")
    elem = (nn // 16) * 256 + (kk % 16) * 16 + nn % 16  # index within the tile row
    pos = (elem // 1024) * 1024 + inv[elem % 1024]
    words = B.long() & 0xFFFFFFFF
    codes = (words[kk // 16, pos // 8] >> (4 * (pos % 8))) & 15
    groups = s.shape[0]
    sperm = marlin_scale_perm(groups)
    run = len(sperm)
    x = torch.arange(groups * out)
    flat = torch.empty_like(x)
    flat[x - x % run + sperm[x % run]] = x  # stored index of each [groups, out] element
    return codes, s.reshape(-1)[flat].reshape(groups, out)


def marlin_tensors(w, group_size):
    k = w.shape[1]
    gs = k if group_size == -1 else group_size
    g_idx = torch.arange(k) // gs
    q, zeros, scales = rtn(w, gs, 4, True, g_idx)  # zero 8, s = 2 absmax / 15 in fp16
    deq = dequantize(q, zeros, scales, g_idx)
    B, s, codes = marlin_pack(deq.half(), scales)
    assert torch.equal(codes.t().long(), q), "Layer.pack's fp16 codes differ from the RTN codes"
    back, s_back = marlin_unpack(B, s, w.shape[0], k)
    assert torch.equal(back.t(), q) and torch.equal(s_back, scales), "Marlin unpack(pack) differs"
    return {"B": B, "s": s}, deq


FP8_MAX = 448.0
# Stacked layers whose inputs textgen quantizes together, and each one's input-scale factor.
FP8_STACKS = {"q_proj": ("qkv", 1.0), "k_proj": ("qkv", 1.25), "v_proj": ("qkv", 1.5),
              "gate_proj": ("gate_up", 1.0), "up_proj": ("gate_up", 1.25)}


def to_e4m3(x):
    """float32 -> float8 e4m3fn, saturating (vLLM's and AutoFP8's clamp before the cast)."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_tensors(w, per_channel):
    """weight, weight_scale as the writers store them, and the dequantized float32 weight."""
    if per_channel:  # llm-compressor / TGI's per-channel: absmax of the row / 448
        scale = (w.abs().amax(1).clamp(min=1e-12) / FP8_MAX).float()
        q = to_e4m3(w / scale[:, None])
        return q, scale, q.float() * scale[:, None]
    mul = FP8_MAX / w.abs().max().clamp(min=1e-12)  # AutoFP8's per_tensor_quantize
    q = to_e4m3(w * mul)
    scale = mul.float().reciprocal()
    return q, scale, q.float() * scale


NEAR_BOUNDARY = 1e-6  # relative distance of x / s from an e4m3 rounding boundary counted as near


def fake_quant_hook(scale, near=None):
    """The forward pre-hook that models textgen's kFp8 activations (static scale, or None: dynamic).
    `near`, a one-element list, counts the elements within NEAR_BOUNDARY of a rounding boundary."""
    def hook(_module, args):
        x = args[0]
        s = scale
        if s is None:
            amax = x.abs().max()
            s = amax / FP8_MAX if amax > 0 else torch.tensor(1.0)
        y = x / s
        q = to_e4m3(y).float()
        if near is not None:
            up = to_e4m3(y * (1 + NEAR_BOUNDARY)).float()
            down = to_e4m3(y * (1 - NEAR_BOUNDARY)).float()
            near[0] += int(((up != q) | (down != q)).sum())
        return (q * s,) + tuple(args[1:])
    return hook


def prefill_near_boundary(model, tokenizer_dir, stack_scale, calib):
    """Elements of the prompts' prefill activations within NEAR_BOUNDARY of an e4m3 rounding
    boundary under these static scales: where float32 summation order (BLAS against PyTorch) could
    round them the other way."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    near, hooks = [0], []
    for mname, module in model.named_modules():
        if mname in calib:
            hooks.append(module.register_forward_pre_hook(fake_quant_hook(stack_scale[stack_key(mname)], near)))
    with torch.no_grad():
        for text in PROMPTS:
            model(torch.tensor([tok.encode(text).ids]))
    for h in hooks:
        h.remove()
    return near[0]


def stack_key(mname):
    """(decoder layer, stack) of a Linear: q/k/v and gate/up share their input and its scale."""
    layer, leaf = mname.rsplit(".", 1)
    return layer.rsplit(".", 1)[0], FP8_STACKS.get(leaf, (leaf, 1.0))[0]


def calibrate(model, tokenizer_dir):
    """absmax / 448 of every quantized Linear's input over the fixture prompts."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    amax, hooks = {}, []
    for mname, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and mname.split(".")[-1] in QUANTIZED:
            def record(_m, args, name=mname):
                amax[name] = max(amax.get(name, 0.0), float(args[0].abs().max()))
            hooks.append(module.register_forward_pre_hook(record))
    with torch.no_grad():
        for text in PROMPTS:
            model(torch.tensor([tok.encode(text).ids]))
    for h in hooks:
        h.remove()
    return {k: v / FP8_MAX for k, v in amax.items()}


def build_fp8(name, kind, outdir, tokenizer_dir, seed):
    """The fp8 fixtures: the same tiny Llama, decoder Linears stored as float8 e4m3fn."""
    vocab = Tokenizer_vocab(tokenizer_dir)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, bos_token_id=1,
                         eos_token_id=2, max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    scale_weights(model, seed)
    per_channel = kind != "fp8-static"
    if kind == "fp8-static":
        qc = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
    elif kind == "fp8-dynamic":
        qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": ["lm_head"]}
    else:  # llm-compressor's FP8_DYNAMIC preset, as neuralmagic's *-FP8-Dynamic checkpoints hold it
        qc = {"quant_method": "compressed-tensors", "format": "float-quantized",
              "quantization_status": "compressed", "global_compression_ratio": None,
              "ignore": ["lm_head"], "kv_cache_scheme": None,
              "config_groups": {"group_0": {
                  "targets": ["Linear"], "output_activations": None,
                  "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel",
                              "dynamic": False, "group_size": None, "block_structure": None,
                              "actorder": None, "observer": "minmax", "observer_kwargs": {}},
                  "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                                        "strategy": "token", "dynamic": True, "group_size": None,
                                        "block_structure": None, "actorder": None, "observer": None,
                                        "observer_kwargs": {}}}}}
    state = {}
    with torch.no_grad():
        for mname, module in model.named_modules():
            if not (isinstance(module, torch.nn.Linear) and mname.split(".")[-1] in QUANTIZED):
                continue
            q, scale, deq = fp8_tensors(module.weight.detach().float(), per_channel)
            state[f"{mname}.weight"] = q.contiguous()
            if kind == "fp8-channel":
                scale = scale[:, None]  # compressed-tensors' [out, 1]
            state[f"{mname}.weight_scale"] = scale.contiguous()
            module.weight.copy_(deq)
    hooks = []
    if kind == "fp8-static":
        calib = calibrate(model, tokenizer_dir)  # on the dequantized weights, activations as they are
        # The calibrated scales times a common margin c >= 1, the first of 1, 1.01, ... under which no
        # prefill activation of the prompts lies within NEAR_BOUNDARY of an e4m3 rounding boundary
        # (so that the prompts' logits do not hinge on summation order).
        for step in range(200):
            c = 1.0 + 0.01 * step
            scales, stack_scale = {}, {}
            for mname, s in calib.items():
                s = torch.tensor(s * c * FP8_STACKS.get(mname.rsplit(".", 1)[1], ("", 1.0))[1],
                                 dtype=torch.float32)
                scales[mname] = s
                key = stack_key(mname)
                stack_scale[key] = torch.maximum(stack_scale.get(key, s), s)
            near = prefill_near_boundary(model, tokenizer_dir, stack_scale, calib)
            if near == 0:
                break
        else:
            raise RuntimeError("no input-scale margin keeps the prefill activations off e4m3 boundaries")
        print(f"{name}: input scales = calibrated x {c:.2f} (x 1 / 1.25 / 1.5 for q / k / v, x 1 / 1.25 "
              f"for gate / up)")
        for mname, s in scales.items():
            state[f"{mname}.input_scale"] = s
        for mname, module in model.named_modules():
            if mname in calib:
                hooks.append(module.register_forward_pre_hook(fake_quant_hook(stack_scale[stack_key(mname)])))
    elif kind == "fp8-dynamic":
        for mname, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and mname.split(".")[-1] in QUANTIZED:
                hooks.append(module.register_forward_pre_hook(fake_quant_hook(None)))
    write_fixture(name, model, config, qc, state, outdir, tokenizer_dir)


def quant_config(kind):
    if kind == "marlin":  # vLLM's MarlinConfig reads group_size (and lm_head)
        return {"quant_method": "marlin", "group_size": 128, "lm_head": False}
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
    marlin = kind == "marlin"
    config = LlamaConfig(vocab_size=vocab, hidden_size=128 if marlin else 64,
                         intermediate_size=384 if marlin else 192, num_hidden_layers=2 if marlin else 3,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, bos_token_id=1,
                         eos_token_id=2, max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    scale_weights(model, seed)
    half_dense = set()
    if marlin:  # the embeddings' values made float16's and stored so (half the bytes, same model)
        with torch.no_grad():
            emb = model.model.embed_tokens.weight
            emb.copy_(emb.half().float())
        half_dense.add("model.embed_tokens.weight")
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
            elif marlin:
                tensors, deq = marlin_tensors(w, qc["group_size"])
            else:
                tensors, deq = gptq_tensors(w, qc["group_size"], 4, qc["sym"], qc["desc_act"], gen)
            for k, v in tensors.items():
                state[f"{mname}.{k}"] = v
            module.weight.copy_(deq)  # the model transformers runs: the dequantized weights
    write_fixture(name, model, config, qc, state, outdir, tokenizer_dir, half_dense)


def write_fixture(name, model, config, qc, state, outdir, tokenizer_dir, half_dense=()):
    """The checkpoint (quantized tensors in `state`, the rest dense), config.json, tokenizer files and
    reference.json from `model` as transformers runs it."""
    for k, v in model.state_dict().items():
        if k.endswith(".weight") and k[:-len(".weight")].split(".")[-1] in QUANTIZED:
            continue
        if k == "lm_head.weight" and config.tie_word_embeddings:
            continue
        state[k] = (v.half() if k in half_dense else v).contiguous()
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
            ("llama-awq-g32", "awq", 44), ("llama-fp8", "fp8-static", 45),
            ("llama-fp8-channel", "fp8-channel", 46), ("llama-fp8-dynamic", "fp8-dynamic", 47),
            ("llama-marlin", "marlin", 48)]
    for name, kind, seed in jobs:
        if only is None or name in only:
            (build_fp8 if kind.startswith("fp8") else build)(name, kind, outdir, tokenizer_dir, seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
