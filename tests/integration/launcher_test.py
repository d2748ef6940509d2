#!/usr/bin/env python3
"""textgen-launcher end to end on port 0 with the bundled demo model: start, generate, SIGTERM ->
clean exit with no orphan process; a crashed shard -> non-zero exit naming it; refused flags;
--num-shard / --sharded: bad values, and the ranks' start-up, environment and failures with stand-in
shard and router programs; --shards-only (a Kubernetes pod's ranks): bad flags, two launchers of two
ranks forming one group of four, a rank's death, SIGTERM, CPU ranks; --num-shard 2 and 8 against --num-shard 1 on the CPU (greedy tokens equal).
Usage: launcher_test.py LAUNCHER"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

LAUNCHER = sys.argv[1]
results = {"passed": 0, "failed": 0, "skipped": []}
WORK = tempfile.mkdtemp(prefix="textgen-launcher-test-")
# The shard's refusal until tensor parallelism lands in the pod runtime (pod-runtime/src/models).
NOT_IMPLEMENTED = re.compile(r"\[textgen-shard rank \d+\] .*tensor parallelism \(world size \d+\) "
                             r"is not implemented yet")


def check(cond, what):
    results["passed" if cond else "failed"] += 1
    if not cond:
        print("FAIL:", what, flush=True)
    return cond


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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unique_uds(name):
    return os.path.join(WORK, name, "server")


class Launcher:
    """A textgen-launcher on port 0 with its own --shard-uds-path and --master-port; stderr goes to
    a file (a full pipe would block it)."""

    def __init__(self, name, args=(), env=None, launcher=LAUNCHER, ready_timeout=120, wait_ready=True):
        """env: added to this process's environment; a None value removes the variable."""
        self.uds = unique_uds(name)
        os.makedirs(os.path.dirname(self.uds), exist_ok=True)
        self.err_path = self.uds + ".stderr"
        self.err_file = open(self.err_path, "w")
        full_env = {k: v for k, v in dict(os.environ, **(env or {})).items() if v is not None}
        self.master_port = str(free_port())
        self.p = subprocess.Popen([launcher, "--port", "0", "--hostname", "127.0.0.1", "--shard-uds-path", self.uds,
                                   "--master-port", self.master_port, "--log-level", "warn", *args],
                                  stdout=subprocess.PIPE, stderr=self.err_file, text=True, env=full_env)
        self.port = None
        self.early = []  # what it printed before its ready line
        if not wait_ready:
            return
        # A launcher that neither gets ready nor exits is killed: the test fails, it does not hang.
        timer = threading.Timer(ready_timeout, self.p.kill)
        timer.start()
        for line in self.p.stdout:
            if line.startswith("textgen-launcher ready "):
                self.port = int(line.rsplit(":", 1)[1])
                break
            self.early.append(line)
        timer.cancel()

    @property
    def pid(self):
        return self.p.pid

    def stderr(self):
        with open(self.err_path) as f:
            return f.read()

    def wait(self, timeout=30):
        code = self.p.wait(timeout=timeout)
        self.err_file.close()
        return code

    def kids(self):
        return [k for k in children_of(self.uds) if k != self.p.pid]

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        return self.wait()


