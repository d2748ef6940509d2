#!/usr/bin/env python3
"""Every example command in README.md and docs/*.md (docs/fuzzing.md has its own test), run as written.

Usage: docs_test.py REPO BUILD_DIR

- `make run`, README's first command, runs through the Makefile's own `run` recipe (`make -o build run`:
  the suite has just built, so only the recipe runs) with ARGS for a free port and a private socket
  path; the test waits for the launcher's ready line, runs the curl command it prints, then README's
  three curl examples, checking each answer's shape and that it equals the output README shows, then
  stops it with SIGINT to the process group, as Ctrl-C would.
- Every command in a ```sh or ```console block of those files, and the commands quoted inline that
  COMMANDS lists, must have an entry in COMMANDS: a runner, or a reason it cannot run here (GPU,
  Kubernetes cluster, hub). A command in the docs that has no entry, or an entry no document has any
  more, fails the test, so a new example cannot go untested by accident.
Where a command names a fixed port (3000) or socket path, the test substitutes a free one; `build/`
becomes BUILD_DIR. Prints "N passed, M failed" and exits non-zero on any failure.
"""
import glob
import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

REPO, BUILD = (os.path.abspath(p) for p in sys.argv[1:3])
WORK = tempfile.mkdtemp(prefix="textgen-docs-test-")
FIXTURE = "tests/reference/models/llama-gqa"
results = {"passed": 0, "failed": 0}


def check(cond, what):
    results["passed" if cond else "failed"] += 1
    if not cond:
        print("FAIL:", what, flush=True)
    return cond


def wait_until(what, predicate, timeout):
    """Polls predicate until it returns something truthy; fails naming what it waited for."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.05)
    check(False, f"timed out after {timeout} s waiting for {what} (last: {str(last)[:300]})")
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the documents' commands ------------------------------------------------------------------------
def doc_files():
    docs = sorted(p for p in glob.glob(os.path.join(REPO, "docs", "*.md")) if not p.endswith("fuzzing.md"))
    return [os.path.join(REPO, "README.md")] + docs


def fenced_commands(path):
    """(section, command, expected output) for each command of the file's ```sh and ```console blocks.
    In sh blocks every line is a command (`\\` continues it; `  # ...` is a comment, kept as output);
    in console blocks a command starts with `$ ` and the lines up to the next one are its output."""
    out, section, lang, lines = [], "", None, []
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if lang is None and line.startswith("#"):
            section = line.lstrip("#").strip()
        if line.startswith("```"):
            if lang is None:
                lang, lines = line[3:].strip(), []
                continue
            if lang in ("sh", "console"):
                out += parse_block(lang, lines, section)
            lang = None
            continue
        if lang is not None:
            lines.append(line)
    return out


def parse_block(lang, lines, section):
    cmds, i = [], 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if lang == "console" and not line.startswith("$ "):
            if cmds:
                cmds[-1][2].append(line)
            continue
        if lang == "console":
            line = line[2:]
        if not line.strip():
            continue
        if line.startswith("#"):  # a comment line: what the previous command prints
            if cmds:
                cmds[-1][2].append(line)
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1].rstrip() + " " + lines[i].strip()
            i += 1
        comment = re.search(r"\s{2,}#.*$", line)
        expected = []
        if comment:
            expected.append(comment.group(0).strip())
            line = line[:comment.start()]
        cmds.append([section, line.strip(), expected])
    return [tuple(c) for c in cmds]


def run_shell(cmd, timeout=120, stdin=None):
    """A documented command line, through bash, in the repository root, build/ mapped to BUILD_DIR."""
    cmd = re.sub(r"(?<![\w./-])build/", BUILD + "/", cmd)
    return subprocess.run(["bash", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          input=stdin)


class Server:
    """A long-running documented command; its stdout lines are read on a thread."""

    def __init__(self, argv, name):
        self.name = name
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.lines, self.err = queue.Queue(), []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.err.append), daemon=True).start()
        self.seen = []

    @staticmethod
    def _pump(stream, put):
        for line in stream:
            put(line)

    def wait_line(self, prefix, timeout=120):
        """The first stdout line starting with prefix, or None (the process exited or the time ran out)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if line.startswith(prefix):
                return line.rstrip("\n")
        check(False, f"{self.name}: no line starting {prefix!r} (exit {self.proc.poll()}); stdout "
                     f"{''.join(self.seen)[-500:]!r} stderr {''.join(self.err)[-1500:]!r}")
        return None

    def next_line(self, timeout=10):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return ""
        self.seen.append(line)
        return line.rstrip("\n")

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                check(False, f"{self.name}: still running {timeout} s after signal {sig}")
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def group_alive(pgid):
    """Any process of the group still running (zombies aside)."""
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def running_with(arg):
    """Pids of running processes whose command line contains arg (the launcher's shard and router)."""
    pids = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            if arg.encode() in open(cmdline, "rb").read():
                pids.append(int(cmdline.split("/")[2]))
        except OSError:
            continue
    return [p for p in pids if p != os.getpid()]


