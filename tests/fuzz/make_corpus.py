#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from the reference
fixtures (tests/reference) and hand-written requests. Deterministic; rerun after a fixture or an
input format changes, and commit the result. Needs protoc (the shard's RPCs are encoded with it).

Usage: make_corpus.py [REPO_ROOT]
"""
import hashlib
import json
import re
import os
import shutil
import struct
import subprocess
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))
REF = os.path.join(ROOT, "tests/reference")
OUT = os.path.join(ROOT, "tests/fuzz/corpus")
PROTO_DIR = os.path.join(ROOT, "proto")
PROTO = os.path.join(PROTO_DIR, "textgen/shard/v1/shard.proto")


# Seeds that crash code whose fix is pending (docs/fuzzing.md, triage): written to
# tests/fuzz/crashes/<target>/ instead, so that the smoke run in `make test` replays only inputs that
# pass. Move a name out of here once `tools/fuzz.sh regress` says it is fixed.
HELD_OUT = {}
CRASHES = os.path.join(ROOT, "tests/fuzz/crashes")


def write(target, data, name=None):
    if isinstance(data, str):
        data = data.encode()
    held = name in HELD_OUT.get(target, ())
    d = os.path.join(CRASHES if held else OUT, target)
    os.makedirs(d, exist_ok=True)
    name = name or hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def compact(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# ---- safetensors: whole files, small (real tensor names and dtypes, shapes shrunk) ----
def safetensors(tensors, metadata=None, pad=0, header_len_delta=0, data_extra=b""):
    """tensors: list of (name, dtype, shape, bytes or None); offsets are computed in order."""
    sizes = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
             "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, payload in tensors:
        n = sizes.get(dtype, 1)
        for d in shape:
            n *= d
        if payload is None:
            payload = bytes((i * 37 + 11) % 256 for i in range(n))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    h = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(h) + header_len_delta) + h + data + data_extra


def safetensors_corpus():
    path = os.path.join(REF, "models/llama-gqa/model.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        real = json.loads(f.read(n))
    shrunk = [(k, v["dtype"], [min(d, 3) for d in v["shape"]], None) for k, v in real.items() if k != "__metadata__"]
    write("safetensors", safetensors(shrunk, {"format": "pt"}), "llama-gqa-shrunk")
    write("safetensors", safetensors(shrunk[:4], {"format": "pt"}, pad=5), "llama-gqa-padded")
    f16 = [(k, "F16", s, None) for k, _, s, _ in shrunk[:6]]
    bf16 = [(k, "BF16", s, None) for k, _, s, _ in shrunk[:6]]
    write("safetensors", safetensors(f16), "f16")
    write("safetensors", safetensors(bf16), "bf16")
    dtypes = ["F64", "I64", "U64", "F32", "I32", "U32", "F16", "BF16", "I16", "U16", "I8", "U8", "BOOL", "F8_E4M3",
              "F8_E5M2"]
    write("safetensors", safetensors([(f"t.{d}", d, [2, 2], None) for d in dtypes]), "all-dtypes")
    shapes = [[], [1], [4], [2, 3], [3, 2], [2, 2, 2], [1, 4, 1], [2, 1, 2, 1]]
    write("safetensors", safetensors([(f"s{i}", "F32", s, None) for i, s in enumerate(shapes)]), "shapes")
    write("safetensors", safetensors([("s", "F32", [0], None), ("t", "F32", [2, 0], None)]), "zero-dims")
    write("safetensors", safetensors([]), "empty")
    write("safetensors", safetensors([], {"format": "pt", "note": "x"}), "metadata-only")
    write("safetensors", safetensors([("a", "F32", [2], None)], data_extra=b"\0" * 8), "trailing-data")
    write("safetensors", safetensors([("a", "F32", [4], None)], header_len_delta=1), "header-too-long")
    write("safetensors", safetensors([("a", "F32", [4], None)])[:-3], "truncated-data")
    write("safetensors", struct.pack("<Q", 2) + b"{}", "empty-object")
    write("safetensors", struct.pack("<Q", 2) + b"[]", "not-object")
    write("safetensors", struct.pack("<Q", 1 << 40) + b"{}", "huge-header-length")
    write("safetensors", b"\x05\0\0", "shorter-than-8")
    overlap = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    h = json.dumps(overlap).encode()
    write("safetensors", struct.pack("<Q", len(h)) + h + b"\0" * 12, "overlap")
    wrong = {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}
    h = json.dumps(wrong).encode()
    write("safetensors", struct.pack("<Q", len(h)) + h + b"\0" * 8, "span-mismatch")
    big = {"a": {"dtype": "F32", "shape": [4611686018427387904, 0], "data_offsets": [0, 0]}}
    h = json.dumps(big).encode()
    write("safetensors", struct.pack("<Q", len(h)) + h, "zero-times-huge")


# ---- model_config: config.json [NUL generation_config.json] ----
def model_config_corpus():
    models = sorted(os.listdir(os.path.join(REF, "models")))
    base = None
    for m in models:
        d = os.path.join(REF, "models", m)
        cfg = open(os.path.join(d, "config.json"), "rb").read()
        gen_path = os.path.join(d, "generation_config.json")
        gen = open(gen_path, "rb").read() if os.path.exists(gen_path) else b""
        write("model_config", cfg + b"\0" + gen, f"{m}")
        write("model_config", cfg, f"{m}-alone")
        if m == "llama-gqa":
            base = json.loads(cfg)
    variants = {
        "rope-scaling-linear": {"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 500000.0},
        "rope-scaling-dynamic": {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
        "rope-llama3": {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                                            "rope_theta": 500000.0}},
        "rope-yarn-mscale": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1,
                                              "mscale": 0.707, "mscale_all_dim": 0.707,
                                              "original_max_position_embeddings": 64}},
        "rope-yarn-attention-factor": {"rope_parameters": {"rope_type": "yarn", "factor": 2.0,
                                                           "attention_factor": 1.2, "truncate": False}},
        "partial-rotary": {"partial_rotary_factor": 0.5},
        "torch-dtype": {"torch_dtype": "bfloat16", "dtype": None},
        "mistral-window": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 32},
        "no-head-dim": {"head_dim": None},
        "eos-list": {"eos_token_id": [2, 3, 7], "bos_token_id": None},
        "tied": {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True},
        "huge-sizes": {"hidden_size": 4294967296, "vocab_size": 18446744073709551615},
        "negative": {"num_hidden_layers": -1},
        "float-sizes": {"hidden_size": 64.0},
        "unknown-arch": {"architectures": ["GPT2LMHeadModel"]},
        # quantization_config (issue 16): accepted GPT-Q / AWQ, then each way to refuse one.
        "gptq-v2-one-group": {"quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": -1,
                                                      "desc_act": False, "sym": True,
                                                      "checkpoint_format": "gptq_v2"}},
        "awq-autoawq": {"quantization_config": {"quant_method": "awq", "w_bit": 4, "q_group_size": 128,
                                                "zero_point": False, "version": "GEMM"}},
        "gptq-3-bit": {"quantization_config": {"quant_method": "gptq", "bits": 3, "group_size": 128}},
        "gptq-marlin-format": {"quantization_config": {"quant_method": "gptq", "bits": 4, "format": "marlin"}},
        # Marlin (IST-DASLab's B / s): accepted as vLLM and AutoGPTQ write it, then refused.
        "marlin-g128": {"quantization_config": {"quant_method": "marlin", "group_size": 128, "lm_head": False}},
        "marlin-gptq-is-marlin-format": {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": -1,
                                                                 "is_marlin_format": True}},
        "marlin-24": {"quantization_config": {"quant_method": "marlin", "group_size": 128, "is_marlin_24": True}},
        "marlin-gptq-24": {"quantization_config": {"quant_method": "gptq", "bits": 4,
                                                   "checkpoint_format": "marlin_24"}},
        "marlin-group-64": {"quantization_config": {"quant_method": "marlin", "group_size": 64}},
        "awq-gemv": {"quantization_config": {"quant_method": "awq", "bits": 4, "version": "gemv"}},
        "awq-bits-disagree": {"quantization_config": {"quant_method": "awq", "bits": 4, "w_bit": 8}},
        "quant-bitsandbytes": {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
        "quant-not-object": {"quantization_config": "gptq"},
        # fp8 checkpoints: accepted (vLLM / AutoFP8, llm-compressor), then refused.
        "fp8-static": {"quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}},
        "fp8-compressed-dynamic": {"quantization_config": {
            "quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
                "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}}},
        "fp8-block": {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
        "fp8-compressed-int4": {"quantization_config": {
            "quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
                "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}}},
    }
    for name, change in variants.items():
        cfg = dict(base)
        for k, v in change.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        write("model_config", compact(cfg) + "\0" + compact({"eos_token_id": [2, 5], "bos_token_id": 1}), name)
    write("model_config", "{}", "empty-object")
    write("model_config", "[]", "array")
    write("model_config", compact(base) + "\0" + "{\"eos_token_id\": \"x\"}", "bad-generation-config")


# ---- tokenizer_encode: [tokenizer index][flags][text | u16 ids] ----
def tokenizer_encode_corpus():
    root = os.path.join(REF, "tokenizers")
    dirs = sorted(d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, "tokenizer.json")))
    for i, d in enumerate(dirs):
        cases = [json.loads(l) for l in open(os.path.join(root, d, "cases.jsonl"), encoding="utf-8")]
        # The shortest, the longest (capped) and a few spread between: ASCII, Unicode, specials.
        cases.sort(key=lambda c: len(c["text"].encode()))
        picks = [cases[0], cases[len(cases) // 4], cases[len(cases) // 2], cases[3 * len(cases) // 4]]
        picks += [c for c in cases if "<" in c["text"]][:1]
        for k, c in enumerate(picks):
            text = c["text"].encode()[:400]
            write("tokenizer_encode", bytes([i, k & 3]) + text, f"{d}-{k}")
        ids = cases[len(cases) // 2]["ids"][:64]
        write("tokenizer_encode", bytes([i, 4 | 2]) + b"".join(struct.pack("<H", x) for x in ids), f"{d}-ids")
        write("tokenizer_encode", bytes([i, 4]) + b"".join(struct.pack("<H", x) for x in range(0, 300, 7)),
              f"{d}-ids-spread")
    write("tokenizer_encode", bytes([0, 1]) + b"\xff\xfe\xc3\x28 invalid \xed\xa0\x80", "invalid-utf8")


# ---- tokenizer_json: small tokenizers with each fixture's pipeline, [NUL tokenizer_config.json] ----
def mini_tokenizer(tok, keep):
    t = json.loads(json.dumps(tok))
    m = t["model"]
    if isinstance(m.get("vocab"), dict):
        m["vocab"] = {k: v for k, v in m["vocab"].items() if v < keep}
        if m.get("merges"):
            vocab = m["vocab"]
            kept = []
            for merge in m["merges"]:
                a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
                if a in vocab and b in vocab and a + b in vocab:
                    kept.append(merge)
            m["merges"] = kept
    elif isinstance(m.get("vocab"), list):
        m["vocab"] = m["vocab"][:keep]
    t["added_tokens"] = [a for a in t.get("added_tokens", []) if a["id"] < keep]
    norm = t.get("normalizer")
    # The T5 charsmap alone is 300 KB: seeds keep the rest of the normalizer.
    if norm and norm.get("type") == "Precompiled":
        t["normalizer"] = None
    elif norm and norm.get("type") == "Sequence":
        norm["normalizers"] = [n for n in norm["normalizers"] if n.get("type") != "Precompiled"]
    return t


def tokenizer_json_corpus():
    root = os.path.join(REF, "tokenizers")
    for d in sorted(os.listdir(root)):
        p = os.path.join(root, d, "tokenizer.json")
        if not os.path.exists(p):
            continue
        tok = json.load(open(p, encoding="utf-8"))
        byte_level = "ByteLevel" in json.dumps(tok.get("pre_tokenizer")) or "byte_fallback\": true" in json.dumps(tok["model"])
        keep = 300 if byte_level or tok["model"]["type"] == "Unigram" else 96
        mini = compact(mini_tokenizer(tok, keep)).encode()
        write("tokenizer_json", mini, f"{d}")
        cfg_path = os.path.join(root, d, "tokenizer_config.json")
        if os.path.exists(cfg_path):
            cfg = json.load(open(cfg_path, encoding="utf-8"))
            cfg.pop("added_tokens_decoder", None)
            write("tokenizer_json", mini + b"\0" + compact(cfg).encode(), f"{d}-config")
    tiny = {"version": "1.0", "added_tokens": [{"id": 0, "content": "[UNK]", "special": True, "single_word": False,
                                                "lstrip": False, "rstrip": False, "normalized": False}],
            "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1, "world": 2}, "unk_token": "[UNK]"}}
    write("tokenizer_json", compact(tiny), "tiny-wordlevel")
    write("tokenizer_json", "{}", "empty-object")


# ---- tokenizer_slow: vocab.json NUL merges.txt [NUL tokenizer_config.json [NUL special_tokens_map.json]] ----
def tokenizer_slow_corpus():
    d = os.path.join(REF, "tokenizers", "opt-slow")
    read = lambda name: open(os.path.join(d, name), "rb").read()
    vocab = json.loads(read("vocab.json"))
    keep = {k: v for k, v in vocab.items() if v < 300}
    merges = [line for line in read("merges.txt").decode().split("\n")[1:] if line]
    kept = [m for m in merges if all(p in keep for p in (*m.split(" "), m.replace(" ", "")))]
    v = json.dumps(keep, ensure_ascii=False, separators=(",", ":")).encode()
    m = ("#version: 0.2\n" + "\n".join(kept) + "\n").encode()
    cfg, smap = read("tokenizer_config.json"), read("special_tokens_map.json")
    write("tokenizer_slow", v + b"\0" + m, "opt")
    write("tokenizer_slow", v + b"\0" + m + b"\0" + compact(json.loads(cfg)).encode(), "opt-config")
    write("tokenizer_slow", b"\0".join([v, m, compact(json.loads(cfg)).encode(),
                                         compact(json.loads(smap)).encode()]), "opt-config-map")
    extra = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": True, "add_eos_token": True,
             "bos_token": "<s>", "mask_token": "<mask>", "additional_special_tokens": ["<|x|>"],
             "added_tokens_decoder": {"5": {"content": "<|y|>", "lstrip": True, "special": False}}}
    write("tokenizer_slow", v + b"\0" + m.replace(b"\n", b"\r\n") + b"\0" + compact(extra).encode(),
          "opt-crlf-options")
    write("tokenizer_slow", b'{"a":0,"b":1,"ab":2}\0a b\n', "tiny")


# ---- router_request: request bodies ----
REQUESTS = [
    {"inputs": "The quick brown fox"},
    {"inputs": "Hello", "parameters": {"max_new_tokens": 5}},
    {"inputs": "Hello", "parameters": {"max_new_tokens": 20, "do_sample": True, "temperature": 0.7, "top_k": 10,
                                       "top_p": 0.9, "typical_p": 0.95, "seed": 42, "repetition_penalty": 1.1,
                                       "frequency_penalty": 0.5}},
    {"inputs": "Hello", "parameters": {"best_of": 2, "do_sample": True, "details": True}},
    {"inputs": "Hello", "parameters": {"stop": ["\n", "fox", "."], "return_full_text": True}},
    {"inputs": "Hello", "parameters": {"truncate": 3, "details": True, "decoder_input_details": True,
                                       "top_n_tokens": 2}},
    {"inputs": "Hello", "parameters": {"watermark": True}},
    {"inputs": "Hello", "parameters": {"grammar": {"type": "json", "value": {"type": "object"}}}},
    {"inputs": "Hello", "parameters": {"adapter_id": "lora"}},
    {"inputs": "Hello", "parameters": {"max_new_tokens": None, "temperature": None}},
    {"inputs": "Hello", "stream": True, "parameters": {"max_new_tokens": 3}},
    {"inputs": "Hello", "add_special_tokens": False},
    {"inputs": "", "parameters": {}},
    {"inputs": "héllo 中文 😀 <s> </s>", "parameters": {"max_new_tokens": 1}},
    {"inputs": "x" * 200, "parameters": {"max_new_tokens": 2000}},
    {"inputs": "Hello", "parameters": {"temperature": 0, "top_p": 1.0, "top_k": -1}},
    {"inputs": "Hello", "parameters": {"max_new_tokens": 4294967296, "seed": -1}},
    {"inputs": "Hello", "parameters": {"max_new_tokens": 1.5, "temperature": "hot"}},
    {"inputs": ["a", "b"]},
    {"inputs": 5},
    {"parameters": {}},
]


def router_request_corpus():
    for i, r in enumerate(REQUESTS):
        write("router_request", compact(r), f"req-{i:02d}")
    for i, c in enumerate(COMPLETIONS):
        write("router_request", compact(c), f"completions-{i:02d}")
    write("router_request", "not json", "not-json")
    write("router_request", "[]", "array")
    write("router_request", "{\"inputs\": \"a\\u0000b\\ud800\"}", "escapes")


# ---- router_routes: [method | route << 3][flags][body] ----
METHODS = ["GET", "POST", "OPTIONS", "PUT", "DELETE", "HEAD", "", "post"]
ROUTES = ["/generate", "/", "/generate_stream", "/v1/completions", "/tokenize", "/info", "/health", "/metrics",
          "/v1/models", "/api-doc/openapi.json", "/v1/chat/completions", "/invocations", "/generate/", "//generate",
          "/GENERATE", "/docs", "/ping", "/chat_tokenize", "/vertex"]
VERTEX = [
    {"instances": [{"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 3, "seed": 1}}]},
    {"instances": [{"inputs": "Hi"}, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}]},
    {"instances": []},
    {"instances": [5, {"foo": 1}]},
    {"instances": [{"inputs": "x", "parameters": {"max_new_tokens": "a"}}]},
    {"instances": {"inputs": "x"}},
]
COMPLETIONS = [
    {"model": "llama-gqa", "prompt": "The quick brown fox", "max_tokens": 5},
    {"model": "llama-gqa", "prompt": ["a", "b"], "max_tokens": 2, "temperature": 0.5, "top_p": 0.9, "seed": 1},
    {"model": "llama-gqa", "prompt": "Hi", "stream": True, "stop": ["\n"], "frequency_penalty": 0.2},
    {"model": "llama-gqa", "prompt": "Hi", "logprobs": 2, "echo": True, "suffix": "x", "n": 2, "best_of": 2},
    {"prompt": "", "max_tokens": 0},
    {"model": "x", "prompt": [1, 2, 3]},
]


def router_routes_corpus():
    def req(method, route, flags, body):
        return bytes([METHODS.index(method) | (ROUTES.index(route) << 3), flags]) + body.encode()

    for i, r in enumerate(REQUESTS[:12]):
        write("router_routes", req("POST", "/generate", 0, compact(r)), f"generate-{i:02d}")
    for i, r in enumerate(REQUESTS[:4]):
        write("router_routes", req("POST", "/", 0, compact(r)), f"compat-{i:02d}")
        write("router_routes", req("POST", "/generate_stream", 0, compact(r)), f"stream-{i:02d}")
        write("router_routes", req("POST", "/tokenize", 0, compact(r)), f"tokenize-{i:02d}")
    write("router_routes", req("POST", "/", 0, compact(REQUESTS[10])), "compat-stream")
    for i, c in enumerate(COMPLETIONS):
        write("router_routes", req("POST", "/v1/completions", 0, compact(c)), f"completions-{i:02d}")
    for i, v in enumerate(VERTEX):
        write("router_routes", req("POST", "/vertex", 0, compact(v)), f"vertex-{i:02d}")
    for route in ["/info", "/health", "/metrics", "/v1/models", "/api-doc/openapi.json", "/docs", "/ping", "/"]:
        write("router_routes", req("GET", route, 0, ""), "get" + (route.replace("/", "-") if route != "/" else "-root"))
    write("router_routes", req("OPTIONS", "/generate", 8, ""), "options-cors")
    write("router_routes", req("POST", "/generate", 1 | 2 | 8, compact(REQUESTS[1])), "auth-ok")
    write("router_routes", req("POST", "/generate", 1 | 4, compact(REQUESTS[1])), "auth-wrong")
    write("router_routes", req("POST", "/generate", 1, compact(REQUESTS[1])), "auth-missing")
    write("router_routes", req("PUT", "/generate", 0, compact(REQUESTS[1])), "put")
    write("router_routes", req("GET", "/generate", 0, ""), "get-generate")
    write("router_routes", bytes([1 | (31 << 3), 0]) + b"/generate?x=1\n" + compact(REQUESTS[1]).encode(), "raw-path")
    write("router_routes", bytes([0 | (31 << 3), 0]) + b"/../../etc/passwd\n", "raw-path-dots")


# ---- shard_rpc: [rpc][u16 length][message]... ----
RPC = {"Prefill": 0, "Decode": 1, "FilterBatch": 2, "ClearCache": 3, "Warmup": 4, "Info": 5, "Health": 6}


def encode(message, text):
    return subprocess.run(["protoc", f"--proto_path={PROTO_DIR}", f"--encode=textgen.shard.v1.{message}", PROTO],
                          input=text.encode(), capture_output=True, check=True).stdout


def calls(*items):
    out = b""
    for rpc, text in items:
        msg = encode(rpc + "Request", text)
        out += bytes([RPC[rpc]]) + struct.pack("<H", len(msg)) + msg
    return out


def shard_rpc_corpus():
    ref = json.load(open(os.path.join(REF, "models/llama-gqa/reference.json")))
    prompts = [p["input_ids"] for p in ref["prompts"]]

    def request(rid, p, max_new, first_block, extra="", params=""):
        n = len(prompts[p]) + max_new
        blocks = " ".join(f"blocks: {first_block + b}" for b in range((n + 15) // 16))
        ids = " ".join(f"input_ids: {t}" for t in prompts[p])
        return (f"requests {{ id: {rid} {ids} {blocks} stopping_parameters {{ max_new_tokens: {max_new} }} "
                f"parameters {{ {params} }} {extra} }}")

    def prefill(bid, *reqs):
        return ("Prefill", f"batch {{ id: {bid} size: {len(reqs)} {' '.join(reqs)} }}")

    decode1 = ("Decode", "batches { id: 1 }")
    write("shard_rpc", calls(prefill(1, request(1, 0, 4, 0))), "prefill")
    write("shard_rpc", calls(prefill(1, request(1, 0, 4, 0)), decode1, decode1, decode1), "prefill-decode")
    write("shard_rpc", calls(prefill(1, request(1, 0, 8, 0), request(2, 1, 8, 4)), decode1,
                             ("FilterBatch", "batch_id: 1 request_ids: 2"), decode1), "two-filter")
    write("shard_rpc", calls(prefill(1, request(1, 2, 3, 0, "prefill_logprobs: true top_n_tokens: 3",
                                                "do_sample: true temperature: 0.8 top_k: 20 top_p: 0.9 seed: 7")),
                             decode1, ("ClearCache", "id: 1"), decode1), "sampling-clear")
    write("shard_rpc", calls(prefill(1, request(1, 3, 6, 0, "chunk_len: 2")),
                             ("Prefill", "batch { id: 2 size: 0 } cached_batch { id: 1 }"), decode1), "chunked")
    write("shard_rpc", calls(prefill(1, request(1, 0, 4, 0, "cache_len: 2")), decode1), "prefix-cached")
    write("shard_rpc", calls(prefill(1, request(1, 0, 4, 0, "", "repetition_penalty: 1.3 frequency_penalty: 0.5 "
                                                "logit_bias { key: 5 value: 10 } typical_p: 0.5 do_sample: true")),
                             decode1), "penalties")
    write("shard_rpc", calls(prefill(1, request(1, 0, 4, 0)), prefill(2, request(2, 1, 4, 8)),
                             ("Decode", "batches { id: 1 } batches { id: 2 }"), decode1), "two-batches")
    stop_req = request(1, 0, 6, 0).replace("max_new_tokens: 6", 'max_new_tokens: 6 stop_sequences: "e" '
                                                                 "ignore_eos_token: true")
    write("shard_rpc", calls(prefill(1, stop_req), decode1, decode1), "stop-sequences")
    write("shard_rpc", calls(("Warmup", f"batch {{ id: 0 size: 1 {request(9, 1, 4, 0)} }} max_prefill_tokens: 32 "
                                        "max_input_tokens: 64 max_total_tokens: 128"),
                             prefill(1, request(1, 0, 2, 0)), decode1), "warmup-prefill")
    write("shard_rpc", calls(("Info", ""), ("Health", ""), ("ClearCache", "")), "info-health")
    write("shard_rpc", calls(prefill(1, request(1, 0, 4, 0).replace("blocks: 0", "blocks: 4000"))), "block-out-of-range")
    write("shard_rpc", calls(prefill(1, request(1, 0, 40, 0))), "too-few-blocks")
    write("shard_rpc", calls(("Prefill", "batch { id: 1 size: 2 }")), "size-mismatch")
    write("shard_rpc", calls(("Decode", "batches { id: 77 }"), ("FilterBatch", "batch_id: 77")), "unknown-batch")
    write("shard_rpc", calls(prefill(1, request(1, 0, 4, 0, 'slots: 0 slots: 1 slots: 2')), decode1), "slots")
    write("shard_rpc", calls(prefill(1, request(1, 0, 4, 0, "", "watermark: true"))), "watermark")
    # A growing router: blocks for the prompt only, more by extension; a request resumed after preemption.
    grow = request(1, 0, 40, 0)
    grow = re.sub(r" blocks: [1-9]\d*", "", grow)  # the prompt fits in block 0
    write("shard_rpc", calls(prefill(1, grow), decode1, ("Decode", "batches { id: 1 } extensions { request_id: 1 blocks: 9 }"),
                             decode1, ("Prefill", "batch { id: 2 size: 0 } cached_batch { id: 1 } "
                                                  "extensions { request_id: 1 blocks: 10 }")), "grow-extend")
    resumed = request(1, 1, 8, 0, "generated_tokens: 3", "do_sample: true seed: 3")
    write("shard_rpc", calls(prefill(1, resumed), decode1, decode1), "resumed")
    # Pipelined decoding: numbered steps, each after the one before; the last two follow the step
    # that ended the batch (it steps nothing) and a step that never ran (refused at once).
    write("shard_rpc", calls(prefill(1, request(1, 0, 3, 0)), ("Decode", "batches { id: 1 } step: 1"),
                             ("Decode", "batches { id: 1 } step: 2 after_step: 1 "
                                        "extensions { request_id: 1 blocks: 9 }"),
                             ("Decode", "batches { id: 1 } step: 3 after_step: 2"),
                             ("Decode", "batches { id: 1 } step: 5 after_step: 4")), "pipelined")


def speculation_corpus():
    """Byte 0: k, byte 1: the vocabulary's size, then 16-bit token ids (speculation_fuzz.cpp)."""
    import random
    rng = random.Random(5)
    seq = lambda k, v, toks: bytes([k, v]) + b"".join(struct.pack("<H", t) for t in toks)
    write("speculation", seq(4, 1, [5, 6, 7, 5, 6, 7, 5, 6]), "repeats")
    write("speculation", seq(7, 0, [1, 1, 1, 1, 1]), "periodic")
    write("speculation", seq(3, 10, [rng.randrange(700) for _ in range(200)]), "random")
    write("speculation", seq(2, 3, []), "empty")
    write("speculation", seq(16, 63, list(range(40)) + list(range(20))), "copy")


def cpu_limits_corpus():
    """Byte 0: the reader (0 cpu.max, 1 cfs quota NL period, 2 /proc/self/cgroup), then the content
    (cpu_limits_fuzz.cpp)."""
    write("cpu_limits", b"\x00200000 100000\n", "v2_quota")
    write("cpu_limits", b"\x00max 100000\n", "v2_max")
    write("cpu_limits", b"\x01400000\n100000\n", "v1_quota")
    write("cpu_limits", b"\x020::/kubepods/pod1/ctr\n", "self_v2")
    write("cpu_limits", b"\x020::/../escape\n", "self_escape")
    write("cpu_limits", b"\x0212:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/x\n", "self_v1")


# ---- docs_page: [method | no-files flag << 3][path] ----
def docs_page_corpus():
    methods = ["GET", "HEAD", "POST", "PUT", "OPTIONS", "", "get", "DELETE"]
    for name, method, empty, path in [
            ("page", "GET", 0, "/docs"), ("page-slash", "GET", 0, "/docs/"), ("head", "HEAD", 0, "/docs/swagger-ui.css"),
            ("bundle", "GET", 0, "/docs/swagger-ui-bundle.js"), ("script", "GET", 0, "/docs/textgen-docs.js"),
            ("favicon", "GET", 0, "/docs/favicon-16x16.png"), ("post", "POST", 0, "/docs"),
            ("missing", "GET", 1, "/docs/swagger-ui.css"), ("dots", "GET", 0, "/docs/../../etc/passwd"),
            ("encoded-dots", "GET", 0, "/docs/%2e%2e/%2e%2e/etc/passwd"), ("nul", "GET", 0, "/docs/swagger-ui.css\0"),
            ("license", "GET", 0, "/docs/LICENSE"), ("absolute", "GET", 0, "/docs//etc/passwd")]:
        write("docs_page", bytes([methods.index(method) | empty << 3]) + path.encode(), name)


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    safetensors_corpus()
    model_config_corpus()
    tokenizer_encode_corpus()
    tokenizer_json_corpus()
    tokenizer_slow_corpus()
    router_request_corpus()
    router_routes_corpus()
    shard_rpc_corpus()
    speculation_corpus()
    cpu_limits_corpus()
    docs_page_corpus()
    for t in sorted(os.listdir(OUT)):
        files = os.listdir(os.path.join(OUT, t))
        size = sum(os.path.getsize(os.path.join(OUT, t, f)) for f in files)
        print(f"{t}: {len(files)} files, {size} bytes")


if __name__ == "__main__":
    main()
