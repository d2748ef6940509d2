#!/usr/bin/env python3
"""OpenTelemetry traces end to end against a real OTLP/gRPC receiver (python3-grpcio, a generic
handler; the OTLP messages decoded with classes protoc writes from proto/textgen/otlp/v1 at test
time): textgen-launcher --otlp-endpoint on the demo model. Checks TGI's span names and their tree —
the request span (generate, generate_stream, chat_completions) under the client's W3C traceparent,
validate/queue/infer/send beneath it, the router's prefill/decode step spans under infer, and the
shards' prefill/decode spans under those (the context carried in gRPC metadata), with batch sizes;
an unsampled traceparent records nothing; a refused request's span is an error. With the collector
down, requests are served as fast and the dropped spans are counted in /metrics. Bad --otlp-*
values stop the router and the shard with a message.
Usage: otlp_test.py LAUNCHER ROUTER SHARD PROTOC REPO"""
import concurrent.futures
import http.client
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

LAUNCHER, ROUTER, SHARD, PROTOC, REPO = sys.argv[1:6]
WORK = tempfile.mkdtemp(prefix="textgen-otlp-test-")
results = {"passed": 0, "failed": 0}


def check(cond, what):
    results["passed" if cond else "failed"] += 1
    if not cond:
        print("FAIL:", what, flush=True)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The OTLP messages, from the repository's .proto, written by protoc for this run.
subprocess.run([PROTOC, f"--proto_path={REPO}/proto", f"--python_out={WORK}",
                f"{REPO}/proto/textgen/otlp/v1/trace_service.proto"], check=True)
sys.path.insert(0, WORK)
try:
    import google.protobuf  # noqa: F401
    import grpc
except ImportError:
    # Debian's python3-grpcio and python3-protobuf (tools/install-deps.sh), for an interpreter
    # other than Debian's own (a CPython of the same minor version).
    sys.path.append("/usr/lib/python3/dist-packages")
    import grpc
