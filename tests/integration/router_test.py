#!/usr/bin/env python3
"""The real textgen-router in front of a real textgen-shard on a tiny reference model, port 0.

Usage: router_test.py ROUTER_BINARY SHARD_BINARY MODEL_DIR
Prints "N passed, M failed" and exits non-zero on any failure. Synchronisation is by readiness lines
and bounded polling, never fixed sleeps.
"""
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROUTER, SHARD, MODEL = sys.argv[1:4]
CHAT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat", "tokenizer_config.json")
REF = json.load(open(os.path.join(MODEL, "reference.json")))
PROMPTS = [p["text"] for p in REF["prompts"]]
# How much slower than a release build the binaries run: tests/fuzz/sanitized.sh sets it for the
# ASan+UBSan build (several times slower, and CI runs it beside other sanitized tests on 2 cores).
# Bounds on compute time scale by it; bounds on waiting (a cache hit, a health check) do not.
SLOWDOWN = float(os.environ.get("TEXTGEN_TEST_SLOWDOWN", "1"))
GREEDY = [p["greedy"] for p in REF["prompts"]]
results = {"passed": 0, "failed": 0}


def check(cond, what):
    results["passed" if cond else "failed"] += 1
    if not cond:
        print("FAIL:", what, flush=True)
    return cond


def start(cmd, ready_prefix, nofile=None):
    limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    for line in p.stdout:
        if line.startswith(ready_prefix):
            return p, line[len(ready_prefix):].strip()
    raise RuntimeError(f"{cmd[0]} did not start: {p.stderr.read()[-2000:]}")


def stop(p):
    if p and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


class Server:
    def __init__(self, workdir, router_flags=(), router_nofile=None, kv_bytes=8000000, shard_flags=()):
        self.shard, self.shard_addr = start(
            [SHARD, "--model-id", MODEL, "--uds-path", os.path.join(workdir, "sock"), "--kv-cache-memory", str(kv_bytes),
             "--threads", "1", "--log-level", "warn", *shard_flags], "textgen-shard ready ")
        self.router, url = start(
            [ROUTER, "--tokenizer-name", MODEL, "--model-id", "llama-gqa", "--shard-master", self.shard_addr,
             "--hostname", "127.0.0.1", "--port", "0", "--max-batch-prefill-tokens", "256", "--log-level", "warn",
             "--max-concurrent-requests", "512", "--tokenizer-config-path", CHAT_CONFIG, *router_flags],
            "textgen-router ready ", router_nofile)
        self.port = int(url.rsplit(":", 1)[1])

    def close(self):
        stop(self.router)
        stop(self.shard)


