#!/usr/bin/env python3
"""bench_perplexity on the demo model: the JSON line's figures are consistent, and bad input exits
non-zero with the reason. Usage: perplexity_cli_test.py BENCH_PERPLEXITY DEMO_MODEL_DIR HELD_OUT_TEXT"""
import json
import math
import os
import subprocess
import sys
import tempfile

binary, model, held_out = sys.argv[1], sys.argv[2], sys.argv[3]
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)


def run(args):
    p = subprocess.run([binary, "--model", model, "--threads", "1"] + args, capture_output=True, text=True,
                       timeout=300)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    return p.returncode, json.loads(lines[-1]) if lines else None, p.stderr


with tempfile.TemporaryDirectory() as tmp:
    # The first held-out document (about.rst, ~1.5 KB) as plain text.
    first = open(held_out, encoding="utf-8").read().split("\f")[1].split("\n", 1)[1]
    text = os.path.join(tmp, "about.txt")
    open(text, "w", encoding="utf-8").write(first)
    rc, out, err = run(["--text", text, "--window", "64", "--quantize", "none,eetq,bitsandbytes-nf4"])
    check(rc == 0 and out is not None, f"run: exit {rc}: {err}")
    if out:
        rows = {r["quantize"]: r for r in out["results"]}
        check(list(rows) == ["none", "eetq", "bitsandbytes-nf4"], f"rows {list(rows)}")
        windows = math.ceil(out["tokens"] / 64)
        for q, r in rows.items():
            check(r["windows"] == windows and r["predictions"] == out["tokens"] - windows, f"{q}: counts {r}")
            check(abs(math.exp(r["mean_nll"]) - r["perplexity"]) < 1e-9 * r["perplexity"], f"{q}: exp(mean NLL)")
            check(1 < r["perplexity"] < 4096, f"{q}: perplexity {r['perplexity']} outside (1, vocab)")
        check(rows["none"]["vs_none_percent"] is None, "none has no delta")
        for q in ["eetq", "bitsandbytes-nf4"]:
            d = 100 * (rows[q]["perplexity"] / rows["none"]["perplexity"] - 1)
            check(abs(rows[q]["vs_none_percent"] - d) < 1e-9, f"{q}: delta")
            check(rows[q]["perplexity"] != rows["none"]["perplexity"], f"{q}: not applied")
        check(rows["eetq"]["budget_percent"] == 1.0 and rows["bitsandbytes-nf4"]["budget_percent"] == 5.0,
              "budgets")
    # One window holding the whole text: every token but the first predicted once.
    rc, one, err = run(["--text", text, "--window", "512"])
    check(rc == 0 and one["results"][0]["predictions"] == one["tokens"] - 1, f"one window: {rc} {err}")
    # --documents: <s> document </s> per document.
    rc, docs, err = run(["--text", held_out, "--documents", "--window", "256", "--quantize", "none"])
    check(rc == 0 and docs["documents"] == 10 and docs["tokens"] == 16582, f"--documents: {rc} {err}")

    empty = os.path.join(tmp, "empty.txt")
    open(empty, "w").close()
    for args, code, words in [
        (["--text", os.path.join(tmp, "missing.txt")], 1, "No such file"),
        (["--text", empty], 1, "has no text to score"),
        (["--text", text, "--documents"], 1, "has no documents"),
        (["--text", text, "--quantize", "int3"], 2, "--quantize 'int3': expected"),
        (["--text", text, "--quantize", "gptq"], 1, "quantization_config is 'none'"),
        (["--text", text, "--window", "1024"], 1, "the model's context is 512"),
        (["--text", text, "--window", "x"], 2, "--window must be"),
        ([], 2, "--model and --text are required"),
    ]:
        rc, _, err = run(args)
        check(rc == code and words in err, f"{args}: exit {rc}, {err.strip()}")

print(f"{0 if failures else 1} passed, {failures} failed")
sys.exit(1 if failures else 0)