def port_of(ready_line):
    return int(ready_line.rsplit(":", 1)[1])


# -- what the README shows, compared with what the server answers ------------------------------------
def same_shape(doc, real, path="$"):
    """Keys and JSON types equal, recursively (null matches anything: optional fields)."""
    if doc is None or real is None:
        return []
    if isinstance(doc, dict):
        if not isinstance(real, dict):
            return [f"{path}: object vs {type(real).__name__}"]
        errs = [f"{path}: keys {sorted(doc)} vs {sorted(real)}"] if set(doc) != set(real) else []
        for k in set(doc) & set(real):
            errs += same_shape(doc[k], real[k], f"{path}.{k}")
        return errs
    if isinstance(doc, list):
        if not isinstance(real, list) or len(doc) != len(real):
            return [f"{path}: list of {len(doc)} vs {real!r:.100}"]
        return [e for i, (a, b) in enumerate(zip(doc, real)) for e in same_shape(a, b, f"{path}[{i}]")]
    number = (int, float)
    if isinstance(doc, number) and isinstance(real, number) and not isinstance(real, bool):
        return []
    return [] if type(doc) is type(real) else [f"{path}: {type(doc).__name__} vs {type(real).__name__}"]


def same_values(doc, real, skip=("created",), path="$"):
    """Equal as shown, floats within 1e-3 (another CPU's BLAS may round differently); skip volatile keys."""
    if isinstance(doc, dict) and isinstance(real, dict):
        return [e for k in doc if k not in skip and k in real for e in same_values(doc[k], real[k], skip, f"{path}.{k}")]
    if isinstance(doc, list) and isinstance(real, list) and len(doc) == len(real):
        return [e for i, (a, b) in enumerate(zip(doc, real)) for e in same_values(a, b, skip, f"{path}[{i}]")]
    if isinstance(doc, float) and isinstance(real, (int, float)):
        return [] if abs(doc - real) <= 1e-3 * max(1.0, abs(doc)) else [f"{path}: {doc} vs {real}"]
    return [] if doc == real else [f"{path}: {doc!r:.120} vs {real!r:.120}"]


def sse_events(text):
    return [json.loads(line[len("data:"):]) for line in text.splitlines() if line.startswith("data:")]


def readme_curl(section, cmd, expected, port):
    """README's console examples: run as written against `make run`'s server; compare with the output shown."""
    real_cmd = cmd.replace("127.0.0.1:3000", f"127.0.0.1:{port}")
    check(real_cmd != cmd, f"{section}: {cmd!r} addresses 127.0.0.1:3000, as `make run` prints")
    r = run_shell(real_cmd)
    if not check(r.returncode == 0, f"{section}: {cmd!r}: exit {r.returncode} {r.stderr[-300:]}"):
        return
    shown = "\n".join(expected).strip()
    body = json.loads(re.search(r"-d '(.*)'", cmd).group(1))
    if "/generate_stream" in cmd:
        doc, real = sse_events(shown), sse_events(r.stdout)
        n = body["parameters"]["max_new_tokens"]
        check(len(real) == n and [e["index"] for e in real] == list(range(1, n + 1)),
              f"{section}: {n} SSE events, indexed 1..{n}: {r.stdout[:500]!r}")
        final = real[-1] if real else {}
        check(final.get("generated_text") == "".join(e["token"]["text"] for e in real) and
              (final.get("details") or {}).get("finish_reason") == "length" and
              (final.get("details") or {}).get("generated_tokens") == n,
              f"{section}: the last event carries the text and details: {final}")
        errs = same_shape(doc, real) + same_values(doc, real)
    elif "/v1/chat/completions" in cmd:
        doc, real = json.loads(shown), json.loads(r.stdout)
        content = real.get("choices", [{}])[0].get("message", {}).get("content")
        try:
            value = json.loads(content)
        except (TypeError, ValueError):
            value = None
        schema = body["response_format"]["json_schema"]["schema"]
        check(real.get("object") == "chat.completion" and isinstance(value, dict) and
              set(schema["required"]) <= set(value) and real["choices"][0]["finish_reason"] == "stop",
              f"{section}: a chat completion whose content is JSON of the schema: {real}")
        errs = same_shape(doc, real) + same_values(doc, real, skip=("created", "id"))
    elif "/v1/completions" in cmd:
        doc, real = json.loads(shown), json.loads(r.stdout)
        check(real.get("object") == "text_completion" and real.get("model") == body["model"] and
              real.get("usage", {}).get("completion_tokens") == body["max_tokens"] and
              isinstance(real.get("choices", [{}])[0].get("text"), str),
              f"{section}: an OpenAI text completion: {real}")
        errs = same_shape(doc, real) + same_values(doc, real)
    else:
        doc, real = json.loads(shown), json.loads(r.stdout)
        check(isinstance(real, dict) and isinstance(real.get("generated_text"), str) and real["generated_text"],
              f"{section}: /generate with README's body returns generated_text: {r.stdout[:300]!r}")
        errs = same_shape(doc, real) + same_values(doc, real)
    check(not errs, f"{section}: the answer to {cmd[:60]!r}... differs from README's: {errs[:5]}")