def request(port, method, path, body=None, headers=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=json.dumps(body) if isinstance(body, (dict, list)) else body,
              headers={"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    return r.status, dict(r.getheaders()), data


def sse(port, path, body):
    """Returns the list of SSE data payloads."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read().decode()
    c.close()
    events = [e for e in raw.split("\n\n") if e.strip()]
    return r.status, r.getheader("Content-Type"), [e.split(":", 1)[1].strip() for e in events]


def generate(port, prompt, n, **params):
    status, headers, body = request(port, "POST", "/generate",
                                    {"inputs": prompt, "parameters": {"max_new_tokens": n, "details": True, **params}})
    return status, headers, json.loads(body)


def in_parallel(n, fn, timeout=None):
    """fn(0..n-1) on n threads at once; returns their results in order (None where one did not finish)."""
    out = [None] * n

    def run(i):
        out[i] = fn(i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    return out


def metric(port, name):
    _, _, text = request(port, "GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return line
    return None


def test_routes(s):
    status, _, body = request(s.port, "GET", "/info")
    info = json.loads(body)
    check(status == 200 and info["model_id"] == "llama-gqa" and info["max_total_tokens"] == 256, f"/info {body}")
    check(request(s.port, "GET", "/health")[0] == 200, "/health")
    status, _, body = request(s.port, "GET", "/v1/models")
    check(status == 200 and json.loads(body)["data"][0]["id"] == "llama-gqa", "/v1/models")
    status, _, body = request(s.port, "POST", "/tokenize", {"inputs": "Hello world"})
    toks = json.loads(body)
    check(status == 200 and [t["text"] for t in toks] == ["", "Hello", " world"], f"/tokenize {body}")
    check(request(s.port, "GET", "/nope")[0] == 404, "404")
    # A known route asked with another method is 405 naming the ones it takes; GET routes answer
    # HEAD (headers, no body), as TGI's axum routes do.
    status, headers, _ = request(s.port, "GET", "/generate")
    allow = {k.lower(): v for k, v in headers.items()}.get("allow")
    check(status == 405 and allow == "POST", f"GET /generate: {status} Allow {allow}")
    check(request(s.port, "POST", "/info", {})[0] == 405, "POST /info")
    status, _, body = request(s.port, "HEAD", "/health")
    check(status == 200 and body == "", f"HEAD /health: {status} {body!r}")
    check(request(s.port, "HEAD", "/info")[0] == 200, "HEAD /info")
    # /tokenize's truncate keeps the last tokens (TGI's).
    status, _, body = request(s.port, "POST", "/tokenize",
                              {"inputs": "Hello world", "parameters": {"truncate": 2}})
    check(status == 200 and [t["text"] for t in json.loads(body)] == ["Hello", " world"],
          f"/tokenize truncate: {body}")
    # The OpenAPI document lists exactly what is served: every path and method answers (not 404).
    status, _, body = request(s.port, "GET", "/api-doc/openapi.json")
    doc = json.loads(body)
    check(status == 200 and doc["openapi"].startswith("3."), "openapi.json")
    for path, methods in doc["paths"].items():
        for method in methods:
            payload = {"inputs": "Hi", "parameters": {"max_new_tokens": 1}} if method == "post" else None
            if path == "/v1/completions":
                payload = {"model": "m", "prompt": "Hi", "max_tokens": 1}
            if path in ("/v1/chat/completions", "/chat_tokenize", "/invocations"):
                payload = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
            code = request(s.port, method.upper(), path, payload)[0]
            check(code not in (404, 405), f"OpenAPI lists {method.upper()} {path}, which answers {code}")


def test_generate_equals_reference(s):
    for prompt, greedy in zip(PROMPTS, GREEDY):
        status, headers, body = generate(s.port, prompt, 12)
        ids = [t["id"] for t in body["details"]["tokens"]]
        check(status == 200 and ids == greedy[:12], f"/generate {prompt!r}: {ids} != {greedy[:12]}")
        check(headers.get("x-generated-tokens") == "12" and "x-queue-time" in headers, f"x-* headers {headers}")
        check(body["details"]["finish_reason"] == "length", "finish_reason")


def test_prefix_cache(s):
    """A repeated prompt reuses its cached blocks (cache_len on the shard) and answers the same tokens."""
    prompt = " ".join(["The quick brown fox jumps over the lazy dog near the quiet river bank."] * 6)
    n_prompt = len(json.loads(request(s.port, "POST", "/tokenize", {"inputs": prompt})[2]))
    check(n_prompt > 48, f"prompt of {n_prompt} tokens")
    hits_before = float((metric(s.port, "textgen_prefix_cache_hit_tokens_total") or "x 0").split()[-1])
    # decoder_input_details computes every prompt token: the uncached reference.
    status, _, first = generate(s.port, prompt, 16, decoder_input_details=True)
    check(status == 200 and len(first["details"]["prefill"]) == n_prompt, f"uncached run {status}")
    ref = [t["id"] for t in first["details"]["tokens"]]
    status, _, again = generate(s.port, prompt, 16)
    check(status == 200 and [t["id"] for t in again["details"]["tokens"]] == ref,
          f"cached run {again} != {ref}")
    status, _, body = request(s.port, "POST", "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 16,
                                                             "temperature": 0})
    out = json.loads(body)
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    pieces = "".join(t["text"] for t in first["details"]["tokens"])
    check(status == 200 and out["choices"][0]["text"] == pieces,
          f"completion {out['choices'][0]['text']!r} != {pieces!r} (generated_text {first['generated_text']!r})")
    check(cached > 0 and cached % 16 == 0 and cached < n_prompt, f"cached_tokens {cached} of {n_prompt}")
    hits = float(metric(s.port, "textgen_prefix_cache_hit_tokens_total").split()[-1])
    check(hits >= hits_before + 2 * cached, f"textgen_prefix_cache_hit_tokens_total {hits}")
    # A follow-up turn (prompt + answer + more) reuses the answer's fed tokens too, where the turn's
    # text tokenizes back to the same ids.
    turn = prompt + first["generated_text"] + " And then?"
    ids = [t["id"] for t in json.loads(request(s.port, "POST", "/tokenize", {"inputs": turn})[2])]
    prompt_ids = [t["id"] for t in json.loads(request(s.port, "POST", "/tokenize", {"inputs": prompt})[2])]
    written = prompt_ids + ref[:-1]
    same = 0
    while same < min(len(ids), len(written)) and ids[same] == written[same]:
        same += 1
    expect = min(same, len(ids) - 1) // 16 * 16
    status, _, body = request(s.port, "POST", "/v1/completions", {"model": "m", "prompt": turn, "max_tokens": 2})
    got = json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"]
    check(status == 200 and got == expect, f"follow-up turn: cached {got}, expected {expect} ({same} ids agree)")
    print(f"prefix cache: {cached} of {n_prompt} prompt tokens reused; follow-up turn {got} of {len(ids)}")


def test_concurrent_equals_alone(s):
    out = in_parallel(8, lambda i: generate(s.port, PROMPTS[i % 4], 10 + i)[2])
    for i in range(8):
        ids = [t["id"] for t in out[i]["details"]["tokens"]]
        check(ids == GREEDY[i % 4][:10 + i], f"concurrent request {i}: {ids}")


def test_preemption(workdir):
    """A KV pool of 10 blocks (160 tokens) for six requests that each reach 56: blocks grow as they generate, the
    newest are preempted and recomputed, and every answer equals the same request run alone."""
    # 768 bytes a token (3 layers, 2 KV heads of 16, K and V in float32): 10 blocks of 16.
    os.makedirs(workdir + "/preempt", exist_ok=True)
    # With --speculate 2: preemption and proposals together, and the dashboard's speculation metric.
    s = Server(workdir + "/preempt", ("--max-total-tokens", "64", "--max-input-tokens", "32",
                                      "--max-batch-prefill-tokens", "64"), kv_bytes=10 * 16 * 768,
               shard_flags=("--speculate", "2"))
    try:
        params = [{} if i % 2 == 0 else dict(do_sample=True, seed=100 + i, temperature=0.9, top_k=50)
                  for i in range(6)]
        params[1]["decoder_input_details"] = True  # its prompt details are sent once, before any preemption
        alone = [generate(s.port, PROMPTS[i % 4], 48, **params[i]) for i in range(6)]
        check(metric(s.port, "textgen_preemptions_total") in (None, "textgen_preemptions_total 0"),
              "one request at a time is never preempted")
        together = in_parallel(6, lambda i: generate(s.port, PROMPTS[i % 4], 48, **params[i]), timeout=120)
        for i in range(6):
            a, t = alone[i], together[i]
            check(a[0] == 200 and t is not None and t[0] == 200, f"preemption: request {i} answered {t and t[0]}")
            if t is None or t[0] != 200:
                continue
            ids = lambda r: [x["id"] for x in r[2]["details"]["tokens"]]
            check(ids(t) == ids(a) and t[2]["generated_text"] == a[2]["generated_text"],
                  f"preemption: request {i} {ids(t)} != alone {ids(a)}")
            check(t[2]["details"]["generated_tokens"] == a[2]["details"]["generated_tokens"], "generated_tokens")
            check(len(t[2]["details"].get("prefill", [])) == len(a[2]["details"].get("prefill", [])),
                  f"preemption: request {i} prefill details")
        line = metric(s.port, "textgen_preemptions_total")
        preempted = float(line.split()[-1]) if line else 0
        check(preempted > 0, f"textgen_preemptions_total {line}")
        print(f"preemption: {int(preempted)} preemptions for 6 requests in a pool of 10 blocks")
        SEEN_FAMILIES.update(metric_families(s.port))
    finally:
        s.close()


CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPTS[0]}]
TOOL_PROMPT = "Use a tool."  # TGI's default tool prompt is long for this model's 256-token context
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6}, "age": {"type": "string", "pattern": "^[0-9]{1,2}$"},
    "admin": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name", "age", "admin", "tags"], "additionalProperties": False}


def chat(s, **body):
    if "tools" in body:
        body.setdefault("tool_prompt", TOOL_PROMPT)
    status, _, out = request(s.port, "POST", "/v1/chat/completions", {"messages": CHAT, **body})
    return status, json.loads(out)


def validates(instance, schema):
    try:
        import jsonschema
    except ImportError:
        check(False, "python3-jsonschema is installed (tools/install-deps.sh)")
        return False
    try:
        jsonschema.validate(instance, schema)
        return True
    except jsonschema.ValidationError as e:
        print("schema violation:", e.message)
        return False


def test_chat(s):
    """/v1/chat/completions through the model's template: greedy content equals /generate on the templated
    prompt, streaming adds up, usage and logprobs, /chat_tokenize, /invocations."""
    status, _, body = request(s.port, "POST", "/chat_tokenize", {"messages": CHAT})
    tok = json.loads(body)
    text = tok.get("templated_text", "")
    check(status == 200 and text.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n") and
          text.endswith("<|im_start|>assistant\n"), f"/chat_tokenize {body[:300]}")
    ids = [t["id"] for t in tok.get("tokenize_response", [])]
    status, _, body = request(s.port, "POST", "/generate", {"inputs": text, "add_special_tokens": False,
                                                           "parameters": {"max_new_tokens": 10, "details": True}})
    ref = json.loads(body)
    ref_text = "".join(t["text"] for t in ref["details"]["tokens"] if not t["special"])
    status, out = chat(s, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2)
    choice = out.get("choices", [{}])[0]
    check(status == 200 and out["object"] == "chat.completion" and choice["message"]["role"] == "assistant",
          f"chat: {status} {out}")
    check(choice.get("message", {}).get("content") == ref_text, f"chat content {choice} != /generate {ref_text!r}")
    usage = out.get("usage", {})
    check(usage.get("prompt_tokens") == len(ids) and usage.get("completion_tokens") == ref["details"]["generated_tokens"],
          f"chat usage {usage} (prompt {len(ids)} tokens)")
    lp = (choice.get("logprobs") or {}).get("content", [])
    # The same tokens' log-probabilities (chat samples with top-n here, /generate took the arg-max path).
    check(len(lp) == ref["details"]["generated_tokens"] and all(len(x["top_logprobs"]) == 2 for x in lp) and
          all(abs(x["logprob"] - t["logprob"]) < 1e-4 for x, t in zip(lp, ref["details"]["tokens"])) and
          all(x["top_logprobs"][0]["logprob"] == x["logprob"] for x in lp),
          f"chat logprobs {lp[:2]} vs {ref['details']['tokens'][:2]}")
    check(choice.get("finish_reason") in ("length", "stop"), f"finish_reason {choice.get('finish_reason')}")
    # Streaming: deltas add up to the same content, the last chunk has the usage, then [DONE].
    status, ctype, events = sse(s.port, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 10, "temperature": 0,
                                                                 "stream": True, "stream_options": {"include_usage": True}})
    check(status == 200 and events and events[-1] == "[DONE]", f"chat stream {status} {events[-2:]}")
    chunks = [json.loads(e) for e in events[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    check(content == ref_text, f"chat stream content {content!r} != {ref_text!r}")
    check(all(c["object"] == "chat.completion.chunk" for c in chunks) and chunks[-1]["choices"] == [] and
          chunks[-1]["usage"]["completion_tokens"] == usage.get("completion_tokens"), f"stream usage {chunks[-1]}")
    # SageMaker's route takes each shape.
    status, _, body = request(s.port, "POST", "/invocations", {"messages": CHAT, "max_tokens": 10, "temperature": 0})
    check(status == 200 and json.loads(body)["choices"][0]["message"]["content"] == ref_text, f"/invocations chat {body[:200]}")
    status, _, body = request(s.port, "POST", "/invocations", {"prompt": PROMPTS[0], "max_tokens": 2})
    check(status == 200 and json.loads(body)["object"] == "text_completion", f"/invocations completion {body[:200]}")
    status, _, body = request(s.port, "POST", "/invocations", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 2}})
    check(status == 200 and "generated_text" in json.loads(body)[0], f"/invocations generate {body[:200]}")


def test_constrained(s):
    """Grammars: every output matches its regex or validates against its schema, sampled or greedy."""
    import re
    for i, pattern in enumerate([r"[a-z]{3}-[0-9]{2}", r"(yes|no|maybe)", r"\d{1,3}(\.\d{1,2})?", r"[A-Z][a-z]{0,4}!"]):
        params = {"grammar": {"type": "regex", "value": pattern}, "do_sample": i % 2 == 1, "seed": i}
        status, _, out = generate(s.port, PROMPTS[i % 4], 24, **params)
        text = out.get("generated_text", "")
        check(status == 200 and re.fullmatch(pattern, text) is not None, f"regex {pattern!r}: {status} {text!r} {out}")
        check(out.get("details", {}).get("finish_reason") == "eos_token", f"regex {pattern!r} ends by EOS: {out.get('details')}")
    for i in range(4):
        params = {"grammar": {"type": "json", "value": PERSON}, "do_sample": i > 0, "seed": 10 + i, "temperature": 1.5}
        status, _, out = generate(s.port, PROMPTS[i % 4], 120, **params)
        text = out.get("generated_text", "")
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        check(status == 200 and value is not None and validates(value, PERSON), f"json schema {i}: {status} {text!r}")
    # response_format on chat: json_schema (OpenAI's shape) and json_object.
    status, out = chat(s, max_tokens=120, temperature=1.2, seed=3, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    content = out.get("choices", [{}])[0].get("message", {}).get("content", "")
    check(status == 200 and validates(json.loads(content or "null"), PERSON), f"response_format json_schema: {content!r}")
    status, out = chat(s, max_tokens=60, temperature=0, response_format={"type": "json_object"})
    content = out.get("choices", [{}])[0].get("message", {}).get("content", "")
    try:
        ok = isinstance(json.loads(content), dict)
    except ValueError:
        ok = out.get("choices", [{}])[0].get("finish_reason") == "length"  # cut by max_tokens
    check(status == 200 and ok, f"response_format json_object: {content!r}")


def test_tools(s):
    """Tool calls: "required" and a named function always return a valid call (OpenAI's shape), streamed as
    deltas that add up to the same arguments; "auto" gives either a call or text; "none" gives text."""
    status, out = chat(s, max_tokens=80, temperature=0, tools=[WEATHER], tool_choice="required")
    choice = out.get("choices", [{}])[0]
    calls = choice.get("message", {}).get("tool_calls") or []
    args = json.loads(calls[0]["function"]["arguments"]) if calls else None
    check(status == 200 and len(calls) == 1 and calls[0]["type"] == "function" and
          calls[0]["function"]["name"] == "get_weather" and choice["finish_reason"] == "tool_calls",
          f"tool call: {status} {out}")
    check(args is not None and validates(args, WEATHER["function"]["parameters"]), f"tool arguments {args}")
    check(choice.get("message", {}).get("content") is None, "a tool call has no content")
    status, ctype, events = sse(s.port, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 80, "temperature": 0,
                                                                 "tools": [WEATHER], "tool_choice": "required", "stream": True,
                                                                 "tool_prompt": TOOL_PROMPT, "logprobs": True,
                                                                 "stream_options": {"include_usage": True}})
    chunks = [json.loads(e) for e in events[:-1]] if events and events[-1] == "[DONE]" else []
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"] and
              c["choices"][0]["delta"].get("tool_calls")]
    streamed = "".join(d["function"].get("arguments") or "" for d in deltas)
    check(status == 200 and deltas and deltas[0]["function"]["name"] == "get_weather" and
          json.loads(streamed or "null") == args and chunks[-2]["choices"][0]["finish_reason"] == "tool_calls",
          f"streamed tool call {streamed!r} != {args} ({events[-3:]})")
    # Every generated token's log-probability arrives once, spread over the call's chunks.
    lps = sum(len((c["choices"][0].get("logprobs") or {}).get("content", [])) for c in chunks if c["choices"])
    check(chunks and lps == chunks[-1]["usage"]["completion_tokens"],
          f"streamed tool call log-probs: {lps} for {chunks[-1].get('usage') if chunks else None}")
    other = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
    status, out = chat(s, max_tokens=60, temperature=0, tools=[WEATHER, other],
                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = out.get("choices", [{}])[0].get("message", {}).get("tool_calls") or []
    check(status == 200 and calls and calls[0]["function"]["name"] == "get_time" and
          json.loads(calls[0]["function"]["arguments"])["zone"] in ("UTC", "CET"), f"named tool: {out}")
    for seed in range(3):
        status, out = chat(s, max_tokens=60, temperature=1.0, seed=seed, tools=[WEATHER, other])
        choice = out.get("choices", [{}])[0]
        m = choice.get("message", {})
        call = (m.get("tool_calls") or [{}])[0].get("function", {})
        if choice.get("finish_reason") == "tool_calls":  # a whole call: valid against its function's schema
            schema = WEATHER if call.get("name") == "get_weather" else other
            ok = call.get("name") in ("get_weather", "get_time") and \
                validates(json.loads(call["arguments"]), schema["function"]["parameters"])
        else:  # text, or a call cut by max_tokens ("length", its partial arguments, as OpenAI)
            ok = isinstance(m.get("content"), str) or (choice.get("finish_reason") == "length" and call.get("name"))
        check(status == 200 and ok, f"tool_choice auto (seed {seed}): {out}")
    status, out = chat(s, max_tokens=5, temperature=0, tools=[WEATHER], tool_choice="none")
    m = out.get("choices", [{}])[0].get("message", {})
    check(status == 200 and isinstance(m.get("content"), str) and not m.get("tool_calls"), f"tool_choice none: {out}")


def test_chat_errors(s):
    cases = [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"content": "x"}]}, "role"),
        ({"messages": CHAT, "n": 2}, "`n`"),
        ({"messages": CHAT, "tools": [WEATHER], "response_format": {"type": "json_object"}}, "mutually exclusive"),
        ({"messages": CHAT, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "nope"),
        ({"messages": CHAT, "tool_choice": "sometimes"}, "tool_choice"),
        ({"messages": CHAT, "tools": [{"type": "function", "function": {}}]}, "name"),
        ({"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integr"}}}},
         "integr"),
        ({"messages": CHAT, "response_format": {"type": "xml"}}, "xml"),
        ({"messages": CHAT, "presence_penalty": 3}, "presence_penalty"),
        ({"messages": CHAT, "tool_choice": "required"}, "needs `tools`"),
        ({"messages": CHAT, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "not found"),
    ]
    for body, needle in cases:
        status, _, out = request(s.port, "POST", "/v1/chat/completions", body)
        check(status == 422 and needle in out, f"chat {json.dumps(body)[:120]}: {status} {out[:200]}")
    for grammar, needle in [({"type": "regex", "value": "(ab"}, "grammar is not valid"),
                            ({"type": "regex", "value": "a{1,100000000}"}, "grammar is not valid"),
                            ({"type": "json", "value": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}},
                             "grammar is not valid"),
                            ({"type": "json", "value": "{not json"}, "grammar is not valid"),
                            ({"type": "yaml", "value": "x"}, "unknown variant")]:
        status, _, out = request(s.port, "POST", "/generate", {"inputs": "x", "parameters": {"grammar": grammar}})
        check(status == 422 and needle in out, f"grammar {grammar}: {status} {out[:200]}")
    # A short regex whose automaton is costly to build is refused within the compile bound, and the
    # same one again is answered from the cache of failed compiles.
    odd = "".join("\\" + chr(b) if chr(b) in "]\\^-" else chr(b) for b in range(0x21, 0x7f, 2))
    hostile = {"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": f"([{odd}]?[!-~]?){{0,450}}z"}}}
    times = []
    for _ in range(2):
        t0 = time.time()
        status, _, out = request(s.port, "POST", "/generate", hostile)
        times.append(time.time() - t0)
        check(status == 422 and "maxCompileWork" in out, f"costly regex: {status} {out[:200]}")
    check(times[0] < 5 * SLOWDOWN and times[1] < 0.5, f"costly regex answered in {times[0]:.2f} s, again in {times[1]:.3f} s")
    check(alive(s), "alive after bad chat requests")


def test_stream(s):
    status, ctype, events = sse(s.port, "/generate_stream", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 9,
                                                                                                  "details": True}})
    check(status == 200 and ctype.startswith("text/event-stream"), f"stream status {status} {ctype}")
    payloads = [json.loads(e) for e in events]
    check([p["index"] for p in payloads] == list(range(1, 10)), "stream indexes")
    check([p["token"]["id"] for p in payloads] == GREEDY[0][:9], "stream tokens equal the reference")
    check(all(p["generated_text"] is None for p in payloads[:-1]) and payloads[-1]["details"]["generated_tokens"] == 9,
          "final event carries details")
    # The pieces add up to the final text (streaming detokenizer invariant; no special tokens here).
    check("".join(p["token"]["text"] for p in payloads) == payloads[-1]["generated_text"], "stream text adds up")
    # As TGI's StreamResponse: details only when asked for, top_tokens only when there are some.
    status, _, events = sse(s.port, "/generate_stream", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 3}})
    plain = [json.loads(e) for e in events]
    check(status == 200 and plain[-1]["details"] is None and plain[-1]["generated_text"] and
          all("top_tokens" not in p for p in plain), f"a stream without details: {plain[-1:]}")
    status, _, events = sse(s.port, "/generate_stream", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 3,
                                                                                             "top_n_tokens": 2}})
    check(status == 200 and all(len(json.loads(e)["top_tokens"]) == 2 for e in events), f"top_tokens when asked: {events[:1]}")
    # Compat route: POST / with stream, and without (a list).
    status, _, events = sse(s.port, "/", {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 3}, "stream": True})
    check(status == 200 and len(events) == 3, "POST / stream")
    status, _, body = request(s.port, "POST", "/", {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 3}})
    check(status == 200 and isinstance(json.loads(body), list), "POST / returns a list")
    # OpenAI completions, streaming ends in [DONE]; they count in the request histograms.
    durations = metric(s.port, "tgi_request_duration_count")
    durations = float(durations.split()[-1]) if durations else 0.0
    status, _, events = sse(s.port, "/v1/completions", {"model": "m", "prompt": PROMPTS[2], "max_tokens": 4,
                                                         "temperature": 0, "stream": True})
    check(status == 200 and events[-1] == "[DONE]" and len(events) == 5, f"completions stream {events[-2:]}")
    status, _, body = request(s.port, "POST", "/v1/completions", {"model": "m", "prompt": [PROMPTS[0], PROMPTS[1]],
                                                                  "max_tokens": 3, "temperature": 0})
    c = json.loads(body)
    check(status == 200 and len(c["choices"]) == 2 and c["usage"]["completion_tokens"] == 6, f"completions {body}")
    after = metric(s.port, "tgi_request_duration_count")
    check(after is not None and float(after.split()[-1]) == durations + 2,
          f"completions observed in tgi_request_duration: {durations} -> {after}")


def test_many_streams(s):
    """Hundreds of concurrent streams (each HTTP connection must not hold a listener thread)."""
    out = in_parallel(200, lambda i: sse(s.port, "/generate_stream",
                                         {"inputs": PROMPTS[i % 4], "parameters": {"max_new_tokens": 5, "details": True}}),
                     timeout=120)
    good = sum(1 for r in out if r and r[0] == 200 and len(r[2]) == 5 and json.loads(r[2][-1])["details"])
    check(good == 200, f"200 concurrent streams: {good} complete")


def test_errors(s):
    status, _, body = request(s.port, "POST", "/generate", {"inputs": "x", "parameters": {"top_p": 1.5}})
    check(status == 422 and json.loads(body) == {"error": "`top_p` must be > 0.0 and < 1.0", "error_type": "validation"},
          f"422 {body}")
    status, _, body = request(s.port, "POST", "/generate", {"inputs": "x", "parameters": {"watermark": 1}})
    check(status == 422 and "watermark" in json.loads(body)["error"], "a watermark that is no boolean is a clear 422")
    status, _, body = request(s.port, "POST", "/generate", "{not json")
    check(status == 422, "malformed JSON")
    status, _, body = request(s.port, "POST", "/generate", {"inputs": "x" * 3000000})
    check(status == 413, f"payload limit {status}")


def test_tgi_compat(s):
    """Behaviours a TGI or OpenAI client relies on (TGI's router/src/server.rs, checked against it)."""
    prompt = PROMPTS[1]
    # TGI's compat routes (POST /, /invocations) default return_full_text to true for a
    # text-generation model; /generate to false; an explicit value wins.
    status, _, body = request(s.port, "POST", "/", {"inputs": prompt, "parameters": {"max_new_tokens": 3}})
    out = json.loads(body)
    check(status == 200 and out[0]["generated_text"].startswith(prompt) and len(out[0]["generated_text"]) > len(prompt),
          f"POST / returns the full text by default: {body}")
    status, _, body = request(s.port, "POST", "/invocations", {"inputs": prompt, "parameters": {"max_new_tokens": 3}})
    check(status == 200 and json.loads(body)[0]["generated_text"].startswith(prompt), f"/invocations full text: {body}")
    status, _, body = request(s.port, "POST", "/", {"inputs": prompt, "parameters": {"max_new_tokens": 3, "return_full_text": False}})
    tail = json.loads(body)[0]["generated_text"]
    check(status == 200 and out[0]["generated_text"] == prompt + tail, f"return_full_text false on POST /: {body}")
    status, _, body = generate(s.port, prompt, 3)
    check(status == 200 and body["generated_text"] == tail, f"/generate returns the new text only: {body}")
    status, _, events = sse(s.port, "/", {"inputs": prompt, "parameters": {"max_new_tokens": 3}, "stream": True})
    check(status == 200 and json.loads(events[-1])["generated_text"] == prompt + tail, f"POST / stream full text: {events[-1:]}")
    # return_full_text with truncate puts the request's own inputs first, not the kept part.
    status, _, body = request(s.port, "POST", "/generate", {"inputs": prompt, "parameters": {
        "max_new_tokens": 2, "truncate": 2, "return_full_text": True}})
    check(status == 200 and json.loads(body)["generated_text"].startswith(prompt), f"truncate + full text: {body}")
    # TGI's x-compute-* headers: the inputs' Unicode characters, COMPUTE_TYPE's default.
    accented = "h\u00e9llo w\u00f6rld \u2014 \U0001F600"
    for path in ("/generate", "/generate_stream"):
        status, headers, _ = request(s.port, "POST", path, {"inputs": accented, "parameters": {"max_new_tokens": 1}})
        check(status == 200 and headers.get("x-compute-characters") == str(len(accented)) and
              headers.get("x-compute-type") == "gpu+optimized", f"{path} x-compute headers: {headers}")
    status, _, body = request(s.port, "GET", "/info")
    check(json.loads(body)["validation_workers"] == 2, f"/info's validation_workers is the router's: {body}")
    # decoder_input_details alone brings the details (TGI: details || decoder_input_details).
    status, _, body = request(s.port, "POST", "/generate", {"inputs": prompt, "parameters": {
        "max_new_tokens": 2, "decoder_input_details": True}})
    d = json.loads(body).get("details") or {}
    check(status == 200 and len(d.get("prefill", [])) > 0 and len(d.get("tokens", [])) == 2,
          f"decoder_input_details without details: {body}")
    # CORS: without --cors-allow-origin any origin, on every route (TGI's AllowOrigin::any()).
    for method, path, payload in (("GET", "/info", None), ("GET", "/health", None), ("GET", "/metrics", None),
                                  ("POST", "/generate", {"inputs": "x", "parameters": {"top_p": 1.5}}),
                                  ("POST", "/generate", {"inputs": prompt, "parameters": {"max_new_tokens": 1}}),
                                  ("POST", "/generate", "x" * 3000000), ("GET", "/nope", None)):
        status, headers, _ = request(s.port, method, path, payload, {"Origin": "http://elsewhere.example"})
        check(headers.get("Access-Control-Allow-Origin") == "*", f"CORS on {method} {path} ({status}): {headers}")
    # OpenAI streams: not buffered by proxies; /v1/completions reports usage as TGI and OpenAI do.
    for path, payload in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                                     "stream": True}),
                          ("/v1/completions", {"prompt": prompt, "max_tokens": 2, "stream": True})):
        status, headers, _ = request(s.port, "POST", path, payload)
        check(status == 200 and headers.get("x-accel-buffering") == "no", f"{path} stream headers {headers}")
    two = {"prompt": [PROMPTS[0], PROMPTS[2]], "max_tokens": 3, "temperature": 0, "stream": True}
    status, _, events = sse(s.port, "/v1/completions", two)
    chunks = [json.loads(e) for e in events[:-1]]
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    check(status == 200 and events[-1] == "[DONE]" and len(finals) == 2 and
          all(c["usage"]["completion_tokens"] == 3 for c in finals) and
          all("usage" not in c for c in chunks if c not in finals),
          f"each prompt's last chunk has its usage (TGI's CompletionFinal): {finals}")
    prompt_tokens = sum(c["usage"]["prompt_tokens"] for c in finals)
    status, _, events = sse(s.port, "/v1/completions", {**two, "stream_options": {"include_usage": True}})
    chunks = [json.loads(e) for e in events[:-1]]
    last = chunks[-1]
    check(status == 200 and events[-1] == "[DONE]" and last["choices"] == [] and
          last["usage"]["completion_tokens"] == 6 and last["usage"]["prompt_tokens"] == prompt_tokens and
          all("usage" not in c for c in chunks[:-1]),
          f"include_usage: only a last chunk, with every prompt's usage (OpenAI's shape): {chunks[-3:]}")
    # What /v1/completions does not serve is refused, not ignored.
    for extra in ({"n": 2}, {"best_of": 3}, {"echo": True}, {"logprobs": 2}, {"stream_options": 5}):
        status, _, body = request(s.port, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1, **extra})
        check(status == 422 and json.loads(body)["error_type"] == "validation", f"/v1/completions {extra}: {status} {body}")
    status, _, body = request(s.port, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "n": 1, "logprobs": None})
    check(status == 200, f"/v1/completions n=1, logprobs null: {status} {body}")
    # TGI's /vertex: {"instances": [...]} -> {"predictions": [...]}; an "inputs" instance samples with
    # its seed and max_new_tokens, a chat instance goes through the template.
    vertex = {"instances": [{"inputs": prompt, "parameters": {"max_new_tokens": 4, "seed": 7}},
                            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}]}
    status, headers, body = request(s.port, "POST", "/vertex", vertex)
    out = json.loads(body) if status == 200 else {}
    preds = out.get("predictions", [])
    check(status == 200 and len(preds) == 2 and all(isinstance(p, str) for p in preds),
          f"/vertex predictions: {status} {body[:300]}")
    again = json.loads(request(s.port, "POST", "/vertex", vertex)[2]).get("predictions")
    check(again == preds, f"/vertex with a seed is reproducible: {again} vs {preds}")
    status, _, body = request(s.port, "POST", "/generate", {"inputs": prompt, "parameters": {
        "max_new_tokens": 4, "seed": 7, "do_sample": True}})
    check(status == 200 and preds and json.loads(body)["generated_text"] == preds[0],
          f"an inputs instance is /generate with do_sample and its seed: {body} vs {preds[:1]}")
    for bad in ({"instances": []}, {}, {"instances": {"inputs": "x"}}, {"instances": [5]}, {"instances": [{"foo": 1}]},
                {"instances": [{"inputs": "x", "parameters": {"max_new_tokens": "a"}}]},
                {"instances": [{"inputs": ""}]}, {"instances": [{"messages": "hi"}]}, [1, 2]):
        status, _, body = request(s.port, "POST", "/vertex", bad)
        check(status == 422 and json.loads(body)["error_type"] == "validation", f"/vertex {bad}: {status} {body}")


