#!/usr/bin/env python3
"""Writes charts/textgen/dashboards/textgen.json: textgen's Grafana dashboard.

The panels are TGI's dashboard's (assets/tgi_grafana.json), laid out again on textgen's metrics:
latency (time to first token, per-token, end to end), throughput, the queue and batches, prefill and
decode steps, speculation, and textgen's own (KV-cache use and running requests as the endpoint
pickers read them, the prefix cache, preemptions, replicas, the router's host and transport time).
Every query selects the router pods by the `namespace` and `service` variables (the router
Service's pods, scraped with those labels by a ServiceMonitor or Prometheus' kubernetes_sd), and
every metric it names is checked against a live router's /metrics by tests/integration/router_test.py.
Usage: make_dashboard.py [OUT]   (default: the chart's file; the chart's ConfigMap embeds it)
"""
import json
import os
import sys

SEL = 'namespace=~"$namespace", service=~"$service"'
QUANTILES = (0.5, 0.9, 0.99)


def quantiles(metric, extra="", scale=""):
    sel = SEL + (", " + extra if extra else "")
    return [(f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{sel}}}[$__rate_interval]))){scale}",
             f"p{int(q * 100)}") for q in QUANTILES]


def panel(title, targets, unit="short", kind="timeseries", description=""):
    return {"title": title, "type": kind, "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"expr": e, "legendFormat": l, "refId": chr(ord("A") + i)}
                        for i, (e, l) in enumerate(targets)]}


def row(title):
    return {"title": title, "type": "row", "collapsed": False, "panels": []}


def rate(metric, by=""):
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{{{SEL}}}[$__rate_interval]))"


PANELS = [
    row("Service"),
    panel("Requests per second", [(rate("tgi_request_success"), "success"),
                                  (rate("tgi_request_failure", "err"), "failure {{err}}")], "reqps"),
    panel("Generated tokens per second",
          [(rate("tgi_request_generated_tokens_sum"), "tokens/s")], "short",
          description="Tokens of the requests that finished, per second."),
    panel("Time to first token",
          [(e, "queue " + l) for e, l in quantiles("tgi_request_queue_duration")] +
          [(e, "prefill " + l) for e, l in quantiles("tgi_batch_inference_duration", 'method="prefill"')],
          "s", description="Its two parts: the time queued, then the prefill step (as TGI's panel)."),
    panel("Time per output token", quantiles("tgi_request_mean_time_per_token_duration"), "s"),
    panel("End-to-end latency", quantiles("tgi_request_duration"), "s"),
    panel("Replicas", [(f"sum(textgen_replicas{{{SEL}}})", "replicas")], kind="stat"),
    row("Load (what the endpoint pickers read)"),
    panel("Queue size", [(f"sum(tgi_queue_size{{{SEL}}})", "queued")]),
    panel("Running requests", [(f"sum(textgen_num_requests_running{{{SEL}}})", "running")]),
    panel("KV-cache use", [(f"max(textgen_kv_cache_usage_perc{{{SEL}}})", "max over routers"),
                           (f"avg(textgen_kv_cache_usage_perc{{{SEL}}})", "mean")], "percentunit"),
    panel("Preemptions per second", [(rate("textgen_preemptions_total"), "preemptions")]),
    row("Requests"),
    panel("Prompt tokens", quantiles("tgi_request_input_length")),
    panel("Generated tokens per request", quantiles("tgi_request_generated_tokens")),
    panel("Queue time", quantiles("tgi_request_queue_duration"), "s"),
    panel("Validation time", quantiles("tgi_request_validation_duration"), "s"),
    panel("Speculated tokens accepted per step", quantiles("tgi_request_skipped_tokens")),
    panel("Prefix cache hit rate",
          [(f"{rate('textgen_prefix_cache_hit_tokens_total')} / {rate('textgen_prefix_cache_queried_tokens_total')}",
            "hit tokens / queried tokens")], "percentunit"),
    row("Batches"),
    panel("Batch size", [(f"avg(tgi_batch_current_size{{{SEL}}})", "requests")]),
    panel("Max tokens per batch", [(f"avg(tgi_batch_current_max_tokens{{{SEL}}})", "tokens")]),
    panel("Batch concatenations", [(rate("tgi_batch_concat", "reason"), "{{reason}}")]),
    panel("Shard calls failing", [(rate("tgi_batch_inference_failure", "method"), "{{method}}")]),
    row("Prefill"),
    panel("Prefill step", quantiles("tgi_batch_inference_duration", 'method="prefill"'), "s"),
    panel("Prefill forward", quantiles("tgi_batch_forward_duration", 'method="prefill"'), "s"),
    row("Decode"),
    panel("Decode step", quantiles("tgi_batch_inference_duration", 'method="decode"'), "s"),
    panel("Decode forward", quantiles("tgi_batch_forward_duration", 'method="decode"'), "s"),
    panel("Token decode", quantiles("tgi_batch_decode_duration", 'method="decode"'), "s"),
    panel("Filter batch", quantiles("tgi_batch_filter_duration", 'method="decode"'), "s"),
    panel("Router host time per step", quantiles("textgen_batch_host_duration", 'method="decode"'), "s"),
    panel("Router work per step", quantiles("textgen_batch_router_duration", 'method="decode"'), "s"),
    panel("Token delivery per step", quantiles("textgen_batch_delivery_duration", 'method="decode"'), "s"),
    panel("Transport time per call", quantiles("textgen_batch_transport_duration", 'method="decode"'), "s"),
]


def layout(panels):
    """Rows take the full width; panels fill rows of three, 8 units high."""
    x = y = 0
    for i, p in enumerate(panels, 1):
        p["id"] = i
        if p["type"] == "row":
            if x:
                x, y = 0, y + 8
            p["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
            y += 1
            continue
        p["gridPos"] = {"h": 8, "w": 8, "x": x, "y": y}
        x += 8
        if x >= 24:
            x, y = 0, y + 8
    return panels


def dashboard():
    var = lambda name, query: {"name": name, "type": "query", "label": name, "includeAll": True,
                               "multi": True, "refresh": 2, "allValue": ".*",
                               "datasource": {"type": "prometheus", "uid": "${datasource}"},
                               "query": {"query": query, "refId": name}, "definition": query}
    return {
        "title": "textgen",
        "uid": "textgen",
        "description": "textgen's router metrics: TGI's panels and textgen's own",
        "tags": ["textgen", "tgi", "llm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            var("namespace", "label_values(tgi_request_count, namespace)"),
            var("service", 'label_values(tgi_request_count{namespace=~"$namespace"}, service)'),
        ]},
        "panels": layout(PANELS),
    }


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "charts/textgen/dashboards/textgen.json")
    with open(out, "w") as f:
        json.dump(dashboard(), f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{out}: {sum(1 for p in PANELS if p['type'] != 'row')} panels")


if __name__ == "__main__":
    main()
