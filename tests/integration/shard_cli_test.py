#!/usr/bin/env python3
"""textgen-shard's device and dtype flags on a machine without a GPU: bad values exit non-zero naming
the flag; float16/bfloat16 on the CPU is refused with the reason; --device cuda without a device says
so; --device auto falls back to the CPU and serves, with --kv-cache-dtype fp8_e4m3fn too. Usage: shard_cli_test.py TEXTGEN_SHARD MODEL_DIR"""
import shutil
import subprocess
import sys
import tempfile

binary, model = sys.argv[1], sys.argv[2]
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)


def run(*flags):
    p = subprocess.run([binary, "--model-id", model, "--port", "0", "--log-level", "warn", *flags],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr


for flags, want in [
    (["--device", "tpu"], "--device must be auto, cuda or cpu"),
    (["--dtype", "float64"], "--dtype must be float16, bfloat16 or float32"),
    (["--cuda-graphs", "1,x"], "'x' is not an integer"),
    (["--cuda-graphs", "1,-2"], "must not be negative"),
    (["--cuda-memory-fraction", "1.5"], "--cuda-memory-fraction must be a number in (0, 1]"),
    (["--cuda-memory-fraction", "half"], "--cuda-memory-fraction must be a number in (0, 1]"),
    (["--device", "cpu", "--dtype", "bfloat16"], "the CPU backend computes in float32"),
    (["--shard-urls", "a:1,b:2"], "--shard-urls lists 2 addresses for WORLD_SIZE 1"),
    (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype must be fp8_e4m3fn or fp8_e5m2, not 'fp8'"),
    (["--kv-cache-dtype", "auto"], "--kv-cache-dtype must be fp8_e4m3fn or fp8_e5m2, not 'auto'"),
    (["--kv-cache-dtype"], "--kv-cache-dtype needs a value"),
]:
    rc, err = run(*flags)
    check(rc != 0 and want in err, f"{flags}: exit {rc}, stderr {err.strip()[-300:]!r}")

if shutil.which("nvidia-smi") is None:
    rc, err = run("--device", "cuda")
    check(rc != 0 and "CUDA" in err, f"--device cuda without a GPU: exit {rc}, {err.strip()[-300:]!r}")
    # auto: no GPU, so the CPU backend; float16 is then refused, float32 serves.
    rc, err = run("--dtype", "float16")
    check(rc != 0 and "the CPU backend computes in float32" in err, f"auto + float16: {rc} {err[-300:]!r}")
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.Popen([binary, "--model-id", model, "--uds-path", f"{d}/s", "--log-level", "warn",
                              "--cuda-graphs", "0"], stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        check(line.startswith("textgen-shard ready "), f"auto serves on the CPU: {line!r}")
        p.terminate()
        check(p.wait(timeout=30) == 0, "SIGTERM exits 0")
        # An fp8 KV cache on the CPU (engine and kernels: runtime_test's KvCacheFp8Test).
        p = subprocess.Popen([binary, "--model-id", model, "--uds-path", f"{d}/fp8", "--log-level", "warn",
                              "--kv-cache-dtype", "fp8_e4m3fn"], stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        check(line.startswith("textgen-shard ready "), f"--kv-cache-dtype fp8_e4m3fn serves on the CPU: {line!r}")
        p.terminate()
        check(p.wait(timeout=30) == 0, "SIGTERM exits 0")

print("shard_cli:", "FAIL" if failures else "PASS")
sys.exit(1 if failures else 0)