def alive(s):
    return request(s.port, "GET", "/health")[0] == 200


def test_hostile_requests(s):
    """Inputs that used to kill the router (an exception escaping a route, a stack overflow) or to
    fail other users' requests; each is now a 4xx and the router serves on."""
    for body, field in [({"prompt": "x", "stream": "yes"}, "stream"), ({"prompt": "x", "model": 5}, "model"),
                        ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"), ({"prompt": 5}, "prompt"),
                        ({"prompt": "x", "temperature": "hot"}, "temperature"), ({"prompt": ["a", 1]}, "prompt")]:
        status, _, b = request(s.port, "POST", "/v1/completions", body)
        check(status == 422 and field in json.loads(b)["error"], f"/v1/completions {body}: {status} {b[:200]}")
    check(alive(s), "alive after wrong-typed fields")
    deep = "[" * 100000 + "]" * 100000
    for path, body in [("/v1/completions", '{"prompt": "x", "stop": ' + deep + "}"),
                       ("/generate", '{"inputs": "x", "parameters": {"grammar": ' + deep + "}}"),
                       ("/tokenize", '{"inputs": ' + deep + "}")]:
        status, _, b = request(s.port, "POST", path, body)
        check(status == 422 and "nests deeper" in b, f"deep nesting on {path}: {status} {b[:200]}")
    check(alive(s), "alive after deep nesting")
    # A chunked body is counted while it arrives: 413 long before 3 MB have been sent.
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"10000\r\n" + b"a" * 0x10000 + b"\r\n"
    got = b""
    try:
        for _ in range(48):
            sock.sendall(chunk)
    except OSError:
        pass  # the server closed after answering
    sock.settimeout(10)
    try:
        while b"\r\n\r\n" not in got:
            data = sock.recv(4096)
            if not data:
                break
            got += data
    except OSError:
        pass
    sock.close()
    check(got.startswith(b"HTTP/1.1 413"), f"chunked body over --payload-limit: {got[:80]}")
    # /tokenize has /generate's input limit (the reference router allows 255 input tokens).
    status, _, b = request(s.port, "POST", "/tokenize", {"inputs": "hello world " * 400})
    check(status == 422 and "must have less than" in b, f"/tokenize over max_input_tokens: {status} {b[:200]}")
    # Sampling values the shard would refuse are refused here, and fail no one else.
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("sse", sse(
        s.port, "/generate_stream", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 20}})))
    t.start()
    for params in ({"temperature": 1e39, "do_sample": True}, {"repetition_penalty": 1e-40},
                   {"temperature": 1e-30, "do_sample": True}):
        status, _, b = request(s.port, "POST", "/generate", {"inputs": PROMPTS[1], "parameters": params})
        check(status == 422, f"{params}: {status} {b[:200]}")
    t.join(timeout=60)
    events = box.get("sse", (None, None, []))[2]
    check(events and json.loads(events[-1]).get("generated_text") is not None,
          f"a concurrent stream finishes: {events[-1:]}")


