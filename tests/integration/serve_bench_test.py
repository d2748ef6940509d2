#!/usr/bin/env python3
"""bench/serve/serve_bench.py's smoke run on the CPU with the demo model (what `make run` serves): a short
burst, a short Poisson run and a short shared-prefix burst through the real textgen-launcher, each JSON line
checked for its structure and sanity (every request completed, the prompts' token counts, p50 <= p99, TTFT
<= e2e), not for speed; and bad arguments exit 2 naming the problem.

Usage: serve_bench_test.py LAUNCHER REPO
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

LAUNCHER, REPO = sys.argv[1:3]
BENCH = os.path.join(REPO, "bench", "serve", "serve_bench.py")
# The demo model's limits are small; a smaller prefill budget makes the router's warm-up quick on 2 cores.
PASS = ["--", "--max-batch-prefill-tokens", "512"]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def bench(args):
    p = subprocess.run([sys.executable, BENCH, "--launcher", LAUNCHER] + args, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


def check_run(name, args, n, input_len, output_len):
    rc, out, err = bench(args)
    if not check(rc == 0, f"{name}: exit 0 (rc {rc}; stderr tail: {err[-600:]!r})"):
        return None
    lines = out.strip().splitlines()
    check(len(lines) > 2, f"{name}: a table before the JSON line")
    s = json.loads(lines[-1])
    print(f"     {lines[-1][:300]}...")
    check(s["bench"] == "serve", f"{name}: bench is 'serve'")
    check(s["num_prompts"] == n and s["completed"] == n and s["failed"] == 0 and s["errors"] == {},
          f"{name}: {n} of {n} completed, none failed ({s['completed']}, {s['failed']}, {s['errors']})")
    check(s["total_input_tokens"] == n * input_len and s["input_len_mismatch"] == 0,
          f"{name}: every prompt is {input_len} tokens as the server counts them")
    out_tokens = s["total_output_tokens"]
    check(n <= out_tokens <= n * output_len, f"{name}: {out_tokens} output tokens within [{n}, {n * output_len}]")
    check(s["stopped_early"] == 0 or out_tokens < n * output_len, f"{name}: stopped_early agrees with the tokens")
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        st = s[key]
        check(all(isinstance(st[k], (int, float)) and st[k] >= 0 for k in ("mean", "p50", "p99")),
              f"{name}: {key} has non-negative mean, p50, p99")
        check(st["p50"] <= st["p99"], f"{name}: {key} p50 {st['p50']:.2f} <= p99 {st['p99']:.2f}")
    check(s["ttft_ms"]["n"] == n and s["e2e_ms"]["n"] == n, f"{name}: TTFT and e2e per request")
    check(s["itl_ms"]["n"] == out_tokens - n, f"{name}: one ITL per token after the first")
    check(s["ttft_ms"]["p50"] <= s["e2e_ms"]["p50"] and s["ttft_ms"]["p99"] <= s["e2e_ms"]["p99"],
          f"{name}: TTFT <= e2e at p50 and p99")
    check(s["duration_s"] > 0 and s["request_throughput"] > 0 and s["output_throughput"] > 0
          and s["total_token_throughput"] >= s["output_throughput"], f"{name}: throughputs positive and ordered")
    check(abs(s["request_throughput"] * s["duration_s"] - n) < 1e-6, f"{name}: request throughput = N / duration")
    return s


check_run("burst", ["--arrival", "burst", "--num-prompts", "6", "--input-len", "24", "--output-len", "6",
                    "--seed", "1"] + PASS, 6, 24, 6)
# Decode steps go to the shard while the step before them runs (pipelined two deep): a step sent
# ahead puts no router time between two steps, so the host-gap histogram counts only the first
# decode after each prefill; the batching thread's work and the delivery thread's are measured.
ahead = check_run("pipelined", ["--arrival", "burst", "--num-prompts", "2", "--input-len", "8",
                                "--output-len", "24", "--seed", "3"] + PASS, 2, 8, 24)
if ahead is not None:
    st = ahead.get("step_ms", {})
    steps = st.get("forward", {}).get("decode", {}).get("steps", 0)
    gaps = st.get("host_gap", {}).get("decode", {}).get("steps", 0)
    check(steps >= 20, f"pipelined: {steps} decode steps")
    check(gaps <= 2, f"pipelined: {gaps} of {steps} decode steps sent after the one before returned")
    check(st.get("router_work", {}).get("decode", {}).get("steps", 0) == steps,
          "pipelined: the batching thread's work measured each step")
    check(st.get("delivery", {}).get("decode", {}).get("steps", 0) == steps,
          "pipelined: each step's delivery measured")
check_run("poisson", ["--arrival", "poisson", "--rate", "8", "--num-prompts", "6", "--input-len", "16",
                      "--output-len", "4", "--seed", "2"] + PASS, 6, 16, 4)
shared = check_run("shared-prefix", ["--dataset", "shared-prefix", "--prefix-len", "32", "--input-len", "8",
                                     "--num-prompts", "4", "--output-len", "4", "--max-concurrency", "1"] + PASS,
                   4, 40, 4)
# One request at a time: each later one finds the whole 32-token prefix (two blocks of 16) its
# predecessors left in the cache: 3 x 32 of the 4 x 40 prompt tokens.
check(shared is not None and shared["prefix_cache_hit_rate"] is not None
      and abs(shared["prefix_cache_hit_rate"] - 0.6) < 1e-9,
      f"shared-prefix: prompt tokens served from the prefix cache {shared and shared['prefix_cache_hit_rate']} (0.6)")
check(shared is not None and shared["ttft_first_ms"] > 0 and shared["ttft_later_ms"]["n"] == 3, "shared-prefix: first and later TTFTs")
# The same with a tokenizer that appends EOS (the Llama-2 test tokenizer over the demo's weights: its
# ids are within the demo's vocabulary): the prefix's own text ends with EOS, which the prompts do
# not have there, and the prefix still shares all 32 of its tokens.
eos_model = tempfile.mkdtemp(prefix="serve-bench-eos-")
for f in os.listdir(os.path.join(REPO, "models", "demo")):
    if not f.startswith("tokenizer") and f != "special_tokens_map.json":
        shutil.copy(os.path.join(REPO, "models", "demo", f), eos_model)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(REPO, "tests", "reference", "tokenizers", "llama2", f), eos_model)
eos = check_run("shared-prefix, EOS appended", ["--dataset", "shared-prefix", "--prefix-len", "32", "--input-len", "8",
                                                "--num-prompts", "4", "--output-len", "4", "--max-concurrency", "1",
                                                "--", "--model-id", eos_model] + PASS[1:],
                4, 40, 4)
check(eos is not None and eos["prefix_cache_hit_rate"] is not None
      and abs(eos["prefix_cache_hit_rate"] - 0.6) < 1e-9,
      f"shared-prefix, EOS appended: served from the cache {eos and eos['prefix_cache_hit_rate']} (0.6)")
shutil.rmtree(eos_model, ignore_errors=True)

for args, want in ((["--arrival", "poisson"], "--rate"),
                   (["--arrival", "burst", "--rate", "2"], "--rate"),
                   (["--num-prompts", "0"], "--num-prompts"),
                   (["--dataset", "shared-prefix"], "--prefix-len"),
                   (["--dataset", "sharegpt-like", "--output-len", "8"], "--output-len"),
                   (["--input-len", "100000"] + PASS, "max_input_tokens"),
                   (["--", "--num-shard", "0"], "--num-shard")):
    rc, _, err = bench(args)
    check(rc == 2 and want in err, f"{' '.join(args)}: exit 2 naming {want} (rc {rc}: {err.strip()[-200:]!r})")

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
