#!/usr/bin/env python3
"""A minimal OTLP/gRPC trace receiver (no collector is packaged in Debian): accepts
TraceService/Export on 127.0.0.1:PORT, counts spans and requests, and prints the counts as a JSON
line on SIGTERM/SIGINT. For measuring tracing's cost on the serving path (bench/README.md):

    python3 bench/serve/otlp_sink.py --port 4317 &
    python3 bench/serve/serve_bench.py ... -- --otlp-endpoint http://127.0.0.1:4317

By default it decodes nothing (the request bytes are counted by a cheap protobuf walk of the
top-level fields), so it costs the server as little as a collector would. With `--legs` it also
decodes each span's ids, name, kind and times, pairs every shard's step span (server kind) with the
router's step span it is the child of (client kind: one Prefill or Decode call), and adds to the JSON
line, per method, where a call's time beyond the shard's handler went: `request` (the router's span
start to the shard handler's start: the router's protobuf encoding, gRPC, the shard's wake-up) and
`response` (the handler's end to the router's span end: the response's way back and its decoding),
p50 / mean / p99 in microseconds. Both clocks are the host's realtime clock, so this holds for
processes on one machine. SIGUSR1 prints the legs of the spans received so far and forgets them
(tools/gpu-serve.sh's OTLP_LEGS=1 sends it after each workload). `--dump FILE` writes every decoded span as a JSON line. Needs
python3-grpcio."""
import argparse
import concurrent.futures
import json
import signal
import sys
import threading

try:
    import grpc
except ImportError:  # Debian's python3-grpcio for another CPython 3.11
    sys.path.append("/usr/lib/python3/dist-packages")
    import grpc

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


def varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def fields(b):
    """(field number, payload) of the length-delimited fields of a protobuf message."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        wire = key & 7
        if wire == 2:
            n, i = varint(b, i)
            yield key >> 3, b[i:i + n]
            i += n
        elif wire == 0:
            _, i = varint(b, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError("unsupported wire type")


def scalars(b):
    """(field number, wire type, value) of every field of a protobuf message."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        wire = key & 7
        if wire == 2:
            n, i = varint(b, i)
            yield key >> 3, wire, b[i:i + n]
            i += n
        elif wire == 0:
            v, i = varint(b, i)
            yield key >> 3, wire, v
        elif wire == 1:
            yield key >> 3, wire, int.from_bytes(b[i:i + 8], "little")
            i += 8
        elif wire == 5:
            yield key >> 3, wire, int.from_bytes(b[i:i + 4], "little")
            i += 4
        else:
            raise ValueError("unsupported wire type")


def decode_spans(request):
    """Each span of an ExportTraceServiceRequest as a dict (OTLP's Span field numbers)."""
    for f, rs in fields(request):
        if f != 1:
            continue
        for g, ss in fields(rs):
            if g != 2:
                continue
            for h, span in fields(ss):
                if h != 2:
                    continue
                d = {}
                for k, _, v in scalars(span):
                    if k in (1, 2, 4):
                        d[{1: "trace_id", 2: "span_id", 4: "parent"}[k]] = v.hex()
                    elif k == 5:
                        d["name"] = v.decode("utf-8", "replace")
                    elif k == 6:
                        d["kind"] = v
                    elif k == 7:
                        d["start"] = v
                    elif k == 8:
                        d["end"] = v
                yield d


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    r = (len(xs) - 1) * q
    lo = int(r)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (r - lo)


def legs(spans):
    """Per step method: the request and response legs of each router call (client span, kind 3)
    with a shard span (server kind 2) under it, in microseconds (rank 0's or any rank's: each
    shard span pairs with its own call)."""
    calls = {s["span_id"]: s for s in spans
             if s.get("kind") == 3 and s.get("name") in ("prefill", "decode")}
    out = {}
    for s in spans:
        c = calls.get(s.get("parent"))
        if s.get("kind") != 2 or c is None or "start" not in s or "end" not in s:
            continue
        m = out.setdefault(s["name"], {"request": [], "response": [], "handler": []})
        m["request"].append((s["start"] - c["start"]) / 1e3)
        m["response"].append((c["end"] - s["end"]) / 1e3)
        m["handler"].append((s["end"] - s["start"]) / 1e3)
    summary = {}
    for name, m in out.items():
        summary[name] = {"calls": len(m["request"])}
        for k, xs in m.items():
            summary[name][k + "_us"] = {"p50": round(pct(xs, 0.5), 1),
                                       "mean": round(sum(xs) / len(xs), 1),
                                       "p99": round(pct(xs, 0.99), 1)}
    return summary


def count_spans(request):
    # ExportTraceServiceRequest.resource_spans (1) -> ResourceSpans.scope_spans (2) -> spans (2)
    n = 0
    for f, rs in fields(request):
        if f != 1:
            continue
        for g, ss in fields(rs):
            if g != 2:
                continue
            n += sum(1 for h, _ in fields(ss) if h == 2)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=4317)
    ap.add_argument("--legs", action="store_true",
                    help="decode the spans and report each step call's request and response legs")
    ap.add_argument("--dump", metavar="FILE", help="write every decoded span as a JSON line")
    args = ap.parse_args()
    decode = args.legs or args.dump
    counts = {"exports": 0, "spans": 0, "bytes": 0}
    spans = []
    lock = threading.Lock()

    def export(request, context):
        n = count_spans(request)
        decoded = list(decode_spans(request)) if decode else []
        with lock:
            counts["exports"] += 1
            counts["spans"] += n
            counts["bytes"] += len(request)
            spans.extend(decoded)
        return b""  # an empty ExportTraceServiceResponse

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Export": grpc.unary_unary_rpc_method_handler(export)}),))
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print(f"otlp_sink listening on 127.0.0.1:{port}", flush=True)
    done = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: done.set())

    def report(*_):  # SIGUSR1: the legs so far as a JSON line, then start afresh (one workload each)
        with lock:
            print(json.dumps({"spans": len(spans), "legs": legs(spans)}), flush=True)
            spans.clear()
    if args.legs:
        signal.signal(signal.SIGUSR1, report)
    done.wait()
    server.stop(0)
    with lock:
        if args.dump:
            with open(args.dump, "w") as f:
                for d in spans:
                    f.write(json.dumps(d) + "\n")
        if args.legs:
            counts["legs"] = legs(spans)
        print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