def test_api_key(workdir):
    s = Server(workdir, ["--api-key", "s3cret"])
    try:
        for path, body in [("/generate", {"inputs": "x"}), ("/generate_stream", {"inputs": "x"}),
                           ("/v1/completions", {"prompt": "x"}), ("/tokenize", {"inputs": "x"}), ("/", {"inputs": "x"})]:
            check(request(s.port, "POST", path, body)[0] == 401, f"{path} without the key")
            check(request(s.port, "POST", path, body, {"Authorization": "Bearer s3cre"})[0] == 401,
                  f"{path} with a wrong key")
        status, _, _ = request(s.port, "POST", "/tokenize", {"inputs": "hello"}, {"Authorization": "Bearer s3cret"})
        check(status == 200, f"/tokenize with the key: {status}")
        status, _, _ = request(s.port, "POST", "/generate", {"inputs": "hello", "parameters": {"max_new_tokens": 2}},
                               {"Authorization": "bearer s3cret"})
        check(status == 200, f"the scheme is case-insensitive: {status}")
        for path in ("/health", "/info", "/metrics", "/v1/models", "/ping"):
            check(request(s.port, "GET", path)[0] == 200, f"{path} stays open, as in TGI")
    finally:
        s.close()


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_descriptor_exhaustion(workdir):
    """Out of file descriptors, the router backs off instead of spinning on accept() and flooding
    its log, and serves again once connections close."""
    s = Server(workdir, router_nofile=64)
    try:
        idle = []
        for _ in range(100):
            try:
                idle.append(socket.create_connection(("127.0.0.1", s.port), timeout=5))
            except OSError:
                break
        before = cpu_seconds(s.router.pid)
        t0 = time.time()
        while time.time() - t0 < 2:
            time.sleep(0.1)
        spent = cpu_seconds(s.router.pid) - before
        check(spent < 0.5, f"router CPU while out of descriptors: {spent:.2f} s in 2 s")
        for c in idle:
            c.close()
        deadline, status = time.time() + 20, None
        while time.time() < deadline and status != 200:
            try:
                status = request(s.port, "GET", "/health", timeout=5)[0]
            except OSError:
                time.sleep(0.1)
        check(status == 200, f"serving again after the connections closed: {status}")
    finally:
        s.router.send_signal(signal.SIGTERM)
        try:
            _, err = s.router.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            s.router.kill()
            _, err = s.router.communicate()
        lines = err.count("accept failed")
        check(lines < 20, f"accept failures are reported at most once a second: {lines} lines")
        stop(s.shard)


