#!/usr/bin/env bash
# Medusa heads at TP=2 over NCCL on two GPUs (nvidia-h100-x2), from the repository root with
# .gpu.txz beside it (make gpu-pack with GPU_PACK_BINS="tests/unit/runtime_cuda_test
# textgen-launcher textgen-shard textgen-router"): the Medusa and speculation tests on one GPU, then
# greedy /generate of the demo model served plain on two ranks against the demo's Medusa heads on
# two ranks (each rank projects its vocabulary part; the parts are gathered), which must be equal, with
# accepted proposals in tgi_request_skipped_tokens. Logs to $OUT.
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
tar xJf .gpu.txz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TEXTGEN_MODEL_FIXTURES=$PWD/tests/reference/models \
  TEXTGEN_DEMO_MODEL=$PWD/models/demo PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
rc=0
CUDA_VISIBLE_DEVICES=0 .gpu/bin/runtime_cuda_test --gtest_filter='*Medusa*:Speculation*' 2>&1 |
  tee $OUT/cuda_test.log | grep -E "^\[  (PASSED|FAILED)|Failure|accepted per step" | tail -20 || rc=1
grep -q "FAILED" $OUT/cuda_test.log && rc=1
python3 - "$PWD" <<'PY' 2>&1 | tee $OUT/tp2.log || rc=1
import http.client, json, os, socket, subprocess, sys, tempfile, threading
root = sys.argv[1]
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]
def launch(model, extra):
    cmd = [f"{root}/.gpu/bin/textgen-launcher", "--model-id", model, "--port", str(free_port()),
           "--hostname", "127.0.0.1", "--master-port", str(free_port()), "--shard-uds-path",
           tempfile.mktemp(prefix="tgtp-"), *extra]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(300, p.kill); timer.start()
    url, lines = None, []
    for line in p.stdout:
        lines.append(line)
        if line.startswith("textgen-launcher ready "):
            url = line.split()[2]; break
    timer.cancel()
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    if not url: print("".join(lines[-30:]))
    return p, url
def post(url, path, body=None):
    host, port = url.replace("http://", "").rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    c.request("POST" if body is not None else "GET", path, json.dumps(body) if body is not None else None,
              {"Content-Type": "application/json"})
    r = c.getresponse(); return r.status, r.read().decode()
prompts = [".. function:: open(file, mode='r')\n\n   Open *file*.\n\n.. function:: open(file, mode='r')\n\n   Open",
           "The Python interpreter", "To open a file", "A list comprehension"]
runs = {}
for name, model, extra in (("plain TP=2", f"{root}/models/demo", ["--num-shard", "2"]),
                           ("Medusa TP=2", f"{root}/models/demo-medusa", ["--num-shard", "2"])):
    p, url = launch(model, extra)
    out = []
    if url:
        for pr in prompts:
            s, b = post(url, "/generate", {"inputs": pr, "parameters": {"max_new_tokens": 80, "details": True}})
            out.append((s, [t["id"] for t in json.loads(b)["details"]["tokens"]] if s == 200 else b))
        s, m = post(url, "/metrics")
        skipped = [l for l in m.splitlines() if l.startswith("tgi_request_skipped_tokens_sum") or
                   l.startswith("tgi_request_skipped_tokens_count")]
        print(name, "skipped tokens:", skipped)
    p.terminate(); p.wait(timeout=60)
    runs[name] = out
ok = len(runs["plain TP=2"]) == len(prompts) and runs["plain TP=2"] == runs["Medusa TP=2"]
print("Medusa at TP=2 equals plain TP=2:", "yes" if ok else "NO")
sys.exit(0 if ok else 1)
PY
exit $rc