def generate(port, inputs="To open a file", parameters=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/generate",
              body=json.dumps({"inputs": inputs, "parameters": parameters or {"max_new_tokens": 12}}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, json.loads(r.read())


def test_start_generate_sigterm():
    la = Launcher("sigterm", ["--kv-cache-memory", "64000000"])
    if not check(la.port, f"launcher ready: {la.stderr()[-2000:]}"):
        return
    status, body = generate(la.port)
    check(status == 200 and body["generated_text"].startswith(", open the file"), f"demo model answers: {status} {body}")
    kids = la.kids()
    check(len(kids) == 2, f"one shard and one router run: {kids}")
    code = la.stop()
    check(code == 0, f"SIGTERM: clean exit ({code})")
    check(wait_for("the shard and router to exit", lambda: not any(alive(k) for k in kids), 5),
          "no orphan process after SIGTERM")


def test_crashed_shard():
    la = Launcher("crash", ["--kv-cache-memory", "64000000"])
    if not check(la.port, f"launcher ready: {la.stderr()[-2000:]}"):
        return
    shard = [k for k in la.kids() if "textgen-shard" in open(f"/proc/{k}/cmdline").read()]
    check(len(shard) == 1, "found the shard process")
    os.kill(shard[0], signal.SIGKILL)
    code = la.wait()
    err = la.stderr()
    check(code != 0 and "textgen-shard rank 0 exited" in err, f"a crashed shard stops the launcher, named: {code} {err[-300:]}")
    check(wait_for("the router to exit", lambda: children_of(la.uds) == [], 10), "the router was stopped too")


def refused(args, words, env=None, code=2):
    r = subprocess.run([LAUNCHER, *args], capture_output=True, text=True, timeout=30, env=dict(os.environ, **(env or {})))
    check(r.returncode == code and words in r.stderr, f"{args} {env or ''}: {r.returncode} {r.stderr[:300]}")


def test_refused_flags():
    refused(["--trust-remote-code"], "never runs code")
    # Each alternative costs the sampler work and memory on every row: the router bounds the flag.
    refused(["--max-top-n-tokens", "5000"], "--max-top-n-tokens must be at most 1024", code=1)
    # A value TGI does not have, and ExLlamaV2's (not read); a pre-quantized format is checked by the
    # shard against the checkpoint's quantization_config (the demo model has none).
    refused(["--quantize", "int3"], "--quantize int3: expected one of gptq, awq, compressed-tensors, marlin, bitsandbytes")
    refused(["--quantize", "exl2"], "--quantize exl2 is not supported")
    refused(["--quantize", "marlin"], "--quantize marlin: config.json has no quantization_config", env={"CUDA_VISIBLE_DEVICES": ""}, code=1)
    # TGI's --quantize marlin reads Marlin's B and s only: a GPT-Q checkpoint is refused under it.
    gptq = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference", "models", "llama-gptq-g32")
    refused(["--model-id", gptq, "--quantize", "marlin"], "--quantize marlin needs a Marlin-format checkpoint",
            env={"CUDA_VISIBLE_DEVICES": ""}, code=1)
    refused(["--quantize", "gptq"], "--quantize gptq: config.json has no quantization_config", env={"CUDA_VISIBLE_DEVICES": ""}, code=1)
    # TGI's two fp8 KV cache formats only (no flag: the model's dtype).
    for kv in ("fp8", "auto", "float16", "FP8_E4M3FN", ""):
        refused(["--kv-cache-dtype", kv], f"--kv-cache-dtype {kv}: expected fp8_e4m3fn or fp8_e5m2")
    refused([], "--kv-cache-dtype int8: expected fp8_e4m3fn or fp8_e5m2", env={"KV_CACHE_DTYPE": "int8"})
    # A path that does not exist is not taken for a hub id (hub downloads: hub_test.py).
    refused(["--model-id", "/no/such/model"], "neither a local directory nor a hub id", code=1)


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read().decode()


def test_tgi_flags():
    """TGI's launcher flags and variables that deployments set: all accepted, or refused by name."""
    r = subprocess.run([LAUNCHER, "--help"], capture_output=True, text=True, timeout=30)
    check(r.returncode == 0 and "--model-id" in r.stdout and "--prometheus-port" in r.stdout, f"--help: {r.returncode}")
    refused(["--lora-adapters", "org/adapter"], "LoRA adapters are not supported yet")
    refused(["--ngrok"], "--ngrok is not supported")
    refused([], "--ngrok is not supported", env={"NGROK": "true"})
    # ngrok's own token variable, often set in a shell, means nothing without --ngrok (as TGI).
    refused(["--kv-cache-dtype", "int8"], "--kv-cache-dtype int8: expected", env={"NGROK_AUTHTOKEN": "abc", "NGROK": "false"})
    refused(["--usage-stats", "sometimes"], "--usage-stats sometimes: expected on, off or no-stack")
    refused([], "LORA_ADAPTERS is set, but it is not supported", env={"LORA_ADAPTERS": "a"})
    prometheus = free_port()
    la = Launcher("tgi-flags", ["--kv-cache-memory", "64000000", "--usage-stats", "off", "--enable-prefill-logprobs",
                                "--disable-grammar-support", "--prometheus-port", str(prometheus), "-e"])
    try:
        if not check(la.port, f"launcher with TGI's flags ready: {la.stderr()[-2000:]}"):
            return
        check(any(line.startswith("textgen-launcher ") for line in la.early) and any("ranks: 1" in line for line in la.early),
              f"-e prints the runtime first: {la.early}")
        status, body = generate(la.port, parameters={"max_new_tokens": 3, "grammar": {"type": "regex", "value": "a+"}})
        check(status == 422 and body.get("error") == "grammar is not supported", f"--disable-grammar-support: {status} {body}")
        status, body = generate(la.port, parameters={"max_new_tokens": 3, "decoder_input_details": True})
        check(status == 200 and len(body["details"]["prefill"]) > 0, f"prefill log-probabilities served: {status}")
        status, text = get(prometheus, "/metrics")
        check(status == 200 and "tgi_request_count" in text, f"--prometheus-port serves /metrics: {status}")
        check(get(prometheus, "/info")[0] == 404, "and nothing else")
    finally:
        la.stop()
    # Containers set HOSTNAME to their own name (TGI: not an address, so every interface), and TGI's
    # image sets PORT: both are its flags' variables.
    port = free_port()
    uds = unique_uds("hostname-env")
    os.makedirs(os.path.dirname(uds), exist_ok=True)
    env = dict(os.environ, HOSTNAME="textgen-7f9c6d5b8-x2kqz", PORT=str(port))
    p = subprocess.Popen([LAUNCHER, "--shard-uds-path", uds, "--master-port", str(free_port()), "--log-level", "warn",
                          "--kv-cache-memory", "64000000", "-g", "20"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, env=env)
    timer = threading.Timer(120, p.kill)
    timer.start()
    ready = next((line for line in p.stdout if line.startswith("textgen-launcher ready ")), "")
    timer.cancel()
    try:
        check(ready.strip().endswith(f":{port}") and get(port, "/health")[0] == 200,
              f"HOSTNAME=<pod name> and PORT from the environment: {ready!r}")
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        check(p.wait(timeout=30) == 0, "clean exit")


def test_kv_cache_fp8_serves():
    """--kv-cache-dtype reaches the shard, which serves the demo model with an fp8 KV cache (CPU)."""
    la = Launcher("kv-fp8", ["--kv-cache-dtype", "fp8_e5m2"], env={"CUDA_VISIBLE_DEVICES": ""})
    try:
        if not check(la.port, f"launcher with --kv-cache-dtype ready: {la.stderr()[-2000:]}"):
            return
        shards = [k for k in la.kids() if "textgen-shard" in open(f"/proc/{k}/cmdline").read()]
        args = open(f"/proc/{shards[0]}/cmdline").read().split("\0") if shards else []
        check("--kv-cache-dtype" in args and args[args.index("--kv-cache-dtype") + 1] == "fp8_e5m2",
              f"the shard got --kv-cache-dtype fp8_e5m2: {args}")
        status, body = generate(la.port)
        check(status == 200 and body.get("generated_text"), f"generates with an fp8 KV cache: {status} {body}")
    finally:
        check(la.stop() == 0, "SIGTERM stops it cleanly")


def test_bad_shard_flags():
    """Refused before any process starts, on any machine."""
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
    refused(["--num-shard", "0"], "--num-shard must be at least 1")
    refused(["--num-shard", "-1"], "--num-shard must be a positive integer, not '-1'")
    refused(["--num-shard", "abc"], "--num-shard must be a positive integer, not 'abc'")
    refused(["--num-shard", "2x"], "--num-shard must be a positive integer, not '2x'")
    refused(["--num-shard", "1000"], "--num-shard 1000: at most 64 ranks")
    refused(["--num-shard", "99999999999999999999999"], "at most 64 ranks")
    refused([], "--num-shard must be a positive integer, not 'two'", env={"NUM_SHARD": "two"})
    refused(["--sharded", "false", "--num-shard", "2"], "--sharded false contradicts --num-shard 2", env=no_gpu)
    refused(["--sharded", "true", "--num-shard", "1"], "--sharded true contradicts --num-shard 1", env=no_gpu)
    refused(["--sharded", "yes"], "--sharded must be true or false", env=no_gpu)
    refused(["--sharded", "true"], "no GPU is visible", env=no_gpu)
    refused(["--sharded", "true"], "give --num-shard N to run N ranks on the CPU", env={"CUDA_VISIBLE_DEVICES": "-1"})
    refused(["--sharded", "true"], "only one GPU is visible (3)", env={"CUDA_VISIBLE_DEVICES": "3"})
    refused(["--num-shard", "3"], "--num-shard 3 needs one GPU per rank, and 2 are visible (0,1)",
            env={"CUDA_VISIBLE_DEVICES": "0,1"})
    refused(["--num-shard", "2", "--master-port", "99999"], "--master-port must be a port number", env=no_gpu)
    refused(["--num-shard", "2", "--kv-cache-memory", "lots"], "--kv-cache-memory must be a byte count or a fraction",
            env=no_gpu)


def test_bad_shards_only_flags():
    """--shards-only and its flags, refused before any process starts."""
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
    so = ["--shards-only", "--num-shard", "2"]
    refused(["--world-size", "2"], "--world-size needs --shards-only")
    refused(["--num-shard", "2", "--rank-offset", "0"], "--rank-offset needs --shards-only", env=no_gpu)
    refused(["--gpus-per-shard", "1"], "--gpus-per-shard needs --shards-only")
    refused(["--shard-urls", "a:1"], "--shard-urls needs --shards-only")
    refused([], "--num-shard must be a positive integer", env={"NUM_SHARD": "x", "WORLD_SIZE": "nonsense"})
    refused(["--shards-only"], "--shards-only needs --num-shard K", env=no_gpu)
    refused(["--shards-only", "--sharded", "true", "--num-shard", "2"], "--sharded does not go with --shards-only")
    refused([*so, "--world-size", "0"], "--world-size must be a whole number from 1 to 64, not '0'", env=no_gpu)
    refused([*so, "--world-size", "4x"], "--world-size must be a whole number from 1 to 64, not '4x'", env=no_gpu)
    refused([*so, "--world-size", "65"], "--world-size must be a whole number from 1 to 64, not '65'", env=no_gpu)
    refused([*so, "--rank-offset", "-1"], "--rank-offset must be a whole number from 0 to 63, not '-1'", env=no_gpu)
    refused([*so, "--world-size", "3", "--rank-offset", "2"],
            "ranks 2..3 (--rank-offset, --num-shard) are not all below --world-size 3", env=no_gpu)
    refused([*so, "--world-size", "1"], "ranks 0..1 (--rank-offset, --num-shard) are not all below --world-size 1",
            env=no_gpu)
    refused([*so, "--gpus-per-shard", "2"], "--num-shard 2 with --gpus-per-shard 2 needs 4 GPUs, and 3 are visible (0,1,2)",
            env={"CUDA_VISIBLE_DEVICES": "0,1,2"})
    refused([*so, "--gpus-per-shard", "1"], "needs 2 GPUs, and 0 are visible", env=no_gpu)
    refused([*so, "--gpus-per-shard", "one"], "--gpus-per-shard must be a whole number from 0 to 64, not 'one'")
    refused([*so, "--port", "65535"], "--port must be a port number with room for 2 ranks after it", env=no_gpu)
    refused([*so, "--port", "0"], "--port must be a port number", env=no_gpu)
    refused([*so, "--port", "http"], "--port must be a port number", env=no_gpu)
    refused([*so, "--world-size", "4"], "--shard-urls is needed: ranks of this group run elsewhere too", env=no_gpu)
    # TGI's PORT (an HTTP port) never moves the ranks' gRPC ports: there --port is read from the command line only.
    refused([*so, "--world-size", "4"], "--shard-urls is needed", env={**no_gpu, "PORT": "abc"})
    refused([*so, "--max-input-tokens", "5"], "--max-input-tokens is the router's, and --shards-only starts no router",
            env=no_gpu)
    refused([*so, "--shard-uds-path", "/tmp/x"], "--shard-uds-path is the router's", env=no_gpu)


class ShardsOnly:
    """textgen-launcher --shards-only (a pod's ranks); stdout read for its one readiness line."""

    def __init__(self, launcher, name, args, env, ready_timeout=60):
        self.err_path = os.path.join(WORK, name + ".stderr")
        self.err_file = open(self.err_path, "w")
        full_env = {k: v for k, v in dict(os.environ, **env).items() if v is not None}
        self.p = subprocess.Popen([launcher, "--shards-only", "--log-level", "warn", *args], stdout=subprocess.PIPE,
                                  stderr=self.err_file, text=True, env=full_env)
        self.ready = None
        self.timer = threading.Timer(ready_timeout, self.p.kill)
        self.timer.start()

    def wait_ready(self):
        for line in self.p.stdout:
            if line.startswith("textgen-launcher shards ready: "):
                self.ready = line.strip()
                break
        self.timer.cancel()
        return self.ready

    def stderr(self):
        with open(self.err_path) as f:
            return f.read()

    def wait(self, timeout=30):
        self.timer.cancel()
        code = self.p.wait(timeout=timeout)
        self.err_file.close()
        return code


def test_fake_shards_only_two_pods(fake_launcher):
    """Four ranks as two 'pods' of two: each launcher starts its ranks (RANK from --rank-offset, two
    GPUs each out of the pod's four, ports from --port), both get ready only together (the ranks meet
    across them), --shard-urls passes through; a rank's death ends its pod's launcher (non-zero,
    named, its other rank stopped); SIGTERM stops the other pod's ranks and exits 0."""
    fake_dir = os.path.join(WORK, "pods-ranks")
    os.makedirs(fake_dir)
    urls = "pod-0:50051,pod-0:50052,pod-1:50051,pod-1:50052"
    master = str(free_port())
    env = {"FAKE_DIR": fake_dir, "FAKE_MODE": "", "CUDA_VISIBLE_DEVICES": None, "NCCL_NVLS_ENABLE": None,
           "MASTER_ADDR": "pod-0.example", "MASTER_PORT": master}
    pods = []
    for p in (0, 1):
        base = free_ports(2)
        pods.append((ShardsOnly(fake_launcher, f"pod-{p}",
                                ["--num-shard", "2", "--world-size", "4", "--rank-offset", str(2 * p),
                                 "--gpus-per-shard", "2", "--port", str(base), "--shard-urls", urls],
                                dict(env, CUDA_VISIBLE_DEVICES="0,1,2,3")), base))
    ready = [la.wait_ready() for la, _ in pods]
    if not check(ready[0] and ready[1], f"both pods ready: {ready} {pods[0][0].stderr()[-800:]} "
                                        f"{pods[1][0].stderr()[-800:]}"):
        for la, _ in pods:
            la.p.kill()
        return
    check(ready[1] == f"textgen-launcher shards ready: ranks 2..3 of 4: 0.0.0.0:{pods[1][1]} "
                      f"0.0.0.0:{pods[1][1] + 1}", f"one readiness line naming the pod's ranks: {ready[1]}")
    ranks = ranks_of(fake_dir, 4)
    for r, info in enumerate(ranks):
        e, argv = info["env"], info["argv"]
        base = pods[r // 2][1]
        check((e["RANK"], e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) == (str(r), "4", "pod-0.example", master),
              f"rank {r}: RANK, WORLD_SIZE, and the rendezvous from MASTER_ADDR/MASTER_PORT: {e.get('RANK')} "
              f"{e.get('WORLD_SIZE')} {e.get('MASTER_ADDR')} {e.get('MASTER_PORT')}")
        check(e.get("CUDA_VISIBLE_DEVICES") == ("0,1" if r % 2 == 0 else "2,3"),
              f"rank {r}: its two GPUs of the pod's four: {e.get('CUDA_VISIBLE_DEVICES')}")
        check(e.get("NCCL_NVLS_ENABLE") == "0", f"rank {r}: NVLink multicast off")
        port = argv[argv.index("--port") + 1] if "--port" in argv else None
        check(port == str(base + r % 2) and "--uds-path" not in argv, f"rank {r}: its own TCP port: {argv}")
        shard_urls = argv[argv.index("--shard-urls") + 1] if "--shard-urls" in argv else None
        check(shard_urls == urls, f"rank {r}: --shard-urls passed through: {shard_urls}")
        check(argv[argv.index("--device") + 1] == "cuda" if "--device" in argv else False, f"rank {r}: --device cuda")
    pids = [info["pid"] for info in ranks]
    os.kill(pids[3], signal.SIGKILL)
    la1 = pods[1][0]
    code = la1.wait()
    check(code == 1 and "textgen-shard rank 3 exited" in la1.stderr(),
          f"a killed rank ends its pod's launcher, named: {code} {la1.stderr()[-500:]}")
    check(wait_for("rank 2 to be stopped", lambda: not alive(pids[2]), 10), "the pod's other rank was stopped")
    la0 = pods[0][0]
    check(la0.p.poll() is None, "the other pod runs on (the operator restarts the group)")
    la0.p.send_signal(signal.SIGTERM)
    code = la0.wait()
    check(code == 0, f"SIGTERM: exit 0 ({code}) {la0.stderr()[-300:]}")
    check(wait_for("ranks 0 and 1 to exit", lambda: not alive(pids[0]) and not alive(pids[1]), 10), "no orphan rank")


def test_fake_shards_only_cpu(fake_launcher):
    """--gpus-per-shard 0: CPU ranks that see no GPU (CUDA_VISIBLE_DEVICES="" even where some are
    visible), the CPUs and KV budget divided; the whole group here: --shard-urls defaults to the
    local ports."""
    fake_dir = os.path.join(WORK, "cpu-pod-ranks")
    os.makedirs(fake_dir)
    base = free_ports(2)
    la = ShardsOnly(fake_launcher, "cpu-pod", ["--num-shard", "2", "--gpus-per-shard", "0", "--port", str(base),
                                               "--kv-cache-memory", "64000000", "--master-port", str(free_port())],
                    {"FAKE_DIR": fake_dir, "FAKE_MODE": "", "CUDA_VISIBLE_DEVICES": "0,1"})
    if not check(la.wait_ready(), f"ready: {la.stderr()[-800:]}"):
        la.p.kill()
        return
    cpus = len(os.sched_getaffinity(0))
    for r, info in enumerate(ranks_of(fake_dir, 2)):
        e, argv = info["env"], info["argv"]
        check(e.get("RANK") == str(r) and e.get("WORLD_SIZE") == "2", f"rank {r}: RANK, WORLD_SIZE")
        check(e.get("CUDA_VISIBLE_DEVICES") == "", f"rank {r}: no GPU: {e.get('CUDA_VISIBLE_DEVICES')!r}")
        check("--device" not in argv, f"rank {r}: no --device: {argv}")
        threads = argv[argv.index("--threads") + 1] if "--threads" in argv else None
        check(threads == str(max(1, cpus // 2)), f"rank {r}: half the CPUs: {threads}")
        kv = argv[argv.index("--kv-cache-memory") + 1] if "--kv-cache-memory" in argv else None
        check(kv == "32000000", f"rank {r}: half the KV budget: {kv}")
        shard_urls = argv[argv.index("--shard-urls") + 1] if "--shard-urls" in argv else None
        check(shard_urls == f"127.0.0.1:{base},127.0.0.1:{base + 1}", f"rank {r}: local shard urls: {shard_urls}")
    la.p.send_signal(signal.SIGTERM)
    check(la.wait() == 0, "SIGTERM: exit 0")


def free_ports(n):
    """n consecutive free local ports."""
    while True:
        base = free_port()
        ok = True
        for port in range(base + 1, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
        if ok and base + n <= 65536:
            return base


# Stand-ins for textgen-shard and textgen-router next to a copy of the launcher (it runs the ones
# beside its own executable). Each rank records its pid, argv and environment, then meets the
# others the way tensor-parallel ranks do: it is ready only once every rank has started.
FAKE_SHARD = textwrap.dedent("""\
    #!{python}
    import json, os, signal, sys, time
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    d, mode = os.environ["FAKE_DIR"], os.environ.get("FAKE_MODE", "")
    with open(os.path.join(d, f"rank-{{rank}}.json.tmp"), "w") as f:
        json.dump({{"pid": os.getpid(), "argv": sys.argv, "env": dict(os.environ)}}, f)
    os.rename(os.path.join(d, f"rank-{{rank}}.json.tmp"), os.path.join(d, f"rank-{{rank}}.json"))
    deadline = time.monotonic() + 20
    while not all(os.path.exists(os.path.join(d, f"rank-{{r}}.json")) for r in range(world)):
        if time.monotonic() > deadline:
            sys.exit("rank %d: rendezvous timed out: not every rank started" % rank)
        time.sleep(0.02)
    if mode == "rank-1-fails" and rank == 1:
        sys.exit("rank 1 fails on purpose")
    if mode != "never-ready" and not (mode == "rank-1-fails" and rank != 1):
        if "--uds-path" in sys.argv:
            print("textgen-shard ready unix://" + sys.argv[sys.argv.index("--uds-path") + 1] + "-" + str(rank), flush=True)
        else:
            print("textgen-shard ready 0.0.0.0:" + sys.argv[sys.argv.index("--port") + 1], flush=True)
    while True:
        time.sleep(1)
    """)
FAKE_ROUTER = textwrap.dedent("""\
    #!{python}
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("textgen-router ready http://127.0.0.1:9", flush=True)
    while True:
        time.sleep(1)
    """)


def fake_install():
    d = os.path.join(WORK, "fake-bin")
    os.makedirs(d)
    launcher = os.path.join(d, "textgen-launcher")
    shutil.copy(LAUNCHER, launcher)
    for name, text in (("textgen-shard", FAKE_SHARD), ("textgen-router", FAKE_ROUTER)):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text.format(python=sys.executable))
        os.chmod(path, 0o755)
    return launcher


def ranks_of(fake_dir, n):
    out = []
    for r in range(n):
        with open(os.path.join(fake_dir, f"rank-{r}.json")) as f:
            out.append(json.load(f))
    return out


def fake_launch(fake_launcher, name, args, env, mode="", wait_ready=True):
    fake_dir = os.path.join(WORK, name + "-ranks")
    os.makedirs(fake_dir)
    env = dict(env, FAKE_DIR=fake_dir, FAKE_MODE=mode)
    return Launcher(name, args, env=env, launcher=fake_launcher, ready_timeout=60, wait_ready=wait_ready), fake_dir


def test_fake_ranks_on_gpus(fake_launcher):
    """Three GPU ranks, started together; each gets its own CUDA_VISIBLE_DEVICES entry; a rank
    killed after start-up stops everything, named."""
    env = {"CUDA_VISIBLE_DEVICES": "3,5,7,9", "NCCL_NVLS_ENABLE": None}
    la, fake_dir = fake_launch(fake_launcher, "fake-gpu", ["--num-shard", "3", "--master-addr", "10.1.2.3"], env)
    if not check(la.port == 9, f"three ranks that meet each other get ready: {la.stderr()[-2000:]}"):
        la.stop()
        return
    ranks = ranks_of(fake_dir, 3)
    master_port = la.master_port
    for r, info in enumerate(ranks):
        e = info["env"]
        check((e["RANK"], e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) == (str(r), "3", "10.1.2.3", master_port),
              f"rank {r}: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: {e.get('RANK')} {e.get('WORLD_SIZE')} "
              f"{e.get('MASTER_ADDR')} {e.get('MASTER_PORT')}")
        check(e.get("CUDA_VISIBLE_DEVICES") == "357"[r], f"rank {r}: its own GPU: {e.get('CUDA_VISIBLE_DEVICES')}")
        check(e.get("NCCL_NVLS_ENABLE") == "0", f"rank {r}: NVLink multicast off: {e.get('NCCL_NVLS_ENABLE')}")
        check(e.get("FAKE_DIR") == fake_dir, f"rank {r}: the launcher's environment is inherited")
        argv = info["argv"]
        check("--threads" not in argv, f"rank {r}: a GPU rank keeps the shard's thread count: {argv}")
        device = argv[argv.index("--device") + 1] if "--device" in argv else None
        check(device == "cuda", f"rank {r}: --device cuda: {argv}")
    pids = [info["pid"] for info in ranks]
    os.kill(pids[1], signal.SIGKILL)
    code = la.wait()
    err = la.stderr()
    check(code != 0 and "textgen-shard rank 1 exited" in err, f"a killed rank 1 stops the launcher, named: {code} {err[-500:]}")
    check(wait_for("ranks 0 and 2 and the router to exit", lambda: not any(alive(p) for p in pids) and not la.kids(), 10),
          "the other ranks and the router were stopped")


def test_fake_sharded_takes_every_gpu(fake_launcher):
    la, fake_dir = fake_launch(fake_launcher, "fake-sharded", ["--sharded", "true"], {"CUDA_VISIBLE_DEVICES": "GPU-a, GPU-b"})
    if check(la.port == 9, f"--sharded true alone: ready: {la.stderr()[-2000:]}"):
        ranks = ranks_of(fake_dir, 2)
        check([r["env"]["WORLD_SIZE"] for r in ranks] == ["2", "2"], "--sharded true: one rank per visible GPU")
        check([r["env"].get("CUDA_VISIBLE_DEVICES") for r in ranks] == ["GPU-a", "GPU-b"],
              f"GPU UUIDs pass through: {[r['env'].get('CUDA_VISIBLE_DEVICES') for r in ranks]}")
        check(not os.path.exists(os.path.join(fake_dir, "rank-2.json")), "no third rank")
    check(la.stop() == 0, "SIGTERM: clean exit")


def test_fake_ranks_on_cpu(fake_launcher):
    """No GPU: the ranks share the machine (no CUDA_VISIBLE_DEVICES of their own, the threads and
    the KV budget divided); a user's NCCL_NVLS_ENABLE is kept."""
    env = {"CUDA_VISIBLE_DEVICES": "", "NCCL_NVLS_ENABLE": "1"}
    la, fake_dir = fake_launch(fake_launcher, "fake-cpu", ["--num-shard", "2", "--kv-cache-memory", "64000000"], env)
    if check(la.port == 9, f"two CPU ranks get ready: {la.stderr()[-2000:]}"):
        cpus = len(os.sched_getaffinity(0))
        for r, info in enumerate(ranks_of(fake_dir, 2)):
            e, argv = info["env"], info["argv"]
            check(e.get("CUDA_VISIBLE_DEVICES") == "", f"rank {r}: no GPU of its own: {e.get('CUDA_VISIBLE_DEVICES')!r}")
            check(e.get("NCCL_NVLS_ENABLE") == "1", f"rank {r}: the user's NCCL_NVLS_ENABLE is kept")
            threads = argv[argv.index("--threads") + 1] if "--threads" in argv else None
            check(threads == str(max(1, cpus // 2)), f"rank {r}: half the CPUs: {threads} of {cpus}")
            kv = argv[argv.index("--kv-cache-memory") + 1] if "--kv-cache-memory" in argv else None
            check(kv == "32000000", f"rank {r}: half the KV budget: {kv}")
            check("--device" not in argv, f"rank {r}: the shard picks its device: {argv}")
    check(la.stop() == 0, "SIGTERM: clean exit")


def test_fake_rank_fails_while_starting(fake_launcher):
    """Rank 1 exits while rank 0 waits for it forever: the launcher does not wait out its 600 s."""
    la, fake_dir = fake_launch(fake_launcher, "fake-fail", ["--num-shard", "2"], {"CUDA_VISIBLE_DEVICES": ""},
                               mode="rank-1-fails")
    check(la.port is None, "not ready")
    code = la.wait()
    err = la.stderr()
    check(code == 1 and "textgen-shard rank 1 exited with status 1 before every part was ready" in err
          and "last lines of textgen-shard rank 1:\n    rank 1 fails on purpose" in err,
          f"rank 1's failure is named with its last lines: {code} {err[-800:]}")
    pid0 = ranks_of(fake_dir, 1)[0]["pid"]
    check(wait_for("rank 0 to be stopped", lambda: not alive(pid0), 10), "rank 0 was stopped")


def test_fake_signal_while_starting(fake_launcher):
    """SIGINT while the ranks load (they never get ready here) stops them at once."""
    la, fake_dir = fake_launch(fake_launcher, "fake-signal", ["--num-shard", "2"], {"CUDA_VISIBLE_DEVICES": ""},
                               mode="never-ready", wait_ready=False)
    started = wait_for("both ranks to start", lambda: la.p.poll() is not None or all(
        os.path.exists(os.path.join(fake_dir, f"rank-{r}.json")) for r in range(2)), 20)
    if not check(started and la.p.poll() is None, f"ranks started, launcher waiting: {la.stderr()[-500:]}"):
        la.stop()
        return
    pids = [info["pid"] for info in ranks_of(fake_dir, 2)]
    start = time.monotonic()
    la.p.send_signal(signal.SIGINT)
    code = la.wait()
    err = la.stderr()
    check(code != 0 and f"signal {int(signal.SIGINT)} before every part was ready" in err and time.monotonic() - start < 20,
          f"SIGINT while the ranks start: stops at once: {code} {err[-500:]}")
    check(wait_for("the ranks to exit", lambda: not any(alive(p) for p in pids), 10), "no orphan rank")


def generate_all(port, prompts):
    out = []
    for prompt in prompts:
        status, body = generate(port, prompt, {"max_new_tokens": 20, "do_sample": False, "details": True,
                                               "decoder_input_details": True})
        out.append((status, body))
    return out


def test_num_shard_2_and_8_match_num_shard_1():
    """Greedy generation with two CPU ranks, and with eight (the demo's 8 query heads one a rank, its
    4 key/value heads each on two ranks: issue 22's TP=8 through the launcher), is the single
    rank's, token for token."""
    prompts = ["To open a file", "The quick brown fox", "def main():\n    ", "Once upon a time, there was"]
    cpu = {"CUDA_VISIBLE_DEVICES": ""}
    runs = {}
    for n in (1, 2, 8):
        la = Launcher(f"tp{n}", ["--num-shard", str(n), "--kv-cache-memory", "64000000"], env=cpu, ready_timeout=240)
        if la.port is None:
            la.wait()
            err = la.stderr()
            if n > 1 and NOT_IMPLEMENTED.search(err):
                results["skipped"].append(f"test_num_shard_2_and_8_match_num_shard_1: the shard refuses WORLD_SIZE {n} ("
                                          + NOT_IMPLEMENTED.search(err).group(0) + ")")
            else:
                check(False, f"--num-shard {n}: launcher ready: {err[-2000:]}")
            if n == 1:
                return
            continue  # the other worlds are still compared
        if n > 1:
            kids = [k for k in la.kids() if "textgen-shard" in open(f"/proc/{k}/cmdline").read()]
            check(len(kids) == n, f"--num-shard {n}: {n} shard processes: {kids}")
        runs[n] = generate_all(la.port, prompts)
        check(la.stop() == 0, f"--num-shard {n}: clean exit")
    for n in (2, 8):
        if n not in runs:
            continue
        for prompt, (s1, b1), (s2, b2) in zip(prompts, runs[1], runs[n]):
            if not check(s1 == 200 and s2 == 200, f"{prompt!r} at {n} ranks: both answer: {s1} {b1} / {s2} {b2}"):
                continue
            d1, d2 = b1["details"], b2["details"]
            check([t["id"] for t in d1["prefill"]] == [t["id"] for t in d2["prefill"]],
                  f"{prompt!r} at {n} ranks: same prefill tokens")
            t1, t2 = [t["id"] for t in d1["tokens"]], [t["id"] for t in d2["tokens"]]
            check(t1 == t2, f"{prompt!r} at {n} ranks: same greedy tokens: {t1} vs {t2}")
            check(b1["generated_text"] == b2["generated_text"], f"{prompt!r} at {n} ranks: same text")
            lp = [abs(a["logprob"] - b["logprob"]) for a, b in zip(d1["tokens"], d2["tokens"])]
            print(f"{prompt!r} at {n} ranks: {len(t1)} tokens equal={t1 == t2}, "
                  f"largest logprob difference {max(lp, default=0):.2e}")


def main():
    test_start_generate_sigterm()
    test_crashed_shard()
    test_refused_flags()
    test_tgi_flags()
    test_kv_cache_fp8_serves()
    test_bad_shard_flags()
    test_bad_shards_only_flags()
    fake_launcher = fake_install()
    test_fake_ranks_on_gpus(fake_launcher)
    test_fake_sharded_takes_every_gpu(fake_launcher)
    test_fake_ranks_on_cpu(fake_launcher)
    test_fake_rank_fails_while_starting(fake_launcher)
    test_fake_signal_while_starting(fake_launcher)
    test_fake_shards_only_two_pods(fake_launcher)
    test_fake_shards_only_cpu(fake_launcher)
    test_num_shard_2_and_8_match_num_shard_1()
    for s in results["skipped"]:
        print("SKIPPED:", s)
    print(f"{results['passed']} passed, {results['failed']} failed, {len(results['skipped'])} skipped")
    if not results["failed"]:
        shutil.rmtree(WORK, ignore_errors=True)
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