def test_large_inputs_do_not_stall_others(s):
    """Tokenizing 2 MB prompts runs on the validation workers, not the HTTP threads: /health stays
    prompt while eight of them are in flight (it took 2.2 s when they ran on the HTTP threads),
    and at most --validation-workers of them hold their tokens in memory at once."""
    body = {"inputs": "a " * 950000}
    box = in_parallel_start(8, lambda _: request(s.port, "POST", "/tokenize", body, timeout=120))
    time.sleep(0.3)  # let the large requests arrive first (the check below is on latency, not order)
    t0 = time.time()
    status = request(s.port, "GET", "/health")[0]
    health = time.time() - t0
    t0 = time.time()
    gen = generate(s.port, PROMPTS[0], 4)[0]
    small = time.time() - t0
    codes = [r[0] if r else None for r in in_parallel_join(box)]
    check(status == 200 and health < 1.0, f"/health during large prompts: {status} in {health:.2f} s")
    # It waits in the validation workers' queue behind the large prompts (FIFO, as TGI's).
    print(f"  small /generate during eight 2 MB prompts: {gen} in {small:.2f} s", flush=True)
    check(gen == 200, f"small /generate during large prompts: {gen} in {small:.2f} s")
    check(set(codes) <= {422, 429}, f"the large prompts are refused: {codes}")