# -- runners -----------------------------------------------------------------------------------------
def make_run(args, name):
    """`make run` as the Makefile's recipe runs it (the build step is the suite's own, done)."""
    uds = os.path.join(WORK, f"{name}-shard")
    recipe = subprocess.run(["make", "-n", "-o", "build", "run", f"BUILD_DIR={BUILD}",
                             f"ARGS={args} --port 0 --hostname 127.0.0.1 --shard-uds-path {uds}"],
                            cwd=REPO, capture_output=True, text=True).stdout.strip()
    print(f"make run's recipe: {recipe}", flush=True)
    srv = Server(["make", "-s", "-o", "build", "run", f"BUILD_DIR={BUILD}",
                  f"ARGS={args} --port 0 --hostname 127.0.0.1 --shard-uds-path {uds}"], name)
    srv.uds = uds
    return srv


def run_make_run_demo(section, cmd, expected, docs):
    """README `make run`: the demo model; the curl command it prints; README's curl examples; Ctrl-C."""
    srv = make_run("", "make-run")
    try:
        ready = srv.wait_line("textgen-launcher ready ")
        if not check(ready is not None, f"{section}: `make run` serves"):
            return
        port = port_of(ready)
        hint = srv.next_line()
        curl = srv.next_line().strip()
        check(hint.startswith("serving textgen-demo; try:") and curl.startswith("curl "),
              f"{section}: `make run` prints a curl command: {hint!r} {curl!r}")
        r = run_shell(curl + " -s")
        out = json.loads(r.stdout or "{}") if r.returncode == 0 else {}
        check(isinstance(out.get("generated_text"), str) and out["generated_text"],
              f"the printed curl command works: {curl!r} -> {r.returncode} {r.stdout[:200]!r} {r.stderr[-200:]!r}")
        console = [(sec, c, exp) for d, sec, c, exp in docs if d == "README.md" and c.startswith("curl ") and "127.0.0.1:3000/" in c]
        check(len(console) == 4, f"README shows four curl examples: {[c[1][:40] for c in console]}")
        for sec, c, exp in console:
            readme_curl(sec, c, exp, port)
    finally:
        # Ctrl-C: SIGINT to the foreground process group (make, the launcher, its children).
        srv.stop(signal.SIGINT)
    check(wait_until("every process of `make run` to exit after Ctrl-C",
                     lambda: not group_alive(srv.proc.pid) and not running_with(srv.uds), 60)
          is not None, f"{section}: Ctrl-C stops `make run` and everything it started: {running_with(srv.uds)}")


def generate_ok(port, what):
    r = run_shell(f"curl -s 127.0.0.1:{port}/generate -X POST -H 'Content-Type: application/json' "
                  "-d '{\"inputs\":\"Hello\",\"parameters\":{\"max_new_tokens\":4}}'")
    try:
        ok = r.returncode == 0 and isinstance(json.loads(r.stdout).get("generated_text"), str)
    except ValueError:
        ok = False
    check(ok, f"{what}: /generate answers: {r.returncode} {r.stdout[:200]!r}")


