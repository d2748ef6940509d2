#!/usr/bin/env python3
"""T5 (encoder-decoder) served by textgen-launcher on the CPU, through the router and gRPC, as TGI
serves seq2seq models: for each T5 fixture (tests/reference/models/t5-*, docs/t5.md) and each prompt
of its reference.json, the router's tokenization equals transformers' (`</s>` appended), and greedy
output equals transformers' 24 tokens on /generate, /generate_stream and /v1/completions; the
prefill details are the decoder's input (the start token `<pad>`, no log-prob); return_full_text
does not prepend the prompt; /info reports the limits from n_positions; a prompt over them is a
422. t5-gated-gelu is also served with --num-shard 2 (Gloo) and must give the same tokens.

Usage: t5_serve_test.py LAUNCHER_BINARY MODELS_DIR [cuda]
With `cuda` (the GPU machine): served on the GPU in bfloat16 (the default for T5), where greedy
tokens must equal the reference-bfloat16.json that tools/reference/make_t5_dtype_references.py
recorded with transformers until a divergence at one of its near-ties; and with --dtype float32,
where they must equal the float32 reference exactly.
Prints "N passed, M failed" and exits non-zero on any failure.
"""
import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading

LAUNCHER, MODELS = sys.argv[1:3]
CUDA = len(sys.argv) > 3 and sys.argv[3] == "cuda"
FIXTURES = ["t5-gated-gelu", "t5-relu-tied", "t5-gated-gelu-tied"]
STEPS = 24
results = {"passed": 0, "failed": 0}


def check(cond, what):
    results["passed" if cond else "failed"] += 1
    print(("ok:   " if cond else "FAIL: ") + what, flush=True)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model, world, extra=()):
    cmd = [LAUNCHER, "--model-id", model, "--num-shard", str(world), "--port", str(free_port()),
           "--hostname", "127.0.0.1", "--master-port", str(free_port()),
           "--shard-uds-path", tempfile.mktemp(prefix="tgt5-"), *extra]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    if not CUDA:
        cmd += ["--kv-cache-memory", str(64 << 20)]
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines, url = [], None
    timer = threading.Timer(120, p.kill)
    timer.start()
    for line in p.stdout:
        lines.append(line)
        if line.startswith("textgen-launcher ready "):
            url = line.split()[2]
            break
    timer.cancel()
    if url:
        threading.Thread(target=lambda: [lines.append(l) for l in p.stdout], daemon=True).start()
    return p, url, lines


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def post(url, path, body):
    host, port = url.replace("http://", "").rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read().decode()
    if path.endswith("_stream") or body.get("stream"):
        return r.status, [json.loads(l[5:]) for l in raw.splitlines()
                          if l.startswith("data:") and l[5:].strip() != "[DONE]"]
    return r.status, json.loads(raw) if raw else None


def get(url, path):
    host, port = url.replace("http://", "").rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, json.loads(r.read())


def agrees(got, want, dref, i, half):
    """float32: equal. bfloat16: equal until a divergence at one of the bf16 reference's near-ties,
    where our token is in its top 5: the rule of runtime_cuda_test's T5 test (docs/gpu.md), a
    top-1/top-2 gap within 16 bf16 ulps of the first step's largest |logit|."""
    if got == want:
        return True
    if not half or len(got) != len(want):
        return False
    k = next(j for j in range(len(got)) if got[j] != want[j])
    p = dref["prompts"][i]
    scale = max(abs(x) for x in p["first_logits"])
    ulp = 2.0 ** (math.floor(math.log2(max(scale, 1e-6))) - 7)
    return p["gaps"][k] <= 16 * ulp and got[k] in p["top5"][k]


def serve_fixture(name, world, float32=False):
    model = os.path.join(MODELS, name)
    ref = json.load(open(os.path.join(model, "reference.json")))
    half = CUDA and not float32
    dref = json.load(open(os.path.join(model, "reference-bfloat16.json"))) if half else ref
    p, url, lines = serve(model, world, ["--dtype", "float32"] if CUDA and float32 else [])
    tag = f"{name} TP={world}" + (" bfloat16" if half else " float32")
    try:
        if not url:
            check(False, f"{tag}: did not start: {''.join(lines)[-2000:]}")
            return None
        status, info = get(url, "/info")
        check(status == 200 and info["max_total_tokens"] == 512 and info["max_input_tokens"] == 511,
              f"{tag}: /info limits from n_positions (512/511): {info.get('max_total_tokens')} "
              f"{info.get('max_input_tokens')}")
        outs = []
        for i, pr in enumerate(ref["prompts"]):
            want = dref["prompts"][i]["greedy"]
            status, toks = post(url, "/tokenize", {"inputs": pr["text"]})
            check(status == 200 and [t["id"] for t in toks] == pr["input_ids"],
                  f"{tag} prompt {i}: /tokenize equals transformers (</s> appended)")
            status, body = post(url, "/generate", {"inputs": pr["text"], "parameters": {
                "max_new_tokens": STEPS, "details": True, "decoder_input_details": True,
                "return_full_text": True}})
            ids = [t["id"] for t in body.get("details", {}).get("tokens", [])] if status == 200 else []
            check(status == 200 and agrees(ids, want, dref, i, half),
                  f"{tag} prompt {i}: /generate greedy equals transformers: {ids} vs {want}")
            if status != 200:
                print(json.dumps(body)[:500])
                continue
            prefill = body["details"].get("prefill")
            check(prefill == [{"id": 0, "text": "<pad>", "logprob": None}],
                  f"{tag} prompt {i}: prefill details are the decoder's start token: {prefill}")
            text = body["generated_text"]
            check(not text.startswith(pr["text"]) or pr["text"] == "",
                  f"{tag} prompt {i}: return_full_text does not prepend the prompt: {text[:60]!r}")
            status, events = post(url, "/generate_stream", {"inputs": pr["text"], "parameters": {
                "max_new_tokens": STEPS}})
            sids = [e["token"]["id"] for e in events]
            check(status == 200 and sids == ids and events[-1].get("generated_text") == text,
                  f"{tag} prompt {i}: /generate_stream gives the same tokens and text")
            status, comp = post(url, "/v1/completions", {"prompt": pr["text"], "max_tokens": STEPS,
                                                          "temperature": 0})
            ctext = comp["choices"][0]["text"] if status == 200 else None
            check(ctext == text, f"{tag} prompt {i}: /v1/completions text equals /generate's")
            outs.append(ids)
        long = " ".join(["house"] * 600)
        status, body = post(url, "/generate", {"inputs": long, "parameters": {"max_new_tokens": 4}})
        check(status == 422 and "error" in body,
              f"{tag}: a prompt over max_input_tokens is a 422: {status} {json.dumps(body)[:200]}")
        return outs
    finally:
        stop(p)


def fp8_refused():
    p, url, lines = serve(os.path.join(MODELS, "t5-relu-tied"), 1,
                          ["--kv-cache-dtype", "fp8_e4m3fn"])
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    out = "".join(lines)
    check(url is None and "fp8 is not supported for encoder-decoder models" in out,
          f"--kv-cache-dtype fp8 refused for T5 at start-up, naming why: {out[-300:]!r}")
    stop(p)


def main():
    fp8_refused()
    for name in FIXTURES:
        serve_fixture(name, 1)
        if CUDA:
            serve_fixture(name, 1, float32=True)
    if not CUDA:
        one = serve_fixture("t5-gated-gelu", 2)
        check(one is not None, "t5-gated-gelu served over 2 ranks")
    print(f"{results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