otlp = importlib.import_module("textgen.otlp.v1.trace_service_pb2")

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class Receiver:
    """An OTLP/gRPC trace receiver: keeps every span with its resource's service.name."""

    def __init__(self):
        self.spans = []  # (service name, Span)
        self.raw = []  # each export's bytes, for bench/serve/otlp_sink.py's own decoder
        self.lock = threading.Lock()
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Export": grpc.unary_unary_rpc_method_handler(
                self.export, request_deserializer=otlp.ExportTraceServiceRequest.FromString,
                response_serializer=otlp.ExportTraceServiceResponse.SerializeToString)})
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def export(self, request, context):
        with self.lock:
            self.raw.append(request.SerializeToString())
            for rs in request.resource_spans:
                attrs = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        self.spans.append((attrs.get("service.name"), span))
        return otlp.ExportTraceServiceResponse()

    def trace(self, trace_id):
        with self.lock:
            return [(svc, s) for svc, s in self.spans if s.trace_id == trace_id]

    def wait(self, fn, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if fn():
                return True
            time.sleep(0.1)
        return fn()


class Launcher:
    def __init__(self, name, args):
        self.uds = os.path.join(WORK, name, "server")
        os.makedirs(os.path.dirname(self.uds), exist_ok=True)
        self.err_path = self.uds + ".stderr"
        self.err = open(self.err_path, "w")
        self.p = subprocess.Popen([LAUNCHER, "--model-id", f"{REPO}/models/demo", "--port", "0",
                                   "--hostname", "127.0.0.1", "--shard-uds-path", self.uds,
                                   "--master-port", str(free_port()), "--kv-cache-memory", "64000000",
                                   "--log-level", "warn", *args],
                                  stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.port = None
        timer = threading.Timer(120, self.p.kill)
        timer.start()
        for line in self.p.stdout:
            if line.startswith("textgen-launcher ready "):
                self.port = int(line.rsplit(":", 1)[1])
                break
        timer.cancel()

    def stderr(self):
        with open(self.err_path) as f:
            return f.read()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        code = self.p.wait(timeout=30)
        self.err.close()
        return code


def post(port, path, body, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    return r.status, r.read().decode()


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read().decode()


def attr(span, key):
    for kv in span.attributes:
        if kv.key == key:
            v = kv.value
            return getattr(v, v.WhichOneof("value"))
    return None


def within(child, parent):
    return parent.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano <= parent.end_time_unix_nano


SERVER, CLIENT = otlp.Span.SPAN_KIND_SERVER, otlp.Span.SPAN_KIND_CLIENT
ERROR = otlp.Status.STATUS_CODE_ERROR


def test_traces(rx):
    la = Launcher("traced", ["--otlp-endpoint", f"http://127.0.0.1:{rx.port}", "--otlp-service-name", "textgen-test"])
    if not check(la.port, f"launcher ready with --otlp-endpoint: {la.stderr()[-2000:]}"):
        la.stop()
        return
    try:
        trace_hex, parent_hex = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        tid, pid = bytes.fromhex(trace_hex), bytes.fromhex(parent_hex)
        status, body = post(la.port, "/generate", {"inputs": "To open a file", "parameters": {"max_new_tokens": 6}},
                            {"traceparent": f"00-{trace_hex}-{parent_hex}-01"})
        check(status == 200, f"/generate with a traceparent: {status} {body}")

        # The whole tree: 5 request-level spans, and per step a router span and a shard span.
        def complete():
            names = [s.name for _, s in rx.trace(tid)]
            return "generate" in names and names.count("decode") >= 2 * 5 and names.count("prefill") >= 2
        check(rx.wait(complete), f"spans of the traced request arrive: {sorted(s.name for _, s in rx.trace(tid))}")
        spans = [s for _, s in rx.trace(tid)]
        services = {svc for svc, _ in rx.trace(tid)}
        check(services == {"textgen-test"}, f"router and shards report --otlp-service-name: {services}")
        by_name = {}
        for s in spans:
            by_name.setdefault(s.name, []).append(s)
        req = by_name.get("generate", [None])[0]
        if not check(req is not None, "a generate span"):
            return
        check(req.parent_span_id == pid and req.kind == SERVER,
              f"generate is a server span under the client's traceparent ({req.parent_span_id.hex()})")
        check(req.flags == 0x301, f"its parent is remote and it is sampled (flags {req.flags:#x})")
        check(attr(req, "input_length") and attr(req, "generated_tokens") == 6,
              f"generate carries input_length and generated_tokens: {req.attributes}")
        for name in ("validate", "queue", "infer", "send"):
            kids = by_name.get(name, [])
            check(len(kids) == 1 and kids[0].parent_span_id == req.span_id and within(kids[0], req),
                  f"one {name} span beneath generate, within its time")
        infer = by_name.get("infer", [None])[0]
        if infer is None:
            return
        v, q = by_name["validate"][0], by_name["queue"][0]
        check(v.end_time_unix_nano <= q.start_time_unix_nano + 1_000_000 and q.end_time_unix_nano <= infer.start_time_unix_nano + 1_000_000,
              "validate, then queue, then infer")
        router_steps = [s for s in spans if s.name in ("prefill", "decode") and s.kind == CLIENT]
        shard_steps = [s for s in spans if s.name in ("prefill", "decode") and s.kind == SERVER]
        check(router_steps and all(s.parent_span_id == infer.span_id for s in router_steps),
              f"the router's step spans hang under infer ({len(router_steps)})")
        check([s.name for s in sorted(router_steps, key=lambda s: s.start_time_unix_nano)][0] == "prefill",
              "the first step is a prefill")
        ids = {s.span_id: s for s in router_steps}
        check(len(shard_steps) == len(router_steps) and
              all(s.parent_span_id in ids and ids[s.parent_span_id].name == s.name for s in shard_steps),
              f"each router step has the shard's span beneath it, carried in gRPC metadata "
              f"({len(shard_steps)} shard, {len(router_steps)} router)")
        check(all(attr(s, "batch_size") == 1 for s in router_steps + shard_steps), "steps carry batch_size 1")
        check(all(s.flags == 0x101 for s in router_steps) and all(s.flags == 0x301 for s in shard_steps),
              "router steps have a local parent, the shards' spans a remote one (OTLP span flags)")
        check(all(within(s, ids[s.parent_span_id]) for s in shard_steps if s.parent_span_id in ids),
              "a shard's span lies within its router step")
        check(len({s.span_id for s in spans}) == len(spans), "span ids are unique")

        # bench/serve/otlp_sink.py's hand decoder reads the same spans, and its legs pair each shard
        # span with its router step (what `--legs` reports).
        sys.path.insert(0, os.path.join(REPO, "bench", "serve"))
        sink = importlib.import_module("otlp_sink")
        with rx.lock:
            decoded = [d for raw in rx.raw for d in sink.decode_spans(raw)]
        mine = [d for d in decoded if d.get("trace_id") == trace_hex]
        want = sorted((s.span_id.hex(), s.parent_span_id.hex(), s.name, s.kind, s.start_time_unix_nano,
                       s.end_time_unix_nano) for s in spans)
        got = sorted((d["span_id"], d.get("parent", ""), d["name"], d["kind"], d["start"], d["end"]) for d in mine)
        check(got == want, f"otlp_sink decodes the spans as protoc's classes do ({len(got)} / {len(want)})")
        legs = sink.legs(mine)
        check(legs.get("prefill", {}).get("calls") == len([s for s in shard_steps if s.name == "prefill"]) and
              legs.get("decode", {}).get("calls") == len([s for s in shard_steps if s.name == "decode"]) and
              all(v[k]["p50"] >= 0 for v in legs.values() for k in ("request_us", "response_us", "handler_us")),
              f"otlp_sink's legs pair every shard step with its router step: {legs}")

        # generate_stream without a traceparent: a new trace, a root span.
        status, body = post(la.port, "/generate_stream", {"inputs": "Hello", "parameters": {"max_new_tokens": 3}})
        check(status == 200 and "generated_text" in body, f"/generate_stream: {status}")
        roots = lambda name: [s for _, s in rx.spans if s.name == name and not s.parent_span_id]  # noqa: E731
        check(rx.wait(lambda: roots("generate_stream")), "a root generate_stream span")

        # chat_completions
        status, body = post(la.port, "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        if status == 200:
            check(rx.wait(lambda: roots("chat_completions")), "a chat_completions span")
        else:
            check("chat template" in body, f"/v1/chat/completions: {status} {body[:200]}")

        # An unsampled traceparent: nothing recorded for its trace (the request is served).
        quiet = "0af7651916cd43dd8448eb211c80319c"
        status, _ = post(la.port, "/generate", {"inputs": "x", "parameters": {"max_new_tokens": 2}},
                         {"traceparent": f"00-{quiet}-b7ad6b7169203331-00"})
        check(status == 200, "an unsampled request is served")
        # A refused request: its span is an error, with the message.
        status, _ = post(la.port, "/generate", {"inputs": "x", "parameters": {"max_new_tokens": 2, "temperature": -1}},
                         {"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"})
        check(status == 422, f"a bad request is refused: {status}")
        bad = bytes.fromhex("11111111111111111111111111111111")
        check(rx.wait(lambda: any(s.name == "generate" for _, s in rx.trace(bad))), "the refused request's span arrives")
        refused = [s for _, s in rx.trace(bad) if s.name == "generate"]
        check(refused and refused[0].status.code == ERROR and "temperature" in refused[0].status.message,
              f"a refused request's span is an error naming why: {refused[0].status if refused else None}")
        check([s.name for _, s in rx.trace(bad)].count("queue") == 0, "a refused request never queued")
        # A malformed traceparent starts a new trace rather than failing the request.
        status, _ = post(la.port, "/generate", {"inputs": "x", "parameters": {"max_new_tokens": 2}},
                         {"traceparent": "00-XYZ-bad-01"})
        check(status == 200, "a malformed traceparent is ignored")
        time.sleep(2.5)  # two export periods
        check(rx.trace(bytes.fromhex(quiet)) == [], "nothing recorded under an unsampled traceparent")
        status, metrics = get(la.port, "/metrics")
        exported = [line for line in metrics.splitlines() if line.startswith("textgen_otlp_spans_exported_total ")]
        check(exported and float(exported[0].split()[1]) > 0, f"exported spans counted: {exported}")
    finally:
        check(la.stop() == 0, "clean exit with tracing on")


def test_collector_down():
    dead = free_port()  # nothing listens there
    la = Launcher("down", ["--otlp-endpoint", f"127.0.0.1:{dead}"])
    if not check(la.port, f"launcher ready with the collector down: {la.stderr()[-2000:]}"):
        la.stop()
        return
    try:
        start = time.monotonic()
        for _ in range(5):
            status, _ = post(la.port, "/generate", {"inputs": "To open a file", "parameters": {"max_new_tokens": 4}})
            check(status == 200, "served with the collector down")
        check(time.monotonic() - start < 20, "serving does not wait on the collector")
        deadline = time.monotonic() + 15
        dropped = 0
        while time.monotonic() < deadline and dropped == 0:
            time.sleep(0.5)
            _, metrics = get(la.port, "/metrics")
            for line in metrics.splitlines():
                if line.startswith("textgen_otlp_spans_dropped_total "):
                    dropped = float(line.split()[1])
        check(dropped > 0, f"dropped spans counted in /metrics: {dropped}")
    finally:
        check(la.stop() == 0, "clean exit with the collector down")


def test_bad_flags():
    for args in (["--otlp-endpoint", "ftp://collector:4317"], ["--otlp-endpoint", "http://collector"],
                 ["--otlp-endpoint", "http://collector:4317/v1/traces"], ["--otlp-service-name", ""]):
        r = subprocess.run([ROUTER, "--tokenizer-name", f"{REPO}/models/demo", *args], capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and "otlp" in r.stderr, f"router refuses {args}: {r.returncode} {r.stderr[-300:]}")
        r = subprocess.run([SHARD, "--model-id", f"{REPO}/models/demo", *args], capture_output=True, text=True, timeout=30)
        check(r.returncode != 0 and "otlp" in r.stderr, f"shard refuses {args}: {r.returncode} {r.stderr[-300:]}")


def main():
    rx = Receiver()
    try:
        test_bad_flags()
        test_traces(rx)
        test_collector_down()
    finally:
        rx.server.stop(0)
    print(f"otlp: {results['passed']} passed, {results['failed']} failed", flush=True)
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
