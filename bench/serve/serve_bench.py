#!/usr/bin/env python3
"""The figures of the field's `vllm bench serve` over textgen's real serving path (TGI's /generate_stream).

Starts textgen-launcher (flags after `--` pass through to it) or targets a running server (`--url`), sends
`--num-prompts` requests with Poisson (`--arrival poisson --rate R`) or burst (`--arrival burst`: all at
once) arrivals, and measures per request TTFT, TPOT = (e2e - TTFT) / (tokens - 1), every inter-token
gap (ITL) and e2e latency; prints p50/p99/mean of each, request and token throughput and failures as a
table, then one JSON line. Never asserts; bad arguments exit 2 naming the problem.

Usage:
  serve_bench.py [--launcher build/textgen-launcher | --url http://HOST:PORT]
                 [--arrival poisson|burst] [--rate R] [--num-prompts N] [--max-concurrency C]
                 [--dataset fixed|sharegpt-like|shared-prefix] [--input-len I] [--output-len O]
                 [--prefix-len P] [--seed S] [-- LAUNCHER FLAGS...]

Prompts are random English words cut to tokenize to exactly the requested length with the served
model's tokenizer (the router's /tokenize, special tokens included: the count the shard prefills),
and each stream's final event's `details.input_length` is checked against it. textgen's HTTP API has
no way to ignore EOS, so a request may stop before `max_new_tokens`: the figures use the real token
counts, and the number of early stops is reported. bench/README.md describes the datasets.
"""
import argparse
import asyncio
import json
import math
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

WORDS = (
    "the of and to in is that for it as with was on be by this are or from at an which but not have "
    "one all were can there been if more when will would who so no time out up about into than them "
    "only other new some could these two may first then do any like my now over such our man me even "
    "most made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last might us great "
    "old year off come since against go came right used take three file list value string object class "
    "function module return number error system data line name type call write read open close path "
    "example method default result option program memory thread process server request token model"
).split()


def fail(msg):
    print(f"serve_bench.py: {msg}", file=sys.stderr)
    sys.exit(2)


# --- HTTP -----------------------------------------------------------------------------------------

async def http_json(host, port, method, path, body=None, timeout=60):
    """One request; returns (status, parsed JSON body or text)."""
    async def go():
        reader, writer = await asyncio.open_connection(host, port)
        data = json.dumps(body).encode() if body is not None else b""
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        await writer.drain()
        status, headers = await read_head(reader)
        raw = b""
        async for piece in body_pieces(reader, headers):
            raw += piece
        writer.close()
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text
    return await asyncio.wait_for(go(), timeout)


async def read_head(reader):
    status = int((await reader.readline()).split()[1])
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return status, headers
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()


async def body_pieces(reader, headers):
    """The body as it arrives, chunked transfer encoding removed."""
    if headers.get("transfer-encoding", "").lower() != "chunked":
        while True:
            piece = await reader.read(65536)
            if not piece:
                return
            yield piece
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return
        yield await reader.readexactly(size)
        await reader.readexactly(2)


class Result:
    def __init__(self, input_len, max_new):
        self.input_len, self.max_new = input_len, max_new
        self.ok, self.error = False, None
        self.ttft = self.e2e = None
        self.itl = []
        self.tokens = 0
        self.finish_reason = None
        self.served_input_len = None


async def stream_request(host, port, prompt, input_len, max_new, timeout):
    """One /generate_stream request; each SSE event's arrival time is taken as it is parsed."""
    r = Result(input_len, max_new)
    body = json.dumps({"inputs": prompt, "parameters": {"max_new_tokens": max_new, "details": True}}).encode()
    start = time.perf_counter()
    last = None
    try:
        async def go():
            nonlocal last
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"POST /generate_stream HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
            status, headers = await read_head(reader)
            buf = b""
            async for piece in body_pieces(reader, headers):
                now = time.perf_counter()
                buf = (buf + piece).replace(b"\r\n", b"\n")  # SSE allows CRLF line ends
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    data = b"".join(l[5:] for l in event.split(b"\n") if l.startswith(b"data:"))
                    if not data:
                        continue
                    if status != 200:
                        raise RuntimeError(f"HTTP {status}: {data[:200].decode('utf-8', 'replace')}")
                    ev = json.loads(data)
                    if "error" in ev:
                        raise RuntimeError(f"stream error: {ev['error']}")
                    if r.tokens == 0:
                        r.ttft = now - start
                    else:
                        r.itl.append(now - last)
                    last = now
                    r.tokens += 1
                    if ev.get("details"):
                        r.finish_reason = ev["details"].get("finish_reason")
                        r.served_input_len = ev["details"].get("input_length")
            writer.close()
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {buf[:200].decode('utf-8', 'replace')}")
            if r.finish_reason is None:
                raise RuntimeError(f"stream ended after {r.tokens} tokens without a final event")
        await asyncio.wait_for(go(), timeout)
        r.e2e = last - start
        r.ok = True
    except Exception as e:  # a failed request is counted and reported, never fatal to the run
        r.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return r


