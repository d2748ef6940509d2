#!/usr/bin/env bash
# The launcher serving the bundled demo model (bfloat16) on one GPU and on two (--num-shard 2: two
# shard processes, NCCL, the one-shot all-reduce over CUDA IPC, the Lamport protocol for its 16-bit
# messages), from the repository root with .gpu.txz beside it (GPU_PACK_BINS="textgen-launcher
# textgen-shard textgen-router"). Greedy /generate of a few prompts on each, and on two GPUs again
# with TEXTGEN_ALL_REDUCE_PROTOCOL=flags. Both protocols sum in rank order in float, so the two
# TP=2 runs must give the same tokens exactly (the check). TP=2 sums in another order than TP=1, so
# bfloat16 tokens may part from one GPU's after a while: the report prints how many are equal.
# Logs to $OUT.
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
[ -d .gpu/bin ] || tar xJf .gpu.txz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 - "$PWD" "$OUT" <<'PY'
import http.client, json, socket, subprocess, sys, tempfile, threading
root, out = sys.argv[1:3]
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]
def launch(extra, log, env=None):
    cmd = [f"{root}/.gpu/bin/textgen-launcher", "--model-id", f"{root}/models/demo", "--port",
           str(free_port()), "--hostname", "127.0.0.1", "--master-port", str(free_port()),
           "--shard-uds-path", tempfile.mktemp(prefix="tgtp-"), *extra]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    timer = threading.Timer(300, p.kill); timer.start()
    url, lines = None, []
    for line in p.stdout:
        lines.append(line); log.write(line)
        if line.startswith("textgen-launcher ready "):
            url = line.split()[2]; break
    timer.cancel()
    threading.Thread(target=lambda: [log.write(l) for l in p.stdout], daemon=True).start()
    if not url: print("".join(lines[-30:]))
    return p, url
def post(url, path, body):
    host, port = url.replace("http://", "").rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse(); return r.status, r.read().decode()
prompts = ["The Python interpreter", "To open a file", "A list comprehension",
           ".. function:: open(file, mode='r')\n\n   Open", "Exceptions are raised when"]
runs = {}
import os
flags = dict(os.environ, TEXTGEN_ALL_REDUCE_PROTOCOL="flags")
for name, extra, env in (("TP=1", [], None), ("TP=2", ["--num-shard", "2"], None),
                         ("TP=2 flags", ["--num-shard", "2"], flags)):
    with open(f"{out}/{name.replace('=', '').replace(' ', '-')}.log", "w") as log:
        p, url = launch(extra, log, env)
        res = []
        if url:
            for pr in prompts:
                s, b = post(url, "/generate", {"inputs": pr, "parameters": {"max_new_tokens": 64, "details": True}})
                if s != 200: print(name, repr(pr), s, b[:300])
                res.append([t["id"] for t in json.loads(b)["details"]["tokens"]] if s == 200 else None)
        p.terminate(); p.wait(timeout=60)
    runs[name] = res
    print(name, "served:", bool(url))
ok = all(len(runs[n]) == len(prompts) for n in runs)
for i, pr in enumerate(prompts):
    a, b, c = ((runs[n][i] if ok else None) for n in ("TP=1", "TP=2", "TP=2 flags"))
    if a is None or b is None or c is None:
        ok = False; print(repr(pr), "failed"); continue
    same = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print(f"{pr[:30]!r}: TP=2 Lamport {'equals' if b == c else 'DIFFERS FROM'} TP=2 flags; "
          f"{same} of {len(a)} tokens equal to TP=1's")
    ok &= b == c
print("TP=2's two all-reduce protocols serve the same tokens:", "yes" if ok else "NO")
sys.exit(0 if ok else 1)
PY
rc=$?
grep -h "all-reduce through" "$OUT"/TP2.log | head -2
exit $rc
