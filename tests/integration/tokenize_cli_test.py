#!/usr/bin/env python3
"""textgen-tokenize against the reference fixtures: encode, --no-special, --decode, bad input.
Usage: tokenize_cli_test.py TEXTGEN_TOKENIZE FIXTURES_DIR"""
import json
import subprocess
import sys

binary, fixtures = sys.argv[1], sys.argv[2]
failures = 0


def run(args, lines):
    p = subprocess.run([binary] + args, input="".join(l + "\n" for l in lines), capture_output=True,
                       text=True, timeout=60)
    return p.returncode, [json.loads(l) for l in p.stdout.splitlines()], p.stderr


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)


for family in ["gpt2", "llama2", "t5"]:
    d = f"{fixtures}/{family}"
    rows = [json.loads(l) for l in open(f"{d}/cases.jsonl", encoding="utf-8")][:40]
    rc, out, err = run(["--tokenizer", d], [json.dumps(r["text"]) for r in rows])
    check(rc == 0, f"{family}: encode exit {rc}: {err}")
    for r, o in zip(rows, out):
        check(o.get("ids") == r["ids"] and o.get("tokens") == r["tokens"] and o.get("offsets") == r["offsets"],
              f"{family}: encode {r['text']!r}")
    rc, out, _ = run(["--tokenizer", d, "--no-special"], [json.dumps(r["text"]) for r in rows])
    check(all(o.get("ids") == r["ids_no_special"] for r, o in zip(rows, out)), f"{family}: --no-special")
    rc, out, _ = run(["--tokenizer", d, "--decode"], [json.dumps(r["ids"]) for r in rows])
    check(all(o.get("text") == r["decode"] for r, o in zip(rows, out)), f"{family}: --decode")
    rc, out, _ = run(["--tokenizer", d, "--decode", "--no-special"], [json.dumps(r["ids"]) for r in rows])
    check(all(o.get("text") == r["decode_skip_special"] for r, o in zip(rows, out)), f"{family}: --decode --no-special")

# Bad input lines are reported per line and the exit status is 1; good lines still answer.
rc, out, _ = run(["--tokenizer", f"{fixtures}/gpt2"], ['"ok"', "not json", "[1, 2]", '"fine"'])
check(rc == 1, f"bad lines: exit {rc}")
check("ids" in out[0] and "error" in out[1] and "error" in out[2] and "ids" in out[3], f"bad lines: {out}")
# Ids outside the vocabulary are an error, not an empty text; deep nesting is refused.
rc, out, _ = run(["--tokenizer", f"{fixtures}/gpt2", "--decode"], ["[1, 4000000000]", "[1, 2]", "[" * 100000 + "]" * 100000])
check(rc == 1 and "not in the vocabulary" in out[0].get("error", "") and "text" in out[1] and "error" in out[2],
      f"--decode of unknown ids: {rc} {out}")
# Missing directory and missing flag.
p = subprocess.run([binary, "--tokenizer", "/nonexistent"], input="", capture_output=True, text=True)
check(p.returncode == 1 and "/nonexistent/tokenizer.json: No such file" in p.stderr, f"missing dir: {p.returncode} {p.stderr}")
p = subprocess.run([binary], input="", capture_output=True, text=True)
check(p.returncode == 2 and "usage" in p.stderr, "missing --tokenizer")

print(f"{0 if failures else 1} passed, {failures} failed")
sys.exit(1 if failures else 0)