# --- workloads ------------------------------------------------------------------------------------

def lognormal_lengths(rng, n, median, sigma, lo, hi):
    return [max(lo, min(hi, int(round(rng.lognormvariate(math.log(median), sigma))))) for _ in range(n)]


def plan_lengths(a, rng, max_input, max_total):
    """(input_len, output_len) per request, and how many sharegpt-like draws were clipped to the server."""
    if a.dataset == "sharegpt-like":
        ins = lognormal_lengths(rng, a.num_prompts, 160, 1.0, 4, 2048)
        outs = lognormal_lengths(rng, a.num_prompts, 180, 0.9, 4, 2048)
        plan, clipped = [], 0
        for i, o in zip(ins, outs):
            i2 = min(i, max_input, max_total - 4)
            o2 = min(o, max_total - i2)
            clipped += (i2, o2) != (i, o)
            plan.append((i2, o2))
        return plan, clipped
    total_in = a.input_len + (a.prefix_len if a.dataset == "shared-prefix" else 0)
    if total_in > max_input:
        fail(f"prompt of {total_in} tokens exceeds the server's max_input_tokens {max_input}")
    if total_in + a.output_len > max_total:
        fail(f"{total_in} input + {a.output_len} output tokens exceed the server's max_total_tokens {max_total}")
    return [(total_in, a.output_len)] * a.num_prompts, 0


