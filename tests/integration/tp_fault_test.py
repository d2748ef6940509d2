#!/usr/bin/env python3
"""Faults of a tensor-parallel group (two real CPU shards over Gloo, the real router), each bounded
in time:
  1. a rank killed while idle: the other exits 3 within seconds, naming the lost rank;
  2. rank 0 killed while idle: rank 1 exits 3, naming rank 0;
  3. a rank frozen (SIGSTOP) while a request runs: rank 0 waits in a collective for at most
     --collective-timeout, then exits 3 saying so; the request gets an error answer (no hang);
  4. a rank that joins with another WORLD_SIZE is refused, naming the mismatch;
  5. a rank started unlike rank 0 (another --block-size, another --kv-cache-dtype) is refused naming
     both, and rank 0 stops waiting for it at once.

Usage: tp_fault_test.py ROUTER_BINARY SHARD_BINARY MODEL_DIR
Prints "N passed, M failed" and exits non-zero on any failure.
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROUTER, SHARD, MODEL = sys.argv[1:4]
results = {"passed": 0, "failed": 0}


def check(cond, what):
    results["passed" if cond else "failed"] += 1
    print(("ok:   " if cond else "FAIL: ") + what, flush=True)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rank:
    """One textgen-shard process; stderr collected by a thread."""

    def __init__(self, rank, world, port, uds, timeout_s=3):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        self.p = subprocess.Popen(
            [SHARD, "--model-id", MODEL, "--uds-path", uds, "--device", "cpu", "--threads", "1",
             "--kv-cache-memory", str(64 << 20), "--collective-timeout", str(timeout_s)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.err = []
        self.ready = threading.Event()
        threading.Thread(target=self._read_err, daemon=True).start()
        threading.Thread(target=self._read_out, daemon=True).start()

    def _read_out(self):
        for line in self.p.stdout:
            if line.startswith("textgen-shard ready "):
                self.ready.set()

    def _read_err(self):
        for line in self.p.stderr:
            self.err.append(line)

    def wait_exit(self, seconds):
        try:
            return self.p.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def log(self):
        return "".join(self.err)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGCONT)
            self.p.kill()
            self.p.wait()


def group(world=2, timeout_s=3):
    port = free_port()
    uds = tempfile.mktemp(prefix="tgtp-")
    ranks = [Rank(r, world, port, uds, timeout_s) for r in range(world)]
    for r in ranks:
        if not r.ready.wait(60):
            raise RuntimeError("rank did not start: " + r.log()[-2000:])
    return ranks, uds


def test_lost_rank(victim):
    ranks, _ = group()
    other = ranks[1 - victim]
    start = time.monotonic()
    ranks[victim].p.kill()
    code = other.wait_exit(15)
    took = time.monotonic() - start
    check(code == 3, f"rank {victim} killed: rank {1 - victim} exits 3 (got {code}) in {took:.1f} s")
    check("tensor-parallel group failed" in other.log() and f"rank {victim}" in other.log(),
          f"rank {1 - victim}'s log names the lost rank {victim}: " +
          other.log().strip().splitlines()[-1][:200] if other.log().strip() else "(empty log)")
    for r in ranks:
        r.stop()


def test_frozen_rank_in_a_collective():
    ranks, uds = group(timeout_s=3)
    router = subprocess.Popen(
        [ROUTER, "--tokenizer-name", MODEL, "--master-shard-uds-path", uds + "-0", "--port", "0",
         "--hostname", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    for line in router.stdout:
        if line.startswith("textgen-router ready "):
            url = line.split()[-1]
            break
    threading.Thread(target=lambda: [None for _ in router.stdout], daemon=True).start()
    check(url is not None, "the router serves the two-rank group")
    host, port = url.replace("http://", "").rsplit(":", 1)
    ranks[1].p.send_signal(signal.SIGSTOP)
    answer = {}

    def ask():
        try:
            c = http.client.HTTPConnection(host, int(port), timeout=60)
            c.request("POST", "/generate", json.dumps(
                {"inputs": "Hello", "parameters": {"max_new_tokens": 4}}),
                {"Content-Type": "application/json"})
            r = c.getresponse()
            answer["status"] = r.status
            answer["body"] = r.read().decode(errors="replace")
        except Exception as e:  # noqa: BLE001 - any failure to answer is recorded
            answer["error"] = repr(e)

    start = time.monotonic()
    t = threading.Thread(target=ask)
    t.start()
    code = ranks[0].wait_exit(30)
    took = time.monotonic() - start
    check(code == 3, f"rank 1 frozen: rank 0 exits 3 (got {code}) after {took:.1f} s")
    check(took < 20, f"within the collective timeout (3 s) plus start-up, not later ({took:.1f} s)")
    log = ranks[0].log()
    check("all-reduce failed" in log or "did not finish within" in log or "rank 1" in log,
          "rank 0 says why: " + (log.strip().splitlines()[-1][:200] if log.strip() else "(empty)"))
    t.join(60)
    check(not t.is_alive() and answer.get("status", 0) >= 400 or "error" in answer,
          f"the request gets an error answer, not a hang: {answer}")
    router.kill()
    router.wait()
    for r in ranks:
        r.stop()


def test_world_size_mismatch():
    port = free_port()
    uds = tempfile.mktemp(prefix="tgtp-")
    zero = Rank(0, 2, port, uds)
    env = dict(os.environ, RANK="1", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    odd = subprocess.run([SHARD, "--model-id", MODEL, "--uds-path", uds, "--device", "cpu"],
                         env=env, capture_output=True, text=True, timeout=60)
    check(odd.returncode != 0 and "refused rank 1 of 3" in odd.stderr,
          "a rank with another WORLD_SIZE is refused: " + odd.stderr.strip()[-200:])
    zero.stop()


def test_started_unlike_rank_zero(flags=("--block-size", "32"), words=("block-size=32",)):
    port = free_port()
    uds = tempfile.mktemp(prefix="tgtp-")
    zero = Rank(0, 2, port, uds)
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    odd = subprocess.run([SHARD, "--model-id", MODEL, "--uds-path", uds, "--device", "cpu", *flags],
                         env=env, capture_output=True, text=True, timeout=60)
    check(odd.returncode != 0 and "started unlike rank 0" in odd.stderr and all(w in odd.stderr for w in words),
          f"a rank started with {flags} is refused, naming both: " + odd.stderr.strip()[-300:])
    code = zero.wait_exit(20)
    check(code is not None and code != 0,
          f"rank 0 does not wait out its timeout for the refused rank (exit {code})")
    zero.stop()


def main():
    for test in (lambda: test_lost_rank(1), lambda: test_lost_rank(0),
                 test_frozen_rank_in_a_collective, test_world_size_mismatch,
                 test_started_unlike_rank_zero,
                 lambda: test_started_unlike_rank_zero(
                     ("--kv-cache-dtype", "fp8_e4m3fn"), ("kv-cache-dtype=fp8_e4m3fn", "kv-cache-dtype=auto"))):
        try:
            test()
        except Exception as e:  # noqa: BLE001 - a crashed test is a failure, the rest still run
            check(False, f"{e!r}")
    print(f"{results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