def model_id_of(port):
    r = run_shell(f"curl -s 127.0.0.1:{port}/info")
    try:
        return json.loads(r.stdout).get("model_id")
    except ValueError:
        return None


def run_make_run_local_model(section, cmd, expected, docs):
    """README `make run ARGS="--model-id /path/to/model"`, with a local fixture for the path."""
    args = re.search(r'ARGS="([^"]*)"', cmd).group(1).replace("/path/to/model", os.path.join(REPO, FIXTURE))
    srv = make_run(args, "make-run-model")
    try:
        ready = srv.wait_line("textgen-launcher ready ")
        if check(ready is not None, f"{section}: {cmd}"):
            port = port_of(ready)
            check(model_id_of(port) == os.path.join(REPO, FIXTURE), f"{section}: serves the given directory")
            generate_ok(port, cmd)
    finally:
        srv.stop()


def run_launcher(section, cmd, expected, docs):
    """docs/launcher.md: build/textgen-launcher [--model-id /path/to/model] on a free port."""
    argv = shlex.split(cmd.replace("/path/to/model", os.path.join(REPO, FIXTURE)))
    argv[0] = os.path.join(BUILD, argv[0][len("build/"):])
    uds = os.path.join(WORK, "launcher-shard")
    srv = Server(argv + ["--port", "0", "--hostname", "127.0.0.1", "--shard-uds-path", uds], cmd)
    try:
        ready = srv.wait_line("textgen-launcher ready ")
        if check(ready is not None, f"{section}: {cmd}"):
            port = port_of(ready)
            want = os.path.join(REPO, FIXTURE) if "--model-id" in cmd else "textgen-demo"
            check(model_id_of(port) == want, f"{section}: {cmd} serves {want} ({expected})")
            generate_ok(port, cmd)
    finally:
        check(srv.stop() == 0, f"{section}: {cmd}: SIGTERM, exit 0")


def run_launcher_medusa(section, cmd, expected, docs):
    """docs/speculation.md: build/textgen-launcher --model-id models/demo-medusa (the demo model
    served with its Medusa heads) on a free port."""
    medusa = os.path.join(REPO, "models", "demo-medusa")
    argv = shlex.split(cmd.replace("models/demo-medusa", medusa))
    argv[0] = os.path.join(BUILD, argv[0][len("build/"):])
    uds = os.path.join(WORK, "launcher-medusa-shard")
    srv = Server(argv + ["--port", "0", "--hostname", "127.0.0.1", "--shard-uds-path", uds], cmd)
    try:
        ready = srv.wait_line("textgen-launcher ready ")
        if check(ready is not None, f"{section}: {cmd}"):
            port = port_of(ready)
            check(model_id_of(port) == medusa, f"{section}: {cmd} serves {medusa}")
            generate_ok(port, cmd)
    finally:
        check(srv.stop() == 0, f"{section}: {cmd}: SIGTERM, exit 0")


def run_shard_doc(section, cmd, expected, docs):
    """docs/shard.md: the shard command; its ready line as the comment under it says."""
    uds = os.path.join(WORK, "textgen-server")
    argv = shlex.split(cmd.replace("/tmp/textgen-server", uds))
    argv[0] = os.path.join(BUILD, argv[0][len("build/"):])
    srv = Server(argv, cmd)
    try:
        m = re.search(r'prints "([^"]*)"', " ".join(expected))
        want = m.group(1).replace("/tmp/textgen-server", uds) if m else "?"
        line = srv.wait_line("textgen-shard ready ")
        check(line == want, f"{section}: the shard prints {want!r}: got {line!r}")
    finally:
        srv.stop()


ROUTER_BLOCK = []  # docs/router.md's three lines, run together by the last