class Prompter:
    """Random words cut to an exact token count, checked with the router's /tokenize."""

    def __init__(self, host, port):
        self.host, self.port = host, port

    async def tokenize(self, text):
        """The tokens of `text`, or None when it is over the server's input limit."""
        for attempt in range(200):  # /tokenize shares --max-concurrent-requests: wait out 429s
            status, toks = await http_json(self.host, self.port, "POST", "/tokenize", {"inputs": text})
            if status != 429:
                break
            await asyncio.sleep(0.05)
        if status == 422 and "must have less than" in str(toks):
            return None
        if status != 200 or not isinstance(toks, list):
            raise RuntimeError(f"/tokenize answered {status}: {str(toks)[:200]}")
        return toks

    async def exact(self, rng, n, head=""):
        """Text of exactly n tokens that starts with `head` (whose tokens it keeps), and its token ids less
        those a template appends at the end (EOS), which a longer text that starts with it has later."""
        words, per_word = [], 2.0  # tokens per word: measured as the text grows
        base = len(await self.tokenize(head)) if head else 0
        for _ in range(60):
            text = (head + " " if head else "") + " ".join(words)
            toks = await self.tokenize(text) if words or head else []
            if toks is None:  # over the server's input limit: take back a quarter of the words
                words = words[:len(words) * 3 // 4]
                continue
            if words:
                per_word = max(1.0, (len(toks) - base) / len(words))
            if len(toks) < n:  # too short: about the words the missing tokens need, a little under
                words += [rng.choice(WORDS) for _ in range(max(1, int((n - len(toks)) / per_word * 0.9)))]
                continue
            # After token n, less the special tokens a template appends (EOS: empty offsets at 0), which
            # the cut text gets again; a cut can retokenize differently: check.
            trailing = 0
            while trailing < len(toks) and toks[-1 - trailing]["start"] == toks[-1 - trailing]["stop"] == 0:
                trailing += 1
            if n - trailing < 1:
                raise RuntimeError(f"a prompt of {n} tokens is shorter than the template's own tokens")
            cut = text[:toks[n - 1 - trailing]["stop"]]
            toks = await self.tokenize(cut)
            if toks is not None and len(toks) == n:
                return cut, [t["id"] for t in toks[:n - trailing]]  # without the appended ones
            words.pop()  # retry from one word fewer
        raise RuntimeError(f"could not build a prompt of exactly {n} tokens")

    async def build(self, a, rng, plan):
        if a.dataset == "shared-prefix":
            prefix, prefix_ids = await self.exact(rng, a.prefix_len)
            # What a template appends (EOS) ends the prefix's own text but not the prompts that go
            # on after it: a prefix text of P tokens shares only P less those. Built longer by as
            # many, P tokens are the prompts' common start, as --prefix-len promises.
            appended = a.prefix_len - len(prefix_ids)
            if appended > 0:
                prefix, prefix_ids = await self.exact(rng, a.prefix_len + appended)
            if len(prefix_ids) != a.prefix_len:
                raise RuntimeError(f"could not build a shared prefix of exactly {a.prefix_len} tokens")
            prompts = []
            for total, _ in plan:
                text, ids = await self.exact(rng, total, prefix)
                if ids[:len(prefix_ids)] != prefix_ids:
                    raise RuntimeError("a suffix changed the shared prefix's tokens")
                prompts.append(text)
            return prompts
        # Independent prompts: one private generator each, so the texts do not depend on timing.
        seeds = [rng.getrandbits(64) for _ in plan]
        sem = asyncio.Semaphore(16)

        async def one(seed, n):
            async with sem:
                return (await self.exact(random.Random(seed), n))[0]
        out = await asyncio.gather(*(one(s, n) for s, (n, _) in zip(seeds, plan)), return_exceptions=True)
        for o in out:
            if isinstance(o, Exception):
                raise o
        return out


# --- the run --------------------------------------------------------------------------------------

STEP_HISTOGRAMS = (
    ("forward", "tgi_batch_forward_duration"),      # the shard's forward pass
    ("shard_total", "tgi_batch_inference_duration"),  # the shard's whole call (forward, sampling, text)
    ("router_work", "textgen_batch_router_duration"),  # the batching thread's planning + bookkeeping
    ("delivery", "textgen_batch_delivery_duration"),  # the delivery thread: SSE events to the clients
    ("host_gap", "textgen_batch_host_duration"),     # router time between a step's answer and the next call
    ("transport", "textgen_batch_transport_duration"),  # a call beyond the shard's total and its queueing
)


def metric_sums(host, port):
    """The router's per-step histograms (sum, count) per method (STEP_HISTOGRAMS) and its prefix-cache
    counters (textgen_prefix_cache_{hit,queried}_tokens_total)."""
    import http.client
    out = {}
    try:
        c = http.client.HTTPConnection(host, port, timeout=10)
        c.request("GET", "/metrics")
        for line in c.getresponse().read().decode().splitlines():
            for key, name in STEP_HISTOGRAMS:
                for m in ("decode", "prefill"):
                    for kind in ("sum", "count"):
                        if line.startswith(f'{name}_{kind}{{method="{m}"}}'):
                            out[(key, m, kind)] = float(line.split()[-1])
            for kind in ("hit", "queried"):
                if line.startswith(f"textgen_prefix_cache_{kind}_tokens_total "):
                    out[("prefix", kind)] = float(line.split()[-1])
    except OSError:
        pass
    return out


def settled_sums(host, port, wait_s=2.0):
    """metric_sums once the last step is counted everywhere. The router counts a step's forward pass
    before its tokens go out, but the delivery thread counts the delivery after its sinks ran and
    the batching thread its own work after handing the tokens over: the client that got the last
    token may scrape before either. Every decode pass the router absorbs is followed by one count
    of its work and at least one delivery (more when a client left mid-step), so wait until those
    reach the passes (at most wait_s). Prefill counts need not meet (a prompt chunk short of its
    prompt's end delivers nothing)."""
    deadline = time.perf_counter() + wait_s
    while True:
        out = metric_sums(host, port)
        passes = out.get(("forward", "decode", "count"), 0)
        if ((out.get(("delivery", "decode", "count"), 0) >= passes
             and out.get(("router_work", "decode", "count"), 0) >= passes)
                or time.perf_counter() >= deadline):
            return out
        time.sleep(0.02)


async def run(a, host, port, prompts, plan, rng):
    gaps = ([0.0] * len(plan) if a.arrival == "burst" else [rng.expovariate(a.rate) for _ in plan])
    sem = asyncio.Semaphore(a.max_concurrency) if a.max_concurrency else None

    async def one(prompt, inp, out):
        if sem:
            async with sem:
                return await stream_request(host, port, prompt, inp, out, a.request_timeout)
        return await stream_request(host, port, prompt, inp, out, a.request_timeout)
    tasks = []
    t0 = time.perf_counter()
    for gap, prompt, (inp, out) in zip(gaps, prompts, plan):
        if gap:
            await asyncio.sleep(gap)
        tasks.append(asyncio.ensure_future(one(prompt, inp, out)))
    results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - t0


def pct(v, p):
    """Linear-interpolated percentile (numpy's default, as vllm bench serve reports)."""
    if not v:
        return None
    v = sorted(v)
    k = (len(v) - 1) * p / 100
    f = math.floor(k)
    c = min(f + 1, len(v) - 1)
    return v[f] + (v[c] - v[f]) * (k - f)


def stats_ms(v):
    return {"mean": sum(v) / len(v) * 1e3 if v else None, "p50": ms(pct(v, 50)), "p99": ms(pct(v, 99)),
            "n": len(v)}


def ms(x):
    return None if x is None else x * 1e3


def summarize(a, results, duration, clipped, forward):
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.tokens for r in ok)
    in_tokens = sum(r.input_len for r in ok)
    errors = {}
    for r in results:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    return {
        "bench": "serve",
        "arrival": a.arrival, "rate": a.rate if a.arrival == "poisson" else None,
        "max_concurrency": a.max_concurrency, "dataset": a.dataset, "seed": a.seed,
        "input_len": a.input_len if a.dataset != "sharegpt-like" else None,
        "output_len": a.output_len if a.dataset != "sharegpt-like" else None,
        "prefix_len": a.prefix_len if a.dataset == "shared-prefix" else None,
        "num_prompts": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "errors": errors, "clipped_to_server_limits": clipped,
        "stopped_early": sum(1 for r in ok if r.tokens < r.max_new),
        "input_len_mismatch": sum(1 for r in ok if r.served_input_len not in (None, r.input_len)),
        "duration_s": duration,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "ttft_ms": stats_ms([r.ttft for r in ok]),
        "tpot_ms": stats_ms([(r.e2e - r.ttft) / (r.tokens - 1) for r in ok if r.tokens > 1]),
        "itl_ms": stats_ms([g for r in ok for g in r.itl]),
        "e2e_ms": stats_ms([r.e2e for r in ok]),
        "shard_forward_ms": forward,
        # The shared-prefix figure: the first request computes the prefix, the later ones can reuse it.
        "ttft_first_ms": ms(results[0].ttft) if results and results[0].ok else None,
        "ttft_later_ms": stats_ms([r.ttft for r in results[1:] if r.ok]),
    }