def in_parallel_start(n, fn):
    out = [None] * n

    def run(i):
        out[i] = fn(i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, out


def in_parallel_join(box, timeout=180):
    threads, out = box
    for t in threads:
        t.join(timeout=timeout)
    return out


def test_disconnect_frees_request(s):
    before = metric(s.port, 'tgi_request_failure{err="dropped"}')
    sock = socket.create_connection(("127.0.0.1", s.port))
    body = json.dumps({"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 200}})
    sock.sendall(f"POST /generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    got = b""
    while got.count(b"data:") < 2:
        got += sock.recv(4096)
    sock.close()
    deadline = time.time() + 20
    after = None
    while time.time() < deadline:
        after = metric(s.port, 'tgi_request_failure{err="dropped"}')
        if after and after != before:
            break
        time.sleep(0.05)
    check(after is not None and after != before, f"disconnect counted as dropped ({before} -> {after})")
    status, _, body = generate(s.port, PROMPTS[1], 4)
    check(status == 200, "still serving after a disconnect")


def gauge(port, name):
    line = metric(port, name)
    return float(line.split()[-1]) if line else None


def test_endpoint_picker_gauges(s):
    """What the Gateway API Inference Extension's endpoint pickers read from a pod: the queue,
    the running requests and the KV cache's use (0 to 1), live while a request streams and back
    to idle after it."""
    deadline = time.time() + 20
    while time.time() < deadline and gauge(s.port, "textgen_num_requests_running") != 0:
        time.sleep(0.05)
    check(gauge(s.port, "textgen_num_requests_running") == 0 and
          gauge(s.port, "textgen_kv_cache_usage_perc") == 0 and gauge(s.port, "tgi_queue_size") == 0,
          "idle: no running requests, no KV blocks in use, an empty queue: " +
          f"{metric(s.port, 'textgen_num_requests_running')}, {metric(s.port, 'textgen_kv_cache_usage_perc')}, "
          f"{metric(s.port, 'tgi_queue_size')}")
    sock = socket.create_connection(("127.0.0.1", s.port))
    body = json.dumps({"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 200}})
    sock.sendall(f"POST /generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    got = b""
    while got.count(b"data:") < 2:
        got += sock.recv(4096)
    running, usage = gauge(s.port, "textgen_num_requests_running"), gauge(s.port, "textgen_kv_cache_usage_perc")
    sock.close()
    check(running == 1, f"streaming: textgen_num_requests_running 1 ({running})")
    check(usage is not None and 0 < usage <= 1, f"streaming: 0 < textgen_kv_cache_usage_perc <= 1 ({usage})")
    deadline = time.time() + 20
    while time.time() < deadline and (gauge(s.port, "textgen_num_requests_running") != 0 or
                                      gauge(s.port, "textgen_kv_cache_usage_perc") != 0):
        time.sleep(0.05)
    check(gauge(s.port, "textgen_num_requests_running") == 0 and gauge(s.port, "textgen_kv_cache_usage_perc") == 0,
          "after the stream: back to 0 running, 0 KV use")
    _, _, text = request(s.port, "GET", "/metrics")
    check("# TYPE textgen_kv_cache_usage_perc gauge" in text and "# TYPE textgen_num_requests_running gauge" in text,
          "both are gauges")


def dashboard_metrics():
    """The metric names textgen's Grafana dashboard queries (charts/textgen/dashboards/textgen.json),
    with a histogram's _bucket/_sum/_count series named by their family."""
    import re
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "charts", "textgen", "dashboards", "textgen.json")
    names = set()
    for panel in json.load(open(path))["panels"]:
        for target in panel.get("targets", []):
            for name in re.findall(r"\b((?:tgi|textgen)_[a-z_]+)\b", target["expr"]):
                names.add(re.sub(r"_(bucket|sum|count)$", "", name))
    return names


SEEN_FAMILIES = set()  # metric families the servers exposed after their traffic


def test_filter_batch(s):
    """A client that leaves while another request runs in its batch: the shards filter it out
    (FilterBatch, timed by tgi_batch_filter_duration), and the other answer is whole."""
    sock = socket.create_connection(("127.0.0.1", s.port))
    body = json.dumps({"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 200}})
    sock.sendall(f"POST /generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    got = b""
    while got.count(b"data:") < 2:
        got += sock.recv(4096)
    box = in_parallel_start(1, lambda i: generate(s.port, PROMPTS[1], 60))
    deadline = time.time() + 20
    while time.time() < deadline and gauge(s.port, "textgen_num_requests_running") != 2:
        time.sleep(0.01)
    sock.close()
    other = in_parallel_join(box)[0]
    check(other is not None and other[0] == 200 and other[2]["details"]["generated_tokens"] > 0,
          f"the request beside one that left: {other and other[0]}")
    check("tgi_batch_filter_duration" in metric_families(s.port), "a FilterBatch call was timed")


def test_dashboard_metrics():
    """Every metric the Grafana dashboard queries is one the router exposes (seen on this test's
    servers once their traffic made it appear: a failure, a preemption, a speculated token)."""
    wanted = dashboard_metrics()
    missing = sorted(wanted - SEEN_FAMILIES)
    check(len(wanted) >= 20 and not missing, f"dashboard metrics missing from /metrics: {missing}")


def metric_families(port):
    _, _, text = request(port, "GET", "/metrics")
    return {l.split()[2] for l in text.splitlines() if l.startswith("# TYPE ")}


def test_overload(workdir):
    s = Server(workdir, ["--max-concurrent-requests", "2"])
    try:
        codes = [r[0] for r in in_parallel(8, lambda _: request(
            s.port, "POST", "/generate", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 60}}))]
        check(codes.count(429) >= 1 and codes.count(200) >= 2 and set(codes) <= {200, 429}, f"overload codes {codes}")
        check(metric(s.port, 'tgi_request_failure{err="overloaded"}') is not None, "overload metric")
    finally:
        s.close()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_prometheus_scrape(s, workdir):
    """A real Prometheus server scrapes /metrics and can query TGI's metrics."""
    binary = shutil.which("prometheus")
    check(binary is not None, "prometheus is installed (tools/install-deps.sh)")
    if not binary:
        return
    port = free_port()
    config = os.path.join(workdir, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: textgen\n"
                f"    static_configs:\n      - targets: ['127.0.0.1:{s.port}']\n")
    p = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={workdir}/tsdb",
                          f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        found = None
        deadline = time.time() + 60
        while time.time() < deadline and not found:
            try:
                status, _, body = request(port, "GET", "/api/v1/query?query=tgi_request_count", timeout=5)
                result = json.loads(body)["data"]["result"] if status == 200 else []
                found = result[0]["value"][1] if result else None
            except (OSError, ValueError, KeyError):
                pass
            if not found:
                time.sleep(0.2)
        check(found is not None and float(found) > 0, f"Prometheus scraped tgi_request_count = {found}")
        status, _, body = request(port, "GET", "/api/v1/targets")
        health = [t["health"] for t in json.loads(body)["data"]["activeTargets"]] if status == 200 else []
        check(health == ["up"], f"scrape target health {health}")
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_node_clients(s):
    """The npm packages openai and @huggingface/inference, unmodified, against this router."""
    clients = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients")
    node = shutil.which("node")
    installed = os.path.isdir(os.path.join(clients, "node_modules", "openai"))
    check(node is not None and installed, "node and tests/clients/node_modules (tools/install-deps.sh)")
    if not (node and installed):
        return
    p = subprocess.run([node, "--test", os.path.join(clients, "clients.test.mjs")], capture_output=True, text=True,
                       env={**os.environ, "TEXTGEN_URL": f"http://127.0.0.1:{s.port}"}, timeout=120)
    check(p.returncode == 0, f"node client tests: {p.stdout[-3000:]} {p.stderr[-2000:]}")


def test_shard_death(s):
    results_box = {}

    def stream():
        results_box["sse"] = sse(s.port, "/generate_stream", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 200}})

    def chat_stream():
        results_box["chat"] = sse(s.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                                   "max_tokens": 200, "stream": True})
    threads = [threading.Thread(target=stream), threading.Thread(target=chat_stream)]
    for t in threads:
        t.start()
    deadline = time.time() + 20
    while time.time() < deadline and not (metric(s.port, "tgi_batch_current_size") or "0").endswith(" 2"):
        time.sleep(0.01)
    s.shard.kill()
    s.shard.wait()
    for t in threads:
        t.join(timeout=60)
    status, _, events = results_box.get("sse", (None, None, []))
    check(events and json.loads(events[-1]).get("error_type") == "generation", f"in-flight stream gets a generation error: {events[-1:]}")
    # An OpenAI stream's error is TGI's OpenAI error event ({"error": {"message", ...}}), then [DONE].
    status, _, events = results_box.get("chat", (None, None, []))
    err = json.loads(events[-2]).get("error") if len(events) >= 2 and events[-1] == "[DONE]" else None
    check(isinstance(err, dict) and err.get("message") and err.get("http_status_code") == 424,
          f"in-flight chat stream gets an OpenAI error event and [DONE]: {events[-2:]}")
    status, _, body = request(s.port, "POST", "/generate", {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 4}})
    check(status == 424 and json.loads(body)["error_type"] == "generation", f"424 after the shard died: {status} {body}")
    check(request(s.port, "GET", "/health")[0] == 503, "/health is 503 with the shard gone")
    # The shard comes back on the same socket: the router re-warms it and serves again.
    s.shard, _ = start([SHARD, "--model-id", MODEL, "--uds-path", s.shard_addr[len("unix://"):-len("-0")],
                        "--kv-cache-memory", "8000000", "--threads", "1", "--log-level", "warn"], "textgen-shard ready ")
    deadline, status, body = time.time() + 30, None, ""
    while time.time() < deadline and status != 200:
        status, _, body = generate(s.port, PROMPTS[2], 6)
        if status != 200:
            time.sleep(0.1)
    check(status == 200 and [t["id"] for t in body["details"]["tokens"]] == GREEDY[2][:6], f"served again after recovery: {status}")
    check(request(s.port, "GET", "/health")[0] == 200, "/health is 200 again")


def test_promtool(s):
    promtool = shutil.which("promtool")
    check(promtool is not None, "promtool is installed (tools/install-deps.sh)")
    if not promtool:
        return
    _, _, text = request(s.port, "GET", "/metrics")
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    # Exit 3 is "lint findings" (parse errors are 1). TGI's own counter names (tgi_request_count,
    # tgi_request_success, ...) break the _total/_count naming lints; dashboards need those names, so
    # exactly those findings are allowed and anything else fails.
    tgi_names = {"tgi_request_count", "tgi_request_success", "tgi_request_failure", "tgi_batch_concat",
                 "tgi_batch_inference_count", "tgi_batch_inference_success", "tgi_batch_inference_failure"}
    findings = [l for l in (p.stdout + p.stderr).splitlines() if l.strip()]
    unexpected = [l for l in findings if not (l.split()[0] in tgi_names and
                  ('should have "_total" suffix' in l or 'should not have "_count" suffix' in l))]
    check(p.returncode in (0, 3) and not unexpected, f"promtool check metrics: rc {p.returncode}, {unexpected}")


def test_replicas(workdir):
    """Two replicas behind one router: work spreads by load, a dead replica is routed around."""
    shards = []
    for i in range(2):
        p, addr = start([SHARD, "--model-id", MODEL, "--uds-path", os.path.join(workdir, f"rep{i}"), "--kv-cache-memory",
                         "8000000", "--threads", "1", "--log-level", "warn"], "textgen-shard ready ")
        shards.append((p, addr))
    router, url = start([ROUTER, "--tokenizer-name", MODEL, "--shard-master", shards[0][1], "--shard-master", shards[1][1],
                         "--hostname", "127.0.0.1", "--port", "0", "--max-batch-prefill-tokens", "256", "--log-level", "warn",
                         "--api-key", "sekret", "--cors-allow-origin", "https://app.example"], "textgen-router ready ")
    port = int(url.rsplit(":", 1)[1])
    auth = {"Authorization": "Bearer sekret"}
    try:
        status, _, _ = request(port, "POST", "/generate", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 2}})
        check(status == 401, f"missing API key is 401 ({status})")
        status, headers, _ = request(port, "POST", "/generate", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 2}},
                                     headers={**auth, "Origin": "https://app.example"})
        check(status == 200 and headers.get("Access-Control-Allow-Origin") == "https://app.example", f"auth + CORS {status}")
        status, headers, _ = request(port, "GET", "/info", headers={"Origin": "https://elsewhere.example"})
        check(status == 200 and "Access-Control-Allow-Origin" not in headers and headers.get("Vary") == "Origin",
              f"an origin not listed gets no CORS, and caches key on Origin: {headers}")
        status, headers, _ = request(port, "POST", "/generate", "x" * 3000000, headers={"Origin": "https://app.example"})
        check(status == 413 and headers.get("Access-Control-Allow-Origin") == "https://app.example",
              f"the server's own 413 carries CORS: {status} {headers}")
        # This model folder has no chat template and none was given: the chat routes are a clear 422.
        status, _, body = request(port, "POST", "/v1/chat/completions", {"messages": CHAT}, headers=auth)
        check(status == 422 and "no chat template" in body, f"chat without a template: {status} {body[:200]}")
        out = in_parallel(8, lambda i: request(port, "POST", "/generate", {
            "inputs": PROMPTS[i % 4], "parameters": {"max_new_tokens": 12, "details": True}}, headers=auth))
        for i in range(8):
            ids = [t["id"] for t in json.loads(out[i][2])["details"]["tokens"]] if out[i][0] == 200 else None
            check(ids == GREEDY[i % 4][:12], f"replicated request {i}: {out[i][0]}")
        status, _, body = request(port, "POST", "/generate", {"inputs": PROMPTS[0], "parameters": {
            "max_new_tokens": 4, "best_of": 2, "do_sample": True, "details": True}}, headers=auth)
        details = json.loads(body).get("details", {}) if status == 200 else {}
        check(status == 200 and len(details.get("best_of_sequences", [])) == 1, f"best_of: {status} {body[:200]}")
        shards[0][0].kill()
        shards[0][0].wait()
        codes = [request(port, "POST", "/generate", {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 3}},
                         headers=auth)[0] for _ in range(6)]
        check(codes[0] in (200, 424) and codes[1:] == [200] * 5, f"routed around the dead replica: {codes}")
        check(request(port, "GET", "/health")[0] == 200, "one healthy replica keeps /health at 200")
    finally:
        stop(router)
        for p, _ in shards:
            stop(p)


