#!/usr/bin/env python3
"""textgen-launcher end to end on port 0 with the bundled demo model: start, generate, SIGTERM ->
clean exit with no orphan process; a crashed shard -> non-zero exit naming it; refused flags.
Usage: launcher_test.py LAUNCHER"""
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

LAUNCHER = sys.argv[1]
results = {"passed": 0, "failed": 0}


def check(cond, what):
    results["passed" if cond else "failed"] += 1
    if not cond:
        print("FAIL:", what, flush=True)


def wait_for(what, fn, timeout):
    """Polls fn until it is true; a timeout fails naming what it waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(0.05)
    print(f"timed out after {timeout} s waiting for {what}", flush=True)
    return False


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is not running.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children_of(uds):
    out = subprocess.run(["pgrep", "-f", uds], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def launch(uds):
    p = subprocess.Popen([LAUNCHER, "--port", "0", "--hostname", "127.0.0.1", "--shard-uds-path", uds,
                          "--kv-cache-memory", "64000000", "--log-level", "warn"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("textgen-launcher ready "):
            return p, int(line.rsplit(":", 1)[1])
    raise RuntimeError("launcher did not start: " + p.stderr.read()[-2000:])


def generate(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/generate", body=json.dumps({"inputs": "To open a file", "parameters": {"max_new_tokens": 12}}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, json.loads(r.read())


def main():
    work = tempfile.mkdtemp(prefix="textgen-launcher-test-")
    uds = os.path.join(work, "server")
    p, port = launch(uds)
    status, body = generate(port)
    check(status == 200 and body["generated_text"].startswith(", open the file"), f"demo model answers: {status} {body}")
    kids = [k for k in children_of(uds) if k != p.pid]
    check(len(kids) == 2, f"one shard and one router run: {kids}")
    p.send_signal(signal.SIGTERM)
    code = p.wait(timeout=30)
    check(code == 0, f"SIGTERM: clean exit ({code})")
    check(wait_for("the shard and router to exit", lambda: not any(alive(k) for k in kids), 5),
          "no orphan process after SIGTERM")

    p, port = launch(uds)
    shard = [k for k in children_of(uds) if k != p.pid and "textgen-shard" in open(f"/proc/{k}/cmdline").read()]
    check(len(shard) == 1, "found the shard process")
    os.kill(shard[0], signal.SIGKILL)
    code = p.wait(timeout=30)
    err = p.stderr.read()
    check(code != 0 and "textgen-shard rank 0 exited" in err, f"a crashed shard stops the launcher, named: {code} {err[-300:]}")
    check(wait_for("the router to exit", lambda: children_of(uds) == [], 10), "the router was stopped too")

    for flag, words in ((["--trust-remote-code"], "never runs code"), (["--quantize", "gptq"], "not supported"),
                        (["--num-shard", "2"], "tensor parallelism")):
        r = subprocess.run([LAUNCHER, *flag], capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and words in r.stderr, f"{flag}: {r.returncode} {r.stderr[:200]}")
    # A path that does not exist is not taken for a hub id (hub downloads: hub_test.py).
    r = subprocess.run([LAUNCHER, "--model-id", "/no/such/model"], capture_output=True, text=True, timeout=30)
    check(r.returncode == 1 and "neither a local directory nor a hub id" in r.stderr, f"missing dir: {r.stderr[:200]}")
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
