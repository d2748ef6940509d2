#!/usr/bin/env python3
"""Router overhead with a tiny model: requests/s, latency the router adds per streamed token (p50/p99),
and concurrent SSE streams held without error. Starts a real textgen-shard and textgen-router.
Prints a table and one JSON line; never asserts.

Usage: router_bench.py BUILD_DIR MODEL_DIR [--streams 1000] [--seconds 10] [--concurrency 32]
"""
import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time


def start(cmd, prefix):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith(prefix):
            return p, line[len(prefix):].strip()
    raise RuntimeError(f"{cmd[0]} did not start")


async def http(port, method, path, body=None, stream=False):
    """Minimal HTTP/1.1 client. For streams, returns the arrival time of each SSE event."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode() if body is not None else b""
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    times, buf = [], b""
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            break
        if stream:
            now = time.perf_counter()
            times += [now] * chunk.count(b"data:")
        buf += chunk
    writer.close()
    return status, buf, times


def percentile(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else float("nan")


async def requests_per_second(port, seconds, concurrency):
    done, errors = 0, 0
    end = time.perf_counter() + seconds
    body = {"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 1}}

    async def worker():
        nonlocal done, errors
        while time.perf_counter() < end:
            status, _, _ = await http(port, "POST", "/generate", body)
            done += status == 200
            errors += status != 200
    start_t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - start_t), errors


async def token_latency(port, samples):
    gaps = []
    for _ in range(samples):
        status, _, times = await http(port, "POST", "/generate_stream",
                                      {"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 64}}, stream=True)
        gaps += [b - a for a, b in zip(times, times[1:])]
    return gaps


async def many_streams(port, n):
    body = {"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 20}}
    results = await asyncio.gather(*(http(port, "POST", "/generate_stream", body, stream=True) for _ in range(n)),
                                   return_exceptions=True)
    ok = sum(1 for r in results if not isinstance(r, Exception) and r[0] == 200 and len(r[2]) == 20
             and b'"finish_reason":"length"' in r[1])
    return ok, n - ok


def decode_step_seconds(port):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    s = n = 0.0
    for line in text.splitlines():
        if line.startswith('tgi_batch_inference_duration_sum{method="decode"}'):
            s = float(line.split()[-1])
        if line.startswith('tgi_batch_inference_duration_count{method="decode"}'):
            n = float(line.split()[-1])
    return s / n if n else float("nan"), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("model")
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=32)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="textgen-bench-")
    shard, addr = start([os.path.join(a.build, "textgen-shard"), "--model-id", a.model, "--uds-path", f"{work}/s",
                         "--kv-cache-memory", str(256 << 20), "--threads", "1", "--log-level", "error"], "textgen-shard ready ")
    router, url = start([os.path.join(a.build, "textgen-router"), "--tokenizer-name", a.model, "--shard-master", addr,
                         "--hostname", "127.0.0.1", "--port", "0", "--max-concurrent-requests", str(a.streams + 64),
                         "--max-batch-prefill-tokens", "4096", "--log-level", "error"], "textgen-router ready ")
    port = int(url.rsplit(":", 1)[1])
    try:
        rps, rps_errors = asyncio.run(requests_per_second(port, a.seconds, a.concurrency))
        _, before = decode_step_seconds(port)
        gaps = asyncio.run(token_latency(port, 20))
        step, after = decode_step_seconds(port)
        added = [g - step for g in gaps]
        t0 = time.perf_counter()
        ok, failed = asyncio.run(many_streams(port, a.streams))
        streams_s = time.perf_counter() - t0
    finally:
        router.terminate()
        shard.terminate()
        router.wait()
        shard.wait()
    rows = [
        ("requests/s (max_new_tokens 1, %d clients)" % a.concurrency, f"{rps:.1f}", f"{rps_errors} errors"),
        ("inter-token latency p50 / p99 (ms)", f"{percentile(gaps, 50) * 1e3:.3f} / {percentile(gaps, 99) * 1e3:.3f}",
         f"{len(gaps)} tokens"),
        ("shard decode step, mean (ms)", f"{step * 1e3:.3f}", f"{int(after - before)} steps"),
        ("added by the router p50 / p99 (ms)", f"{percentile(added, 50) * 1e3:.3f} / {percentile(added, 99) * 1e3:.3f}",
         "inter-token minus shard step"),
        (f"concurrent SSE streams ({a.streams} x 20 tokens)", f"{ok} ok, {failed} failed", f"{streams_s:.1f} s"),
    ]
    print(f"textgen-router overhead, tiny model ({os.path.basename(a.model)}), {os.cpu_count()} cores")
    for name, value, note in rows:
        print(f"  {name:<48} {value:>22}   {note}")
    print(json.dumps({"bench": "router", "requests_per_s": rps, "rps_errors": rps_errors,
                      "inter_token_ms": {"p50": percentile(gaps, 50) * 1e3, "p99": percentile(gaps, 99) * 1e3},
                      "shard_step_ms": step * 1e3,
                      "added_ms": {"p50": percentile(added, 50) * 1e3, "p99": percentile(added, 99) * 1e3},
                      "streams": {"requested": a.streams, "ok": ok, "failed": failed, "seconds": streams_s}}))


if __name__ == "__main__":
    sys.exit(main())