def wait_metric(port, line, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if metric(port, line.split()[0]) == line:
            return True
        time.sleep(0.05)
    return False


def test_discovery(workdir):
    """Replicas join and leave while the router runs (a file source re-read every 100 ms)."""
    shards = {}
    for name in ("a", "b"):
        shards[name] = start([SHARD, "--model-id", MODEL, "--uds-path", os.path.join(workdir, f"disc-{name}"),
                              "--kv-cache-memory", "8000000", "--threads", "1", "--log-level", "warn"], "textgen-shard ready ")
    source = os.path.join(workdir, "masters.txt")
    with open(source, "w") as f:
        f.write(shards["a"][1] + "\n")
    router, url = start([ROUTER, "--tokenizer-name", MODEL, "--shard-discovery", f"file:{source}", "--discovery-interval-ms",
                         "100", "--hostname", "127.0.0.1", "--port", "0", "--max-batch-prefill-tokens", "256",
                         "--log-level", "warn"], "textgen-router ready ")
    port = int(url.rsplit(":", 1)[1])
    try:
        check(metric(port, "textgen_replicas") == "textgen_replicas 1", "one replica at start")
        check(generate(port, PROMPTS[0], 4)[0] == 200, "served by replica a")
        with open(source, "w") as f:
            f.write(shards["a"][1] + "\n" + shards["b"][1] + "\n")
        check(wait_metric(port, "textgen_replicas 2"), "replica b joined")
        with open(source, "w") as f:
            f.write(shards["b"][1] + "\n")
        check(wait_metric(port, "textgen_replicas 1"), "replica a left")
        stop(shards["a"][0])  # a is gone from the set: nothing may be routed to it any more
        codes = [generate(port, PROMPTS[1], 3)[0] for _ in range(4)]
        check(codes == [200] * 4, f"served by replica b after a left: {codes}")
        # No replica (scaled to zero): a 503 at once, with Retry-After; serving again when one is back.
        with open(source, "w") as f:
            f.write("")
        if check(wait_metric(port, "textgen_replicas 0"), "no replica left"):
            t0 = time.time()
            status, headers, body = request(port, "POST", "/generate",
                                            {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 3}})
            took = time.time() - t0
            retry = {k.lower(): v for k, v in dict(headers).items()}.get("retry-after")
            check(status == 503 and retry is not None and retry.isdigit() and took < 5 and
                  json.loads(body).get("error_type") == "unhealthy",
                  f"no replica: 503 with Retry-After {retry} in {took:.2f} s: {status} {body}")
            with open(source, "w") as f:
                f.write(shards["b"][1] + "\n")
            check(wait_metric(port, "textgen_replicas 1"), "replica b back")
            check(generate(port, PROMPTS[1], 3)[0] == 200, "served again by replica b")
    finally:
        stop(router)
        for p, _ in shards.values():
            stop(p)


