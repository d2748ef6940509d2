#!/usr/bin/env python3
"""textgen-launcher's hub download against a local server with the hub's URL layout:
/api/models/<id>/revision/<rev>?blobs=true, /<id>/resolve/<commit>/<file> answered by a redirect to
a CDN path that honours Range. Checks: a download into the HF cache layout (refs/, snapshots/), an
interrupted transfer resumed with Range, files the shard does not need skipped, a gated model
refused without / with a bad HF_TOKEN (401, named) and served with the right one, an unknown model
and revision (404), a listed file the hub does not serve (404), a corrupted blob (sha256 mismatch, not installed),
revisions that are not git ref names and hub answers with a bad commit id or wrong JSON types refused, a second run with the hub
gone served from the cache, the launcher serving a hub id end to end, and a Medusa directory naming
its base model by hub id served from the cache.
Usage: hub_test.py LAUNCHER MODEL_DIR"""
import hashlib
import http.client
import http.server
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import time

LAUNCHER, MODEL_DIR = sys.argv[1], sys.argv[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_textgen_test_token"
results = {"passed": 0, "failed": 0}


def check(cond, what):
    results["passed" if cond else "failed"] += 1
    if not cond:
        print("FAIL:", what, flush=True)
    return cond


FILES = {n: open(os.path.join(MODEL_DIR, n), "rb").read() for n in sorted(os.listdir(MODEL_DIR))
         if n.endswith(".json") or n.endswith(".safetensors")}
FILES.pop("reference.json", None)
# Repos: public, gated (needs TOKEN), corrupt (the hub's sha256 does not match the blob).
REPOS = {"textgen-test/llama-gqa": {}, "textgen-test/gated": {"gated": True}, "textgen-test/corrupt": {"corrupt": True},
         "textgen-test/missing-file": {"missing": "model.safetensors"},
         # Hostile answers: a commit id that is a path, a commit id and siblings of the wrong JSON type.
         "textgen-test/sha-path": {"sha": "../../../escaped"}, "textgen-test/sha-number": {"sha": 123},
         "textgen-test/sibling-types": {"siblings": [{"rfilename": 5}]},
         "textgen-test/size-type": {"siblings": [{"rfilename": "config.json", "size": "big"}]}}


class Hub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log = []
    cut_once = {"model.safetensors"}  # the first full transfer of these is cut halfway

    def log_message(self, *a):
        pass

    def reply(self, status, body=b"", headers=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def authorized(self, repo):
        if not REPOS[repo].get("gated"):
            return True
        return self.headers.get("Authorization") == "Bearer " + TOKEN

    def do_GET(self):
        path = self.path.split("?")[0]
        Hub.log.append((path, self.headers.get("Range"), self.headers.get("Authorization")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] == "revision":
            repo = parts[2] + "/" + parts[3]
            if repo not in REPOS or urllib.parse.unquote(parts[5]) not in ("main", "refs/pr/1", COMMIT):
                return self.reply(404, b'{"error":"Repository not found"}')
            if not self.authorized(repo):
                return self.reply(401, b'{"error":"Invalid credentials in Authorization header"}')
            siblings = [{"rfilename": "README.md", "size": 10}, {"rfilename": "original/consolidated.00.pth", "size": 99}]
            for name, data in FILES.items():
                s = {"rfilename": name, "size": len(data)}
                if name.endswith(".safetensors"):
                    sha = hashlib.sha256(data).hexdigest()
                    if REPOS[repo].get("corrupt"):
                        sha = "0" * 64
                    s["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 134}
                siblings.append(s)
            siblings = REPOS[repo].get("siblings", siblings)
            body = json.dumps({"id": repo, "sha": REPOS[repo].get("sha", COMMIT), "siblings": siblings}).encode()
            return self.reply(200, body, {"Content-Type": "application/json"})
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, name = parts[0] + "/" + parts[1], "/".join(parts[4:])
            if repo not in REPOS or name not in FILES or REPOS[repo].get("missing") == name:
                return self.reply(404, b"Entry not found")
            if not self.authorized(repo):
                return self.reply(401, b"Unauthorized")
            # Files go to the CDN, another host ("localhost" rather than 127.0.0.1), like the hub's 302
            # to a signed URL: the token must not follow.
            port = self.server.server_address[1]
            return self.reply(302, b"", {"Location": f"http://localhost:{port}/cdn/{name}?X-Signature=abc"})
        if parts[0] == "cdn":
            name = "/".join(parts[1:])
            if self.headers.get("Authorization"):
                return self.reply(400, b"the CDN must not get the hub token")
            data = FILES[name]
            start = 0
            rng = self.headers.get("Range")
            if rng:
                start = int(rng.split("=")[1].split("-")[0])
            if name in Hub.cut_once and start == 0:
                Hub.cut_once.discard(name)
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                # Half the body, then the end of the stream (FIN after the queued bytes). Shutting
                # both directions could end it with a reset that, on a loaded machine, arrived
                # before the client had read the half: nothing to resume (a CI flake).
                self.connection.shutdown(socket.SHUT_WR)
                return
            if rng:
                return self.reply(206, data[start:], {"Content-Range": f"bytes {start}-{len(data)-1}/{len(data)}"})
            return self.reply(200, data)
        self.reply(404, b"no route")


def download(endpoint, cache, model, token=None, revision=None):
    env = dict(os.environ, HF_ENDPOINT=endpoint, HUGGINGFACE_HUB_CACHE=cache)
    env.pop("HF_TOKEN", None)
    if token:
        env["HF_TOKEN"] = token
    cmd = [LAUNCHER, "download-weights", model] + (["--revision", revision] if revision else [])
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def write_safetensors(path, tensors):
    """float32 tensors {name: (shape, values)} in the safetensors layout."""
    header, data = {}, b""
    for name, (shape, values) in tensors.items():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def medusa_from_hub(cache, endpoint):
    """TGI's Medusa directory naming its base model by hub id: the launcher resolves it in the hub
    cache (offline here) and serves it with the heads; a base in no cache is an error naming it."""
    hidden = json.load(open(os.path.join(MODEL_DIR, "config.json")))["hidden_size"]
    medusa = tempfile.mkdtemp(prefix="textgen-hub-medusa-")
    with open(os.path.join(medusa, "config.json"), "w") as f:
        json.dump({"medusa_num_heads": 2, "medusa_num_layers": 1,
                   "base_model_name_or_path": "textgen-test/llama-gqa"}, f)
    tensors = {}
    for i in range(2):  # TGI's MedusaHeadV2 layout: one residual block, the model's head
        tensors[f"{i}.0.linear.weight"] = ([hidden, hidden], [0.0] * (hidden * hidden))
        tensors[f"{i}.0.linear.bias"] = ([hidden], [0.0] * hidden)
    write_safetensors(os.path.join(medusa, "medusa_lm_head.safetensors"), tensors)
    env = dict(os.environ, HF_ENDPOINT=endpoint)
    uds = tempfile.mktemp(prefix="textgen-hub-medusa-uds-")
    p = subprocess.Popen([LAUNCHER, "--model-id", medusa, "--huggingface-hub-cache", cache,
                          "--port", "0", "--hostname", "127.0.0.1", "--shard-uds-path", uds,
                          "--kv-cache-memory", "16000000"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    port, lines = None, []
    for line in p.stdout:
        lines.append(line)
        if line.startswith("textgen-launcher ready "):
            port = int(line.rsplit(":", 1)[1])
            break
    check(port is not None, "Medusa heads on a hub-id base: launcher ready:\n" + "".join(lines[-15:]))
    check(any("Medusa heads from" in l and "2 of them" in l for l in lines),
          "the shard serves the base from the hub cache with the 2 heads")
    if port:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/generate", body=json.dumps({"inputs": "hello", "parameters": {"max_new_tokens": 8}}),
                  headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        body = json.loads(resp.read())
        check(resp.status == 200 and "generated_text" in body, f"Medusa generate: {resp.status} {body}")
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        check(False, "Medusa launcher stops on SIGTERM")
    # A base in no cache, the hub gone: the launcher stops naming it.
    with open(os.path.join(medusa, "config.json"), "w") as f:
        json.dump({"medusa_num_heads": 2, "medusa_num_layers": 1,
                   "base_model_name_or_path": "textgen-test/never-downloaded"}, f)
    r = subprocess.run([LAUNCHER, "--model-id", medusa, "--huggingface-hub-cache", cache, "--port", "0"],
                       capture_output=True, text=True, env=env, timeout=120)
    check(r.returncode != 0 and "textgen-test/never-downloaded" in r.stderr,
          f"a base in no cache: {r.returncode} {r.stderr[-300:]}")


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    cache = tempfile.mkdtemp(prefix="textgen-hub-")

    r = download(endpoint, cache, "textgen-test/llama-gqa")
    check(r.returncode == 0, f"download: {r.returncode} {r.stderr[-800:]}")
    snap = r.stdout.strip()
    repo = os.path.join(cache, "models--textgen-test--llama-gqa")
    check(snap == os.path.join(repo, "snapshots", COMMIT), f"snapshot path {snap}")
    check(open(os.path.join(repo, "refs", "main")).read().strip() == COMMIT, "refs/main holds the commit")
    for name, data in FILES.items():
        p = os.path.join(snap, name)
        check(os.path.exists(p) and open(p, "rb").read() == data, f"{name} downloaded intact")
    check(not os.path.exists(os.path.join(snap, "README.md")) and not os.path.exists(os.path.join(snap, "original")),
          "files the shard does not need are skipped")
    check(not [f for f in os.listdir(snap) if f.endswith(".incomplete")], "no partial files left")
    ranged = [l for l in Hub.log if l[0] == "/cdn/model.safetensors" and l[1]]
    check(len(ranged) == 1 and ranged[0][1].startswith("bytes=") and ranged[0][1] != "bytes=0-",
          f"the cut transfer was resumed with a Range request: {ranged}")
    check("resuming" in r.stderr, "the resume is reported")
    check(all(l[2] is None for l in Hub.log), "no Authorization header sent without HF_TOKEN")

    # Gated: no token, bad token -> 401 named; right token -> downloaded; the CDN never sees it.
    r = download(endpoint, cache, "textgen-test/gated")
    check(r.returncode == 1 and "401" in r.stderr and "HF_TOKEN" in r.stderr, f"gated without token: {r.stderr}")
    r = download(endpoint, cache, "textgen-test/gated", token="hf_wrong")
    check(r.returncode == 1 and "401" in r.stderr and "textgen-test/gated" in r.stderr, f"bad token: {r.stderr}")
    r = download(endpoint, cache, "textgen-test/gated", token=TOKEN)
    check(r.returncode == 0, f"gated with the token: {r.stderr[-500:]}")

    # Not found: model and revision.
    r = download(endpoint, cache, "textgen-test/nope")
    check(r.returncode == 1 and "404" in r.stderr and "textgen-test/nope" in r.stderr, f"unknown model: {r.stderr}")
    r = download(endpoint, cache, "textgen-test/llama-gqa", revision="v9")
    check(r.returncode == 1 and "404" in r.stderr and "v9" in r.stderr, f"unknown revision: {r.stderr}")

    # A file the listing names but the hub does not serve: 404 naming it, the snapshot left incomplete.
    r = download(endpoint, cache, "textgen-test/missing-file")
    check(r.returncode == 1 and "404" in r.stderr and "model.safetensors" in r.stderr, f"missing file: {r.stderr}")
    msnap = os.path.join(cache, "models--textgen-test--missing-file", "snapshots", COMMIT)
    check(not os.path.exists(os.path.join(msnap, ".textgen-complete")), "an incomplete snapshot is not marked complete")

    # A revision with slashes (a pull request) is encoded in the URL and nests under refs/.
    r = download(endpoint, cache, "textgen-test/llama-gqa", revision="refs/pr/1")
    check(r.returncode == 0 and r.stdout.strip() == snap, f"refs/pr/1: {r.stderr[-300:]}")
    check(open(os.path.join(repo, "refs", "refs", "pr", "1")).read().strip() == COMMIT, "refs/refs/pr/1 holds the commit")

    # Corrupt blob: sha256 mismatch, nothing installed.
    r = download(endpoint, cache, "textgen-test/corrupt")
    check(r.returncode == 1 and "sha256" in r.stderr, f"corrupt blob: {r.stderr}")
    csnap = os.path.join(cache, "models--textgen-test--corrupt", "snapshots", COMMIT)
    check(not os.path.exists(os.path.join(csnap, "model.safetensors")), "a corrupt blob is not installed")
    check(not os.path.exists(os.path.join(csnap, ".textgen-complete")), "a corrupt snapshot is not marked complete")

    # A bad hub id is refused before any request.
    r = download(endpoint, cache, "../etc")
    check(r.returncode == 1 and "neither a local directory nor a hub id" in r.stderr, f"bad id: {r.stderr}")

    # A revision becomes a path under refs/: names that are not git ref names are refused before any
    # request, and nothing is written outside the cache.
    before = len(Hub.log)
    for rev in ["../../../escaped", "main/../../escaped", "/etc/passwd", "refs\\pr\\1", "bad\x01rev", "x" * 300,
                "refs//pr", "main.lock", ".hidden", "refs/.x", "a b", "a~1", "a:b", "a@{1}", "main/"]:
        r = download(endpoint, cache, "textgen-test/llama-gqa", revision=rev)
        check(r.returncode == 1 and "is not a valid git ref name" in r.stderr, f"revision {rev!r}: {r.returncode} {r.stderr}")
    check(len(Hub.log) == before, f"bad revisions sent no request: {Hub.log[before:]}")
    check(not os.path.exists(os.path.join(cache, "escaped")) and not os.path.exists(os.path.join(os.path.dirname(cache), "escaped")),
          "a bad revision created nothing outside the cache")
    r = download(endpoint, cache, "textgen-test/llama-gqa", revision=COMMIT)
    check(r.returncode == 0 and r.stdout.strip() == snap, f"a commit id is a valid revision: {r.stderr[-300:]}")

    # The commit id the hub answers becomes snapshots/<commit>: 40 hex digits or an error; wrong JSON
    # types in the answer are errors too, never an abort.
    r = download(endpoint, cache, "textgen-test/sha-path")
    check(r.returncode == 1 and "is not 40 hex digits" in r.stderr, f"commit id a path: {r.returncode} {r.stderr}")
    check(not os.path.exists(os.path.join(cache, "escaped")) and not os.path.exists(os.path.join(os.path.dirname(cache), "escaped")),
          "a bad commit id created nothing outside the cache")
    r = download(endpoint, cache, "textgen-test/sha-number")
    check(r.returncode == 1 and "is not 40 hex digits" in r.stderr, f"commit id a number: {r.returncode} {r.stderr}")
    r = download(endpoint, cache, "textgen-test/sibling-types")
    check(r.returncode == 1 and "rfilename" in r.stderr, f"rfilename a number: {r.returncode} {r.stderr}")
    r = download(endpoint, cache, "textgen-test/size-type")
    check(r.returncode == 1 and "'size' is not a byte count" in r.stderr, f"size a string: {r.returncode} {r.stderr}")

    # A cache the launcher cannot write (here a file where its folder should be): an error naming
    # it, not an abort from an escaping filesystem exception.
    blocked = tempfile.mktemp(prefix="textgen-hub-blocked-")
    open(blocked, "w").close()
    r = download(endpoint, os.path.join(blocked, "hub"), "textgen-test/llama-gqa")
    check(r.returncode == 1 and "hub cache" in r.stderr, f"unwritable cache: {r.returncode} {r.stderr[-300:]}")
    os.unlink(blocked)

    # The hub goes away: the cache serves, by branch and by commit.
    server.shutdown()
    server.server_close()
    dead = endpoint
    r = download(dead, cache, "textgen-test/llama-gqa")
    check(r.returncode == 0 and r.stdout.strip() == snap, f"offline from cache: {r.stderr[-500:]}")
    r = download(dead, cache, "textgen-test/never-downloaded")
    check(r.returncode == 1 and "127.0.0.1" in r.stderr, f"offline, not cached: names the endpoint: {r.stderr}")

    # The launcher serves the hub id from the cache (hub offline), --huggingface-hub-cache honoured.
    env = dict(os.environ, HF_ENDPOINT=dead)
    uds = tempfile.mktemp(prefix="textgen-hub-uds-")
    p = subprocess.Popen([LAUNCHER, "--model-id", "textgen-test/llama-gqa", "--huggingface-hub-cache", cache,
                          "--port", "0", "--hostname", "127.0.0.1", "--shard-uds-path", uds,
                          "--kv-cache-memory", "16000000", "--log-level", "warn"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    port = None
    for line in p.stdout:
        if line.startswith("textgen-launcher ready "):
            port = int(line.rsplit(":", 1)[1])
            break
    check(port is not None, "launcher started from the hub cache")
    if port:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/generate", body=json.dumps({"inputs": "hello", "parameters": {"max_new_tokens": 4}}),
                  headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        body = json.loads(resp.read())
        check(resp.status == 200 and "generated_text" in body, f"generate: {resp.status} {body}")
        c.request("GET", "/info")
        info = json.loads(c.getresponse().read())
        check(info.get("model_id") == "textgen-test/llama-gqa", f"/info names the hub id: {info.get('model_id')}")
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        check(False, "launcher stops on SIGTERM")

    medusa_from_hub(cache, dead)

    print(f"hub_test: {results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
