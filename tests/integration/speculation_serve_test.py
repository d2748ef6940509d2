#!/usr/bin/env python3
"""Speculative decoding and the watermark served by textgen-launcher on the demo model (CPU; `cuda`
on the GPU machine), through the router and gRPC:

- with --speculate 4, greedy /generate, /generate_stream and /v1/completions output, and seeded
  sampling, equal the output of a launcher without it; streams carry one event per token even when
  a step accepts several; /metrics has tgi_request_skipped_tokens with accepted proposals;
- `"watermark": true` biases sampling: 200 sampled tokens give a z-score of at least 4 from
  `textgen-watermark detect`, the same request without it |z| < 2; --watermark-gamma/--delta reach
  the shards (a delta of 0 leaves the text unmarked);
- with --num-shard 2 (Gloo on the CPU), greedy output still equals the plain server's;
- Medusa: --model-id the demo's trained heads (models/demo-medusa, TGI's layout naming ../demo)
  serves the demo model with all 4 heads proposing, its output equal to the plain server's, with
  accepted proposals in tgi_request_skipped_tokens; on two ranks too; --speculate 5 (more than the
  heads) is refused naming the heads;
- bad input: --speculate out of range or not a number, --watermark-gamma outside (0, 1) and a
  negative delta stop the launcher with a message naming the flag; `"watermark": "yes"` is a 422.

Usage: speculation_serve_test.py LAUNCHER WATERMARK_BINARY DEMO_MODEL_DIR [cuda]
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

LAUNCHER, DETECT, DEMO = sys.argv[1:4]
CUDA = len(sys.argv) > 4 and sys.argv[4] == "cuda"
results = {"passed": 0, "failed": 0}

COPY_PROMPT = (".. function:: open(file, mode='r', buffering=-1, encoding=None)\n\n"
               "   Open *file* and return a corresponding :term:`file object`.\n\n"
               ".. function:: open(file, mode='r', buffering=-1, encoding=None)\n\n"
               "   Open *file* and return")
PROMPTS = [COPY_PROMPT, "The Python interpreter", "To open a file"]


def check(cond, what):
    results["passed" if cond else "failed"] += 1
    print(("ok:   " if cond else "FAIL: ") + what, flush=True)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(extra=(), wait=120, model=None):
    cmd = [LAUNCHER, "--model-id", model or DEMO, "--port", str(free_port()), "--hostname", "127.0.0.1",
           "--master-port", str(free_port()), "--shard-uds-path",
           tempfile.mktemp(prefix="tgspec-"), *extra]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    if not CUDA:
        cmd += ["--kv-cache-memory", str(64 << 20)]
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines, url = [], None
    timer = threading.Timer(wait, p.kill)
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


def request(url, method, path, body=None):
    host, port = url.replace("http://", "").rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    c.request(method, path, json.dumps(body) if body is not None else None,
              {"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read().decode()
    if path.endswith("_stream") or (body or {}).get("stream"):
        return r.status, [json.loads(l[5:]) for l in raw.splitlines()
                          if l.startswith("data:") and l[5:].strip() != "[DONE]"]
    if path == "/metrics":
        return r.status, raw
    return r.status, json.loads(raw) if raw else None


def outputs(url):
    """Everything compared between the plain and the speculating server."""
    out = {}
    for i, prompt in enumerate(PROMPTS):
        params = {"max_new_tokens": 60, "details": True, "decoder_input_details": False}
        s, g = request(url, "POST", "/generate", {"inputs": prompt, "parameters": params})
        out[f"generate {i}"] = (s, g and [t["id"] for t in g["details"]["tokens"]],
                                g and g["generated_text"])
        s, events = request(url, "POST", "/generate_stream",
                            {"inputs": prompt, "parameters": {"max_new_tokens": 60}})
        out[f"stream {i}"] = (s, [e["token"]["id"] for e in events],
                              [e["index"] for e in events], events[-1]["generated_text"])
        s, c = request(url, "POST", "/v1/completions",
                       {"model": "tgi", "prompt": prompt, "max_tokens": 40, "seed": 3})
        out[f"completions {i}"] = (s, c and c["choices"][0]["text"])
        sampled = {"max_new_tokens": 50, "do_sample": True, "seed": 11 + i, "temperature": 0.7,
                   "top_k": 40, "details": True}
        s, g = request(url, "POST", "/generate", {"inputs": prompt, "parameters": sampled})
        out[f"sampled {i}"] = (s, g and [t["id"] for t in g["details"]["tokens"]])
    return out


def detect(text, gamma="0.5"):
    r = subprocess.run([DETECT, "detect", "--model-id", DEMO, "--gamma", gamma, "--json"],
                       input=text, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)


def watermark_scores(url, tag):
    body = lambda mark: {"inputs": "The Python interpreter",
                         "parameters": {"max_new_tokens": 200, "do_sample": True, "seed": 5,
                                        "watermark": mark, "details": True}}
    s1, marked = request(url, "POST", "/generate", body(True))
    s2, plain = request(url, "POST", "/generate", body(False))
    check(s1 == 200 and s2 == 200, f"{tag}: watermarked and plain requests answered")
    if s1 != 200 or s2 != 200:
        return None, None
    check(marked["details"]["generated_tokens"] == 200, f"{tag}: 200 watermarked tokens")
    return detect(marked["generated_text"]), detect(plain["generated_text"])


def detector_bad_input():
    """textgen-watermark detect: bad usage exits 2 naming the problem, never a crash."""
    cases = [([], "no command"), (["frobnicate"], "unknown command"),
             (["detect"], "--model-id"), (["detect", "--model-id"], "needs a value"),
             (["detect", "--model-id", DEMO, "--gamma", "1"], "gamma"),
             (["detect", "--model-id", DEMO, "--gamma", "x"], "not a number"),
             (["detect", "--model-id", DEMO, "--vocab-size", "0"], "--vocab-size"),
             (["detect", "--model-id", DEMO, "--bogus", "1"], "unknown flag"),
             (["detect", "--model-id", DEMO, "--text", "a", "--file", "/etc/hostname"], "not both"),
             (["detect", "--model-id", "/nonexistent", "--text", "a"], "config.json"),
             (["detect", "--model-id", DEMO, "--file", "/nonexistent"], "nonexistent")]
    for args, want in cases:
        r = subprocess.run([DETECT, *args], capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and want in r.stderr,
              f"textgen-watermark {' '.join(args)[:60]}: exit 2 naming '{want}'")
    # A multimodal config keeps vocab_size under text_config; one without any is refused.
    cleanup = []
    for config, ok in [({"text_config": {"vocab_size": 4096}}, True), ({"text_config": {}}, False),
                       ({"vocab_size": "many"}, False), ([1, 2], False)]:
        d = tempfile.mkdtemp(prefix="tgwm-")
        cleanup.append(d)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(DEMO, f)) as src, open(os.path.join(d, f), "w") as dst:
                dst.write(src.read())
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f)
        r = subprocess.run([DETECT, "detect", "--model-id", d, "--text", "The Python interpreter"],
                           capture_output=True, text=True, timeout=60)
        check((r.returncode == 0 and "z-score" in r.stdout) if ok
              else (r.returncode == 2 and ("vocab_size" in r.stderr or "JSON object" in r.stderr)),
              f"detector with config {json.dumps(config)}: {'scores' if ok else 'exit 2'}")
    for d in cleanup:
        shutil.rmtree(d, ignore_errors=True)
    r = subprocess.run([DETECT, "detect", "--model-id", DEMO, "--text", ""], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 0 and "tokens scored  0" in r.stdout, "empty text scores nothing")


def main():
    detector_bad_input()
    # Bad flags: the launcher exits non-zero naming the flag.
    for flags, name in [(["--speculate", "-1"], "--speculate"), (["--speculate", "17"], "--speculate"),
                        (["--speculate", "four"], "--speculate"),
                        (["--watermark-gamma", "1.5"], "gamma"),
                        (["--watermark-delta", "-2"], "delta")]:
        p, url, lines = launch(flags, wait=60)
        if url:
            stop(p)
        else:
            p.wait()
        text = "".join(lines)
        check(url is None and p.returncode != 0 and name in text,
              f"{' '.join(flags)} refused naming {name}")

    p, url, lines = launch()
    if not url:
        check(False, "plain launcher ready:\n" + "".join(lines[-20:]))
        return
    try:
        want = outputs(url)
        s, bad = request(url, "POST", "/generate",
                         {"inputs": "x", "parameters": {"watermark": "yes"}})
        check(s == 422 and "watermark" in json.dumps(bad), "watermark: \"yes\" is a 422")
        marked, plain = watermark_scores(url, "gamma 0.5 delta 2")
        check(marked is not None and marked["z_score"] >= 4.0,
              f"watermarked text: z = {marked and marked['z_score']:.2f} >= 4 "
              f"({marked and marked['green_tokens']} green of {marked and marked['tokens_scored']})")
        check(plain is not None and abs(plain["z_score"]) < 2.0,
              f"plain text: |z| = {plain and abs(plain['z_score']):.2f} < 2")
    finally:
        stop(p)

    p, url, lines = launch(["--speculate", "4"])
    if not url:
        check(False, "--speculate 4 launcher ready:\n" + "".join(lines[-20:]))
        return
    try:
        got = outputs(url)
        for key in want:
            check(got[key] == want[key], f"--speculate 4: {key} equals the plain server's")
            if key.startswith("stream"):
                check(got[key][2] == list(range(1, len(got[key][1]) + 1)),
                      f"--speculate 4: {key} has one event per token")
        s, metrics = request(url, "GET", "/metrics")
        count = total = 0.0
        for line in metrics.splitlines():
            if line.startswith("tgi_request_skipped_tokens_count"):
                count = float(line.split()[-1])
            if line.startswith("tgi_request_skipped_tokens_sum"):
                total = float(line.split()[-1])
        check(count > 0 and total > 0,
              f"tgi_request_skipped_tokens: {total:.0f} accepted over {count:.0f} steps")
        check('tgi_request_skipped_tokens_bucket{le="4"}' in metrics,
              "tgi_request_skipped_tokens has TGI's buckets 0..speculate")
        marked, _ = watermark_scores(url, "--speculate 4")
        check(marked is not None and marked["z_score"] >= 4.0,
              f"--speculate 4: watermarked text z = {marked and marked['z_score']:.2f} >= 4")
    finally:
        stop(p)

    # Medusa: the heads' directory as --model-id; every head proposes unless --speculate says fewer.
    medusa = os.path.join(os.path.dirname(os.path.abspath(DEMO)), "demo-medusa")
    p, url, lines = launch(["--speculate", "5"], wait=60, model=medusa)
    if url:
        stop(p)
    else:
        p.wait()
    check(url is None and p.returncode != 0 and "4 heads" in "".join(lines),
          "Medusa with --speculate 5 refused naming its 4 heads")
    p, url, lines = launch(model=medusa)
    if not url:
        check(False, "Medusa launcher ready:\n" + "".join(lines[-20:]))
        return
    try:
        check(any("Medusa heads from" in l and "4 of them" in l for l in lines),
              "Medusa: the shard serves the base model with 4 heads")
        got = outputs(url)
        for key in want:
            check(got[key] == want[key], f"Medusa: {key} equals the plain server's")
        s, metrics = request(url, "GET", "/metrics")
        count = total = 0.0
        for line in metrics.splitlines():
            if line.startswith("tgi_request_skipped_tokens_count"):
                count = float(line.split()[-1])
            if line.startswith("tgi_request_skipped_tokens_sum"):
                total = float(line.split()[-1])
        check(count > 0 and total > 0,
              f"Medusa: tgi_request_skipped_tokens: {total:.0f} accepted over {count:.0f} steps")
    finally:
        stop(p)

    # Tensor parallelism: two ranks propose and verify alike (the same tokens, the same seeds), and
    # give what two ranks give without speculation. On the CPU (Gloo); the GPU machine's single GPU
    # cannot hold two NCCL ranks.
    if not CUDA:
        tp = {}
        for flags, model in ((["--num-shard", "2"], None),
                             (["--num-shard", "2", "--speculate", "4"], None),
                             (["--num-shard", "2"], medusa)):
            p, url, lines = launch(flags, wait=180, model=model)
            if not url:
                check(False, f"{' '.join(flags)} launcher ready:\n" + "".join(lines[-20:]))
                continue
            try:
                for i, prompt in enumerate(PROMPTS[:2]):
                    params = {"max_new_tokens": 60, "details": True}
                    s, g = request(url, "POST", "/generate", {"inputs": prompt, "parameters": params})
                    tp.setdefault(i, []).append(
                        (s, g and [t["id"] for t in g["details"]["tokens"]], g and g["generated_text"]))
            finally:
                stop(p)
        for i, runs in tp.items():
            check(len(runs) == 3 and runs[0] == runs[1] and runs[0][0] == 200,
                  f"--num-shard 2: generate {i} with --speculate 4 equals it without")
            check(len(runs) == 3 and runs[0] == runs[2],
                  f"--num-shard 2: generate {i} with Medusa heads equals it without")

    # The server's gamma and delta reach the shards: delta 0 marks nothing.
    p, url, lines = launch(["--watermark-gamma", "0.25", "--watermark-delta", "0"])
    if not url:
        check(False, "--watermark-delta 0 launcher ready:\n" + "".join(lines[-20:]))
        return
    try:
        marked, _ = watermark_scores(url, "delta 0")
        check(marked is not None and abs(marked["z_score"]) < 3.0,
              f"delta 0: watermark: true leaves no mark (z = {marked and marked['z_score']:.2f})")
    finally:
        stop(p)


if __name__ == "__main__":
    main()
    print(f"{results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)