def print_table(s, label):
    print(f"textgen serve benchmark: {label}")
    rows = [
        ("requests (completed / failed)", f"{s['completed']} / {s['failed']}"),
        ("duration (s)", f"{s['duration_s']:.2f}"),
        ("input / output tokens", f"{s['total_input_tokens']} / {s['total_output_tokens']}"),
        ("stopped before max_new_tokens", f"{s['stopped_early']}"),
        ("request throughput (req/s)", f"{s['request_throughput']:.2f}"),
        ("output token throughput (tok/s)", f"{s['output_throughput']:.1f}"),
        ("total token throughput (tok/s)", f"{s['total_token_throughput']:.1f}"),
    ]
    for name, value in rows:
        print(f"  {name:<34} {value:>16}")
    print(f"  {'(ms)':<18} {'mean':>10} {'p50':>10} {'p99':>10} {'samples':>8}")
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        st = s[key]
        f = (lambda x: "-" if x is None else f"{x:.2f}")
        print(f"  {name:<18} {f(st['mean']):>10} {f(st['p50']):>10} {f(st['p99']):>10} {st['n']:>8}")
    for m, v in (s["shard_forward_ms"] or {}).items():
        print(f"  shard forward, {m} (mean over {v['steps']} steps, ms): {v['mean']:.2f}")
    decode = {k: v["decode"] for k, v in (s.get("step_ms") or {}).items() if "decode" in v}
    if decode:
        parts = ", ".join(f"{k} {v['mean']:.3f} (x{v['steps']})" for k, v in decode.items())
        print(f"  per decode step, mean ms: {parts}")
    if s["ttft_first_ms"] is not None and s["ttft_later_ms"]["n"]:
        print(f"  TTFT of the first request / p50 of the later ones (ms): {s['ttft_first_ms']:.2f} / "
              f"{s['ttft_later_ms']['p50']:.2f}")
    if s.get("prefix_cache_hit_rate") is not None:
        print(f"  prompt tokens served from the prefix cache: {100 * s['prefix_cache_hit_rate']:.1f}%")
    for err, n in s["errors"].items():
        print(f"  failed x{n}: {err}")