def run_router_doc(section, cmd, expected, docs):
    """docs/router.md: a shard in the background, a router over its socket, then curl."""
    ROUTER_BLOCK.append(cmd)
    if not cmd.startswith("curl"):
        return
    shard_cmd, router_cmd, curl = ROUTER_BLOCK
    uds = os.path.join(WORK, "tg")
    servers = []
    try:
        argv = shlex.split(shard_cmd.rstrip("& ").replace("/tmp/tg", uds))
        argv[0] = os.path.join(BUILD, argv[0][len("build/"):])
        servers.append(Server(argv, "router.md shard"))
        if not check(servers[0].wait_line("textgen-shard ready ") is not None, f"{section}: {shard_cmd}"):
            return
        argv = shlex.split(router_cmd.replace("/tmp/tg", uds).replace("--port 3000", "--port 0"))
        argv[0] = os.path.join(BUILD, argv[0][len("build/"):])
        servers.append(Server(argv, "router.md router"))
        ready = servers[1].wait_line("textgen-router ready ")
        if not check(ready is not None, f"{section}: {router_cmd}"):
            return
        r = run_shell(curl.replace("localhost:3000", f"localhost:{port_of(ready)}") + " -s")
        try:
            body = json.loads(r.stdout)
        except ValueError:
            body = {}
        check(r.returncode == 0 and isinstance(body.get("generated_text"), str),
              f"{section}: {curl}: {r.returncode} {r.stdout[:300]!r}")
    finally:
        for s in reversed(servers):
            s.stop()


def run_tokenize(section, cmd, expected, docs):
    """docs/tokenizer.md: encode "Hello world" with the llama3 fixture, then decode those ids back."""
    if "--decode" not in cmd:
        r = run_shell(cmd)
        out = json.loads(r.stdout or "{}") if r.returncode == 0 else {}
        check(out.get("tokens", [None])[-2:] == ["Hello", "Ġworld"], f"{section}: {cmd}: {r.stdout[:300]!r}")
        return
    ids = json.loads(re.match(r"echo '([^']*)'", cmd).group(1))
    r0 = run_shell(f"echo '\"Hello world\"' | build/tokenizer/textgen-tokenize --tokenizer "
                   "tests/reference/tokenizers/llama3")
    check(r0.returncode == 0 and json.loads(r0.stdout)["ids"] == ids,
          f"{section}: the ids decoded are those the encode example prints: {ids} vs {r0.stdout[:100]!r}")
    r = run_shell(cmd)
    want = "Hello world" if "--no-special" in cmd else "<|begin_of_text|>Hello world"
    check(r.returncode == 0 and json.loads(r.stdout or "{}").get("text") == want,
          f"{section}: {cmd}: {r.stdout!r} {r.stderr[-200:]!r} (want {want!r})")


def run_watermark_doc(section, cmd, expected, docs):
    """docs/speculation.md: the detector on a line of text; it prints a z-score."""
    r = run_shell(cmd)
    check(r.returncode == 0 and "z-score" in r.stdout and "tokens scored" in r.stdout,
          f"{section}: {cmd}: {r.stdout[-200:]!r} {r.stderr[-200:]!r}")


