#!/usr/bin/env python3
"""A minimal OTLP/gRPC trace receiver (no collector is packaged in Debian): accepts
TraceService/Export on 127.0.0.1:PORT, counts spans and requests, and prints the counts as a JSON
line on SIGTERM/SIGINT. For measuring tracing's cost on the serving path (bench/README.md):

    python3 bench/serve/otlp_sink.py --port 4317 &
    python3 bench/serve/serve_bench.py ... -- --otlp-endpoint http://127.0.0.1:4317

It decodes nothing (the request bytes are counted by a cheap protobuf walk of the top-level
fields), so it costs the server as little as a collector would. Needs python3-grpcio."""
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
    args = ap.parse_args()
    counts = {"exports": 0, "spans": 0, "bytes": 0}
    lock = threading.Lock()

    def export(request, context):
        n = count_spans(request)
        with lock:
            counts["exports"] += 1
            counts["spans"] += n
            counts["bytes"] += len(request)
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
    done.wait()
    server.stop(0)
    with lock:
        print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