def test_discovery_cold_start(workdir):
    """A router started with --shard-discovery and no replica (its service scaled to zero) listens at
    once: 503 with Retry-After, /health 503, --api-key enforced, the refused generation requests
    counted (what wakes a scaled-to-zero service); it serves once a replica appears. SIGTERM while
    it waits: a clean exit."""
    source = os.path.join(workdir, "cold-masters.txt")
    open(source, "w").close()
    port = free_port()
    cmd = [ROUTER, "--tokenizer-name", MODEL, "--shard-discovery", f"file:{source}", "--discovery-interval-ms", "100",
           "--hostname", "127.0.0.1", "--port", str(port), "--max-batch-prefill-tokens", "256", "--api-key", "k",
           "--cors-allow-origin", "https://app.example", "--log-level", "warn"]
    router = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    shard = None
    try:
        def listening():
            try:
                return request(port, "GET", "/metrics", timeout=2)[0] == 200
            except OSError:
                return False
        deadline = time.time() + 20
        while time.time() < deadline and not listening():
            time.sleep(0.1)
        if not check(listening(), "a router without replicas listens"):
            return
        auth = {"Authorization": "Bearer k"}
        t0 = time.time()
        status, headers, body = request(port, "POST", "/generate", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 3}}, auth)
        retry = {k.lower(): v for k, v in headers.items()}.get("retry-after")
        check(status == 503 and retry == "10" and time.time() - t0 < 5 and json.loads(body).get("error_type") == "unhealthy",
              f"no replica yet: 503 with Retry-After at once: {status} {retry} {body}")
        check(request(port, "POST", "/v1/chat/completions", {"messages": []}, auth)[0] == 503, "chat: 503")
        status, headers, _ = request(port, "OPTIONS", "/generate", headers={"Origin": "https://app.example"})
        allow = {k.lower(): v for k, v in headers.items()}
        check(status == 200 and allow.get("access-control-allow-origin") == "https://app.example" and
              "POST" in allow.get("access-control-allow-methods", ""),
              f"a CORS preflight before a replica: {status} {headers}")
        status, headers, _ = request(port, "POST", "/generate", {"inputs": "x"}, {**auth, "Origin": "https://app.example"})
        check(status == 503 and {k.lower(): v for k, v in headers.items()}.get("access-control-allow-origin") ==
              "https://app.example", f"the 503 carries the CORS header: {headers}")
        check(request(port, "POST", "/generate", {"inputs": "x"})[0] == 401, "--api-key enforced before a replica")
        check(request(port, "GET", "/health")[0] == 503, "/health 503 before a replica")
        check(request(port, "GET", "/info")[0] == 503, "/info 503 before a replica (the limits are unknown)")
        check(metric(port, "tgi_request_count") == "tgi_request_count 3",
              f"refused generation requests counted: {metric(port, 'tgi_request_count')}")
        shard, addr = start([SHARD, "--model-id", MODEL, "--uds-path", os.path.join(workdir, "cold-shard"),
                             "--kv-cache-memory", "8000000", "--threads", "1", "--log-level", "warn"], "textgen-shard ready ")
        with open(source, "w") as f:
            f.write(addr + "\n")
        ready = router.stdout.readline()
        check(ready.startswith("textgen-router ready "), f"ready once a replica is up: {ready!r}")
        status = request(port, "POST", "/generate", {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 3}}, auth)[0]
        check(status == 200, f"served once a replica is up: {status}")
        check(metric(port, "textgen_replicas") == "textgen_replicas 1", "one replica")
    finally:
        stop(router)
        stop(shard)
    # Stopped while waiting for a first replica (its source empty again).
    open(source, "w").close()
    router = subprocess.Popen(cmd[:cmd.index("--port") + 1] + [str(free_port())] + cmd[cmd.index("--port") + 2:],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)
    router.send_signal(signal.SIGTERM)
    try:
        check(router.wait(timeout=10) == 0, "SIGTERM before any replica: a clean exit")
    except subprocess.TimeoutExpired:
        router.kill()
        check(False, "SIGTERM before any replica: the router did not exit")


def main():
    workdir = tempfile.mkdtemp(prefix="textgen-router-test-")
    s = Server(workdir)
    try:
        for test in (test_routes, test_generate_equals_reference, test_prefix_cache, test_concurrent_equals_alone, test_stream, test_errors,
                     test_hostile_requests, test_large_inputs_do_not_stall_others, test_many_streams, test_tgi_compat, test_disconnect_frees_request, test_endpoint_picker_gauges, test_filter_batch, test_promtool,
                     test_chat, test_constrained, test_tools, test_chat_errors):
            test(s)
        test_prometheus_scrape(s, workdir)
        test_node_clients(s)
        test_shard_death(s)
        SEEN_FAMILIES.update(metric_families(s.port))
    finally:
        s.close()
    test_preemption(workdir)
    test_overload(workdir)
    test_api_key(workdir)
    test_descriptor_exhaustion(workdir)
    test_replicas(workdir)
    test_discovery(workdir)
    test_discovery_cold_start(workdir)
    test_dashboard_metrics()
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