def run_operator_render(section, cmd, expected, docs):
    """README: `textgen-operator render FILE`, offline, on the example the README applies."""
    exe = os.path.join(BUILD, "textgen-operator")
    r = subprocess.run([exe, "render", "manifests/examples/llama-2-7b.yaml"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    kinds = re.findall(r"^kind: (\w+)", r.stdout, re.M) or re.findall(r'"kind":\s*"(\w+)"', r.stdout)
    check(r.returncode == 0 and {"StatefulSet", "Deployment", "Service"} <= set(kinds),
          f"{section}: textgen-operator render manifests/examples/llama-2-7b.yaml: {r.returncode} {kinds} "
          f"{r.stderr[-300:]!r}")


def check_kubectl_get_tgs(section, cmd, expected, docs):
    """README `kubectl get tgs`: no cluster here, but the columns shown are the CRD's short name and
    printer columns (kubectl prints NAME, then the columns)."""
    import yaml
    crd = yaml.safe_load(open(os.path.join(REPO, "charts/textgen/crds/textgen.dev_textgenerationservices.yaml")))
    version = crd["spec"]["versions"][0]
    cols = ["NAME"] + [c["name"].upper() for c in version.get("additionalPrinterColumns", [])
                       if not c.get("priority")]
    shown = " ".join(expected).lstrip("#").split()
    check("tgs" in crd["spec"]["names"].get("shortNames", []) and shown == cols,
          f"{section}: `kubectl get tgs` columns {shown} vs the CRD's {cols}")


def skip(reason):
    def f(section, cmd, expected, docs):
        print(f"SKIP {section}: {cmd} — {reason}", flush=True)
    f.skip = reason
    return f


CLUSTER = skip("needs a Kubernetes cluster (none can run here: ../shared/notes/kubernetes-test-server.md); "
               "the chart and the operator's objects are tested by integration.chart and integration.operator")
HUB = skip("downloads from the hub (unreachable from here); the hub protocol is tested by integration.hub "
           "against a local server with the hub's URL layout")
GPU = skip("runs on the GPU machine (docs/gpu.md), not in this suite")
BENCH = skip("a benchmark (minutes on 2 cores; it measures, never asserts: bench/README.md)")

# (document, command as written) -> runner. Fenced commands are found by fenced_commands(); the
# inline ones (quoted in prose) are listed here and must still appear verbatim in their document.
COMMANDS = {
    # README.md "Set up (fresh Debian 12)"
    ("README.md", "make run"): run_make_run_demo,
    ("README.md", "make test"): skip("the suite this test belongs to (make test -> tools/run-tests.sh -> ctest)"),
    # README.md "Set up": the console block, run by run_make_run_demo against `make run`'s server
    ("README.md", "curl 127.0.0.1:3000/generate -X POST -H 'Content-Type: application/json' -d "
                  "'{\"inputs\":\"To open a file\",\"parameters\":{\"max_new_tokens\":24}}'"): None,
    ("README.md", "curl -N 127.0.0.1:3000/generate_stream -X POST -H 'Content-Type: application/json' -d "
                  "'{\"inputs\":\"A list comprehension\",\"parameters\":{\"max_new_tokens\":4,\"details\":true}}'"): None,
    ("README.md", "curl 127.0.0.1:3000/v1/completions -H 'Content-Type: application/json' -d "
                  "'{\"model\":\"textgen-demo\",\"prompt\":\"The Python interpreter\",\"max_tokens\":16,"
                  "\"temperature\":0}'"): None,
    ("README.md", "curl 127.0.0.1:3000/v1/chat/completions -H 'Content-Type: application/json' -d "
                  "'{\"model\":\"textgen-demo\",\"messages\":[{\"role\":\"user\",\"content\":\"Which keyword "
                  "defines a function?\"}],\"max_tokens\":32,\"temperature\":0,\"response_format\":{\"type\":"
                  "\"json_schema\",\"json_schema\":{\"name\":\"answer\",\"schema\":{\"type\":\"object\","
                  "\"properties\":{\"keyword\":{\"type\":\"string\",\"maxLength\":8},\"builtin\":{\"type\":"
                  "\"boolean\"}},\"required\":[\"keyword\",\"builtin\"]}}}}'"): None,
    # README.md "Set up", inline
    ("README.md", 'make run ARGS="--model-id /path/to/model"'): run_make_run_local_model,
    ("README.md", 'make run ARGS="--model-id org/name"'): HUB,
    # README.md "Kubernetes"
    ("README.md", "helm install textgen charts/textgen --namespace textgen-system --create-namespace"): CLUSTER,
    ("README.md", "kubectl create secret generic hf-token --from-literal=HF_TOKEN=hf_..."): CLUSTER,
    ("README.md", "kubectl apply -f manifests/examples/llama-2-7b.yaml"): CLUSTER,
    ("README.md", "kubectl get tgs"): check_kubectl_get_tgs,
    ("README.md", "kubectl run -it --rm q --image=curlimages/curl --restart=Never -- curl -s "
                  "http://llama-2-7b/generate -H 'Content-Type: application/json' -d "
                  "'{\"inputs\":\"What is Kubernetes?\",\"parameters\":{\"max_new_tokens\":32}}'"): CLUSTER,
    ("README.md", "kubectl scale tgs/llama-2-7b --replicas=3"): CLUSTER,
    ("README.md", "textgen-operator render FILE"): run_operator_render,
    # docs/gpu.md
    ("gpu.md", "make gpu-pack"): skip("packs the GPU build for the GPU machine, where its output runs (docs/gpu.md)"),
    ("gpu.md", "tar xJf .gpu.txz && bash .gpu/gpu-run.sh"): GPU,
    ("gpu.md", "tar xJf .gpu.txz && bash .gpu/gpu-run.sh --tests"): GPU,
    ("gpu.md", "bash .gpu/gpu-run.sh --record"): GPU,
    # docs/launcher.md
    ("launcher.md", "build/textgen-launcher"): run_launcher,
    ("launcher.md", "build/textgen-launcher --model-id /path/to/model"): run_launcher,
    ("launcher.md", "build/textgen-launcher --model-id org/name --revision main"): HUB,
    ("launcher.md", "build/textgen-launcher download-weights org/name"): HUB,
    # docs/quantization.md
    ("quantization.md", "cmake --build build --target bench_perplexity"):
        skip("builds the benchmark, which the suite's build already holds"),
    ("quantization.md", "build/bench/bench_perplexity --model models/demo --text "
                        "bench/data/python-3.11-docs-heldout.txt --documents --window 256 --quantize all "
                        "--threads 1"):
        skip("a benchmark (about 5 minutes on 2 cores); integration.perplexity_cli runs it on a short text"),
    # docs/router.md (one block: shard in the background, router, curl)
    ("router.md", "build/textgen-shard  --model-id tests/reference/models/llama-gqa --uds-path /tmp/tg &"):
        run_router_doc,
    ("router.md", "build/textgen-router --tokenizer-name tests/reference/models/llama-gqa "
                  "--master-shard-uds-path /tmp/tg-0 --port 3000"): run_router_doc,
    ("router.md", "curl localhost:3000/generate -H 'Content-Type: application/json' "
                  "-d '{\"inputs\":\"The quick brown fox\",\"parameters\":{\"max_new_tokens\":8}}'"): run_router_doc,
    ("router.md", "python3 bench/router/router_bench.py build tests/reference/models/llama-gqa"): BENCH,
    # docs/speculation.md
    ("speculation.md", "build/textgen-launcher --speculate 4"): run_launcher,
    ("speculation.md", "build/bench/bench_speculation --backend cpu --speculate 4 --tokens 64 --repeat 1"): BENCH,
    ("speculation.md", "build/textgen-launcher --model-id models/demo-medusa"): run_launcher_medusa,
    ("speculation.md", "build/bench/bench_speculation --backend cpu --medusa models/demo-medusa "
                       "--speculate 4 --tokens 64 --repeat 1"): BENCH,
    ("speculation.md", 'echo "The Python interpreter is a program that reads Python code." | '
                       "build/textgen-watermark detect --model-id models/demo"): run_watermark_doc,
    # docs/shard.md
    ("shard.md", "build/textgen-shard --model-id tests/reference/models/llama-gqa --uds-path /tmp/textgen-server"):
        run_shard_doc,
    ("shard.md", "build/bench/bench_cpu_model --fixture tests/reference/models/llama-gqa"): BENCH,
    # docs/tokenizer.md
    ("tokenizer.md", "echo '\"Hello world\"' | build/tokenizer/textgen-tokenize --tokenizer "
                     "tests/reference/tokenizers/llama3"): run_tokenize,
    ("tokenizer.md", "echo '[0, 738, 373]' | build/tokenizer/textgen-tokenize --tokenizer "
                     "tests/reference/tokenizers/llama3 --decode"): run_tokenize,
    ("tokenizer.md", "echo '[0, 738, 373]' | build/tokenizer/textgen-tokenize --tokenizer "
                     "tests/reference/tokenizers/llama3 --decode --no-special"): run_tokenize,
}


def main():
    found = []  # (doc, section, command, expected)
    for path in doc_files():
        for section, cmd, expected in fenced_commands(path):
            found.append((os.path.basename(path), f"{os.path.basename(path)} \"{section}\"", cmd, expected))
    texts = {os.path.basename(p): open(p, encoding="utf-8").read() for p in doc_files()}
    fenced = {(d, c) for d, _, c, _ in found}
    for key in COMMANDS:
        if key not in fenced:
            if check(f"`{key[1]}`" in texts.get(key[0], ""), f"{key[0]}: no longer shows `{key[1]}`: update COMMANDS"):
                found.append((key[0], f"{key[0]} (inline)", key[1], []))
    for d, _, c, _ in found:
        check((d, c) in COMMANDS, f"{d}: command without an entry in docs_test.py's COMMANDS: {c!r}")
    skipped = 0
    for d, sec, c, exp in found:
        runner = COMMANDS.get((d, c))
        if runner is None:
            continue  # README's console examples: run_make_run_demo runs them against `make run`
        skipped += bool(getattr(runner, "skip", None))
        try:
            runner(sec, c, exp, found)
        except Exception as e:  # a runner's crash fails that command, not the others
            check(False, f"{sec}: {c!r}: {type(e).__name__}: {e}")
    print(f"{results['passed']} passed, {results['failed']} failed, {skipped} commands skipped (reasons above)")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