# --- the launcher ---------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launcher:
    """textgen-launcher on a free port with a private socket; stopped with SIGTERM (RAII via `with`)."""

    def __init__(self, binary, flags, timeout):
        self.work = tempfile.mkdtemp(prefix="textgen-serve-bench-")
        self.log_path = os.path.join(self.work, "launcher.log")
        self.log = open(self.log_path, "w")
        argv = [binary, "--hostname", "127.0.0.1", "--port", "0", "--shard-uds-path",
                os.path.join(self.work, "shard"), "--master-port", str(free_port())] + flags
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     start_new_session=True)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in self.proc.stdout] + [lines.put(None)],
                         daemon=True).start()
        deadline = time.monotonic() + timeout
        self.url = None
        while self.url is None:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None or time.monotonic() > deadline:
                why = "exited" if line is None else f"was not ready within {timeout:.0f} s"
                self.log.flush()
                tail = open(self.log_path).read().splitlines()[-15:]
                self.stop()
                fail(f"textgen-launcher {why} (waiting for its 'textgen-launcher ready' line); its log:\n  "
                     + "\n  ".join(tail))
            if line and line.startswith("textgen-launcher ready "):
                self.url = line.split()[-1]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# --- main -----------------------------------------------------------------------------------------

def parse_args(argv):
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    else:
        passthrough = []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Flags after `--` go to textgen-launcher (e.g. -- --model-id DIR "
                                        "--num-shard 2 --quantize eetq --max-batch-prefill-tokens 8192).")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--launcher", help="textgen-launcher binary to start (default: build/textgen-launcher)")
    where.add_argument("--url", help="a running server (http://HOST:PORT) instead of starting one")
    ap.add_argument("--arrival", choices=["poisson", "burst"], default="burst",
                    help="burst (default, vllm's --request-rate inf): every request at once")
    ap.add_argument("--rate", type=float, help="requests per second for --arrival poisson (required there)")
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--max-concurrency", type=int, default=0, help="requests in flight at most (0: no limit)")
    ap.add_argument("--dataset", choices=["fixed", "sharegpt-like", "shared-prefix"], default="fixed")
    ap.add_argument("--input-len", type=int,
                    help="prompt tokens (fixed), or the unique suffix's tokens (shared-prefix); default 128")
    ap.add_argument("--output-len", type=int, help="max_new_tokens of each request; default 128")
    ap.add_argument("--prefix-len", type=int, help="tokens of the common prefix (shared-prefix; required there)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--startup-timeout", type=float, default=600)
    ap.add_argument("--request-timeout", type=float, default=600, help="seconds one request may take")
    a = ap.parse_args(argv)
    a.passthrough = passthrough
    if a.num_prompts < 1:
        fail("--num-prompts must be at least 1")
    if a.max_concurrency < 0:
        fail("--max-concurrency must be 0 (no limit) or more")
    if a.arrival == "poisson":
        if a.rate is None:
            fail("--arrival poisson needs --rate (requests per second)")
        if not (a.rate > 0 and math.isfinite(a.rate)):
            fail(f"--rate must be a positive finite number (burst arrivals: --arrival burst); got {a.rate}")
    elif a.rate is not None:
        fail("--rate applies to --arrival poisson only")
    if a.dataset == "shared-prefix":
        if a.prefix_len is None or a.prefix_len < 2:
            fail("--dataset shared-prefix needs --prefix-len of at least 2 tokens")
    elif a.prefix_len is not None:
        fail("--prefix-len applies to --dataset shared-prefix only")
    if a.dataset == "sharegpt-like":
        if a.input_len is not None or a.output_len is not None:
            fail("--dataset sharegpt-like draws its own lengths: drop --input-len/--output-len")
    else:
        a.input_len = 128 if a.input_len is None else a.input_len
        a.output_len = 128 if a.output_len is None else a.output_len
    if a.dataset != "sharegpt-like" and a.input_len < 1:
        fail("--input-len must be at least 1")
    if a.dataset != "sharegpt-like" and a.output_len < 1:
        fail("--output-len must be at least 1")
    if a.url and passthrough:
        fail("flags after `--` go to a launcher this run would start; with --url there is none")
    if a.url:
        u = urllib.parse.urlparse(a.url)
        if u.scheme != "http" or not u.hostname or not u.port:
            fail(f"--url must look like http://HOST:PORT; got {a.url!r}")
    return a


