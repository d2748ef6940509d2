#!/usr/bin/env python3
"""Every model fixture served by textgen-launcher with --num-shard 2 and 4 on the CPU (Gloo), through
the router and gRPC: each reference prompt's greedy tokens equal transformers' (the fixture's
reference.json), and a fixture whose heads do not divide across the ranks is refused at start-up
with a message naming the dimension. On the CPU also: a model whose padded vocabulary (MPT's and
NeoX's config vocab_size rounds the tokenizer's up) makes it emit ids the tokenizer lacks is served
as transformers' decode treats them (no text), with no error; and opt-pre with hub OPT's tokenizer
files (vocab.json + merges.txt, no tokenizer.json: the opt-slow tokenizer fixture) encodes each
prompt as transformers did and generates its tokens.

Usage: tp_fixtures_test.py LAUNCHER_BINARY MODELS_DIR [cuda [WORLDS]]
With `cuda` (the GPU machine, tools/gpu-run.sh): in float32 on the GPUs, --num-shard of each of
WORLDS (comma-separated, default 2: two GPUs, NCCL and the one-shot all-reduce, with NCCL_DEBUG=INFO,
printing the transport NCCL chose between the ranks; 1: the whole model on one GPU).
Prints "N passed, M failed" and exits non-zero on any failure.
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

LAUNCHER, MODELS = sys.argv[1:3]
CUDA = len(sys.argv) > 3 and sys.argv[3] == "cuda"
NCCL_LOGS = tempfile.mkdtemp(prefix="tgnccl-")  # NCCL_DEBUG_FILE: its stdout is buffered
WORLDS = (tuple(int(w) for w in (sys.argv[4] if len(sys.argv) > 4 else "2").split(","))
          if CUDA else (2, 4))
FIXTURES = ["llama-gqa", "llama-tied-linear", "llama-dynamic", "mistral-sharded", "llama-hd128",
            "llama-rope-llama3", "llama-rope-yarn", "llama-bias-gelu", "opt-pre", "opt-post-proj",
            "codellama", "gptneox-parallel", "gptneox-sequential", "bigcode-mqa", "bigcode-mha",
            "bloom", "bloom-post-ln", "mpt-clip",
            "falcon-mqa-rotary", "falcon-alibi", "falcon-new", "falcon-new-one-norm",
            "llama-gptq-g32", "llama-gptq-actorder", "llama-awq-g32", "llama-fp8", "llama-fp8-channel",
            "llama-marlin"]
NEW_TOKENS = 12
results = {"passed": 0, "failed": 0}


def check(cond, what):
    results["passed" if cond else "failed"] += 1
    print(("ok:   " if cond else "FAIL: ") + what, flush=True)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model, world):
    """Starts the launcher; returns (process, url or None, output lines). A master port taken by
    another socket between free_port() and rank 0's listen (NCCL's own, on the GPU machine) is
    replaced."""
    for _ in range(4):
        p, url, lines = serve_once(model, world)
        if url or "cannot listen on port" not in "".join(lines):
            return p, url, lines
        p.wait()
    return p, url, lines


def serve_once(model, world):
    cmd = [LAUNCHER, "--model-id", model, "--num-shard", str(world), "--port", str(free_port()),
           "--hostname", "127.0.0.1", "--master-port", str(free_port()),
           "--shard-uds-path", tempfile.mktemp(prefix="tgfx-"), "--kv-cache-memory", str(256 << 20)]
    # A pre-quantized fixture is served with TGI's --quantize naming its format (accepted when it
    # matches config.json's quantization_config).
    quant = json.load(open(os.path.join(model, "config.json"))).get("quantization_config")
    if quant:
        cmd += ["--quantize", quant["quant_method"]]
    if CUDA:
        cmd += ["--dtype", "float32"]
        env = dict(os.environ, NCCL_DEBUG="INFO", NCCL_NVLS_ENABLE="0",
                   NCCL_DEBUG_FILE=os.path.join(NCCL_LOGS, "nccl.%p.log"))
    else:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="-1")  # CPU ranks, even on a GPU machine
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    timer = threading.Timer(120, p.kill)
    timer.start()
    url = None
    for line in p.stdout:
        lines.append(line)
        if line.startswith("textgen-launcher ready "):
            url = line.split()[2]
            break
    timer.cancel()
    if url:
        def drain():
            for line in p.stdout:
                lines.append(line)
        threading.Thread(target=drain, daemon=True).start()
    return p, url, lines


def generate(url, text):
    host, port = url.replace("http://", "").rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    c.request("POST", "/generate", json.dumps({"inputs": text, "parameters": {
        "max_new_tokens": NEW_TOKENS, "details": True}}), {"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, json.loads(r.read())


def first_key(config, *keys):
    return next((config[k] for k in keys if config.get(k) is not None), None)


def divides(config, world):
    h = first_key(config, "num_attention_heads", "n_head", "n_heads")  # n_heads: MPT
    kv = config.get("num_key_value_heads", h)
    if config.get("model_type") == "gpt_bigcode":  # GPTBigCodeConfig sets it from multi_query
        kv = 1 if config.get("multi_query", True) else h
    # ffn_dim: OPT; n_inner (null: 4 * n_embd): GPT-BigCode; ffn_hidden_size: Falcon; BLOOM's and
    # MPT's MLPs are 4 x hidden
    inter = (config.get("intermediate_size") or config.get("ffn_dim") or config.get("n_inner")
             or config.get("ffn_hidden_size")
             or 4 * (first_key(config, "n_embd", "hidden_size", "d_model") or 0))
    return (h % world == 0 and inter % world == 0 and
            (kv % world == 0 if kv >= world else world % kv == 0))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = bytearray(f.read())
    return header, data


def f32_view(header, data, name):
    begin, end = header[name]["data_offsets"]
    return memoryview(data)[begin:end].cast("f")


def padded_vocabulary_model(out):
    """gptneox-parallel (vocab_size 768, tokenizer 700 ids) changed to emit id 760 at every step:
    the final LayerNorm's weight 0 and bias b make every last hidden state b, and the head's row 760
    is 50·b."""
    src = os.path.join(MODELS, "gptneox-parallel")
    shutil.copytree(src, out)
    header, data = read_safetensors(os.path.join(src, "model.safetensors"))
    weight = f32_view(header, data, "gpt_neox.final_layer_norm.weight")
    bias = f32_view(header, data, "gpt_neox.final_layer_norm.bias")
    head = f32_view(header, data, "embed_out.weight")
    hidden = len(weight)
    for i in range(hidden):
        weight[i] = 0.0
        bias[i] = 1.0 if i % 3 == 0 else -0.5
        head[760 * hidden + i] = 50.0 * bias[i]
    raw = json.dumps(header).encode()
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + bytes(data))
    return out


def padded_vocabulary():
    model = padded_vocabulary_model(os.path.join(tempfile.mkdtemp(prefix="tgpad-"), "model"))
    p, url, lines = serve(model, 2)
    try:
        if not url:
            check(False, f"padded vocabulary: did not start: {''.join(lines)[-1500:]}")
            return
        status, body = generate(url, "Hello world")
        tokens = body.get("details", {}).get("tokens", [])
        check(status == 200 and len(tokens) == NEW_TOKENS and all(t["id"] == 760 for t in tokens)
              and all(t["text"] == "" for t in tokens) and body.get("generated_text") == "",
              f"padded vocabulary: id 760 (past the tokenizer's 700) served as no text: {status} "
              f"{json.dumps(body)[:400]}")
        host, port = url.replace("http://", "").rsplit(":", 1)
        c = http.client.HTTPConnection(host, int(port), timeout=120)
        c.request("POST", "/generate_stream", json.dumps({"inputs": "Hello", "parameters": {
            "max_new_tokens": 4}}), {"Content-Type": "application/json"})
        r = c.getresponse()
        events = [json.loads(l[5:]) for l in r.read().decode().splitlines() if l.startswith("data:")]
        check(r.status == 200 and len(events) == 4 and events[-1].get("generated_text") == ""
              and all(e["token"]["id"] == 760 for e in events),
              f"padded vocabulary: streamed, 4 events, the last with generated_text '': {r.status} "
              f"{events[-1:] if events else events}")
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def slow_tokenizer_files():
    model = os.path.join(tempfile.mkdtemp(prefix="tgslow-"), "opt-pre")
    shutil.copytree(os.path.join(MODELS, "opt-pre"), model)
    os.remove(os.path.join(model, "tokenizer.json"))
    slow = os.path.join(os.path.dirname(os.path.abspath(MODELS)), "tokenizers", "opt-slow")
    for f in ("vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(slow, f), model)
    ref = json.load(open(os.path.join(model, "reference.json")))
    p, url, lines = serve(model, 2)
    try:
        if not url:
            check(False, f"opt-pre with vocab.json + merges.txt: did not start: {''.join(lines)[-1500:]}")
            return
        for prompt in ref["prompts"]:
            host, port = url.replace("http://", "").rsplit(":", 1)
            c = http.client.HTTPConnection(host, int(port), timeout=120)
            c.request("POST", "/generate", json.dumps({"inputs": prompt["text"], "parameters": {
                "max_new_tokens": NEW_TOKENS, "details": True, "decoder_input_details": True}}),
                {"Content-Type": "application/json"})
            r = c.getresponse()
            body = json.loads(r.read())
            ids = [t["id"] for t in body.get("details", {}).get("prefill", [])]
            got = [t["id"] for t in body.get("details", {}).get("tokens", [])]
            check(r.status == 200 and ids == prompt["input_ids"] and got == prompt["greedy"][:len(got)]
                  and len(got) >= 1,
                  f"opt-pre with vocab.json + merges.txt: '{prompt['text'][:24]}' encoded and "
                  f"generated as transformers ({r.status}, {len(got)} tokens)")
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main():
    if not CUDA:
        padded_vocabulary()
        slow_tokenizer_files()
    for name in FIXTURES:
        model = os.path.join(MODELS, name)
        ref = json.load(open(os.path.join(model, "reference.json")))
        config = json.load(open(os.path.join(model, "config.json")))
        for world in WORLDS:
            what = f"{name} --num-shard {world}"
            p, url, lines = serve(model, world)
            try:
                if not divides(config, world):
                    p.wait(timeout=60)
                    out = "".join(lines) + (p.stdout.read() or "")
                    check(url is None and p.returncode != 0 and
                          f"does not divide across {world} tensor-parallel ranks" in out,
                          f"{what}: refused at start-up naming the dimension")
                    continue
                if not url:
                    check(False, f"{what}: did not start: {''.join(lines)[-1500:]}")
                    continue
                if CUDA:  # every rank on the CUDA backend, not the CPU fallback
                    check(sum("backend cuda, dtype float32" in l for l in lines) == world,
                          f"{what}: {world} rank(s) on the CUDA backend")
                if CUDA and world > 1:
                    log = "".join(lines)
                    check("one-shot peer-memory kernel" in log or "all-reduce through" in log,
                          f"{what}: " + next((l.strip() for l in lines if "all-reduce through" in l),
                                             "no all-reduce line"))
                for prompt in ref["prompts"]:
                    status, body = generate(url, prompt["text"])
                    got = [t["id"] for t in body.get("details", {}).get("tokens", [])]
                    want = prompt["greedy"][:len(got)]
                    check(status == 200 and len(got) >= 1 and got == want,
                          f"{what}: '{prompt['text'][:24]}' greedy tokens equal transformers' "
                          f"({len(got)} tokens; status {status})")
            finally:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
    if CUDA and max(WORLDS) > 1:  # the transport NCCL chose between the ranks (P2P over NVLink expected)
        vias = set()
        for f in os.listdir(NCCL_LOGS):
            for line in open(os.path.join(NCCL_LOGS, f), errors="replace"):
                if " via " in line:
                    vias.add(line.split(" via ", 1)[1].strip())
        check(bool(vias), "NCCL's log names the transport between the ranks: " + ", ".join(sorted(vias)))
    print(f"{results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