def main(argv):
    a = parse_args(argv)
    launcher = None
    if a.url:
        url = a.url
    else:
        binary = a.launcher or "build/textgen-launcher"
        if not os.access(binary, os.X_OK):
            fail(f"{binary}: no such executable (build it, or pass --launcher PATH or --url)")
        launcher = Launcher(binary, a.passthrough, a.startup_timeout)
        url = launcher.url
    try:
        u = urllib.parse.urlparse(url)
        host, port = u.hostname, u.port
        try:
            status, info = asyncio.run(http_json(host, port, "GET", "/info"))
        except (OSError, asyncio.TimeoutError) as e:
            fail(f"{url}/info: {type(e).__name__}: {e}")
        if status != 200 or not isinstance(info, dict):
            fail(f"{url}/info answered {status}: not a TGI-compatible server?")
        rng = random.Random(a.seed)
        plan, clipped = plan_lengths(a, rng, info["max_input_tokens"], info["max_total_tokens"])
        t = time.perf_counter()
        try:
            prompts = asyncio.run(Prompter(host, port).build(a, rng, plan))
        except RuntimeError as e:
            fail(str(e))
        prep = time.perf_counter() - t
        before = metric_sums(host, port)
        results, duration = asyncio.run(run(a, host, port, prompts, plan, rng))
        after = settled_sums(host, port)
    finally:
        if launcher:
            launcher.stop()
    steps = {}  # key -> method -> mean ms and count over this run
    for key, _ in STEP_HISTOGRAMS:
        for m in ("decode", "prefill"):
            n = after.get((key, m, "count"), 0) - before.get((key, m, "count"), 0)
            if n > 0:
                total = after[(key, m, "sum")] - before.get((key, m, "sum"), 0)
                steps.setdefault(key, {})[m] = {"mean": total / n * 1e3, "steps": int(n)}
    s = summarize(a, results, duration, clipped, steps.get("forward", {}))
    s["step_ms"] = steps
    queried = after.get(("prefix", "queried"), 0) - before.get(("prefix", "queried"), 0)
    s["prefix_cache_hit_rate"] = ((after.get(("prefix", "hit"), 0) - before.get(("prefix", "hit"), 0)) / queried
                                  if queried > 0 else None)
    s["model_id"] = info.get("model_id")
    s["prompt_build_s"] = prep
    workload = (f"{a.dataset}" + (f" {a.input_len} in / {a.output_len} out" if a.dataset == "fixed" else "")
                + (f" prefix {a.prefix_len} + {a.input_len} in / {a.output_len} out"
                   if a.dataset == "shared-prefix" else ""))
    arrival = "burst" if a.arrival == "burst" else f"Poisson {a.rate:g} req/s"
    print_table(s, f"{info.get('model_id')}, {arrival}, {a.num_prompts} prompts, {workload}, seed {a.seed}")
    print(json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
