#!/usr/bin/env python3
"""Writes tests/reference/chat_templates/references.json: every (template, message set) pair of the
corpus rendered with Python's jinja2 exactly as transformers configures it
(transformers/utils/chat_template_utils.py: ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True) with loopcontrols, its tojson filter, raise_exception, strftime_now), fed the
context TGI builds (router/src/infer/chat_template.rs and the message types in router/src/lib.rs):
flattened string contents, tool calls as JSON text, tools with their parameters as a JSON string,
the tool prompt appended to the last message, TGI's template rewrites, and TGI's trimming after a
final assistant message. router/src/chat/chat_template.cpp must reproduce every output byte for
byte (tests/unit/chat/chat_template_test.cpp).

    python3 tools/reference/render_chat_templates.py          (rewrites references.json)
    python3 tools/reference/render_chat_templates.py --check  (fails if it would change)

Pinned: jinja2 3.1.x (Debian 12's python3-jinja2 3.1.2); strftime_now is fixed to FIXED_NOW.
"""
import argparse
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FIXTURES = os.path.join(ROOT, "tests", "reference", "chat_templates")
FIXED_NOW = datetime.datetime(2024, 7, 26, 12, 0, 0)  # the C++ test injects the same time
DEFAULT_TOOL_PROMPT = (
    "\nGiven the functions available, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt. Respond in the format {name: function "
    "name, parameters: dictionary of argument name and its value}.Do not use variables.\n")


class RefusedError(Exception):
    """A request TGI's Rust types would refuse before rendering (bad messages or tools)."""


def compact(value):
    # serde_json::to_string (TGI's serde_json keeps key order: preserve_order is on).
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def flatten_content(content):
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise RefusedError("content")
    out = []
    for part in content:
        if part.get("type") == "text":
            out.append(part["text"])
        elif part.get("type") == "image_url":
            out.append("![](%s)" % part["image_url"]["url"])
        else:
            raise RefusedError("content part")
    return "".join(out)


def function_definition(fn):
    args = fn["arguments"] if "arguments" in fn else fn["parameters"]
    return {"description": fn.get("description"), "name": fn["name"], "arguments": compact(args)}


def tgi_context(case, reads_tools):
    """TGI's ChatTemplateInputs for one message set, and the final message (for the trim)."""
    tools = case.get("tools") or None
    messages = []
    for m in case["messages"]:
        content = m.get("content")
        if content is not None:
            messages.append({"role": m["role"], "content": flatten_content(content), "body": True})
        elif m.get("tool_calls") is not None:
            calls = [{"id": c["id"], "type": c["type"], "function": function_definition(c["function"])}
                     for c in m["tool_calls"]]
            messages.append({"role": m["role"], "content": compact(calls), "body": False})
        elif "content" in m:
            messages.append({"role": m["role"], "content": "", "body": True})
        else:
            raise RefusedError("message without content")
    ctx_tools = None
    if tools:
        ctx_tools = [{"type": t["type"], "function": function_definition(t["function"])} for t in tools]
        prompt = case.get("tool_prompt") or DEFAULT_TOOL_PROMPT
        if messages and messages[-1]["body"]:
            messages[-1]["content"] += ("\n---\n" + prompt if reads_tools else
                                        "\n---\n" + compact(ctx_tools) + "\n" + prompt)
    flat = [{"role": m["role"], "content": m["content"]} for m in messages]
    return flat, ctx_tools


def rust_trim_end(s):
    # Rust's str::trim_end (char::is_whitespace: Unicode White_Space), not Python's str.rstrip.
    ws = set(chr(c) for c in list(range(0x09, 0x0E)) + [0x20, 0x85, 0xA0, 0x1680] +
             list(range(0x2000, 0x200B)) + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
    end = len(s)
    while end > 0 and s[end - 1] in ws:
        end -= 1
    return s[:end]


def tgi_rewrites(source):
    source = source.replace("messages[0]['content'][0]['text']", "messages[0]['content']")
    source = source.replace("[::-1]", "|reverse")
    source = source.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    return source


def transformers_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' override: no HTML escaping, json.dumps' options exposed.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def reads_tools(env, source):
    # TGI: minijinja's undeclared_variables contains "tools".
    from jinja2 import meta
    return "tools" in meta.find_undeclared_variables(env.parse(source))


def render(env, spec, source, case):
    source = tgi_rewrites(source)
    uses_tools = reads_tools(env, source)
    messages, tools = tgi_context(case, uses_tools)
    template = env.from_string(source)
    try:
        out = template.render(messages=messages, bos_token=spec.get("bos", ""),
                              eos_token=spec.get("eos", ""),
                              add_generation_prompt=case.get("add_generation_prompt", True),
                              tools=tools)
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:  # raise_exception()
            return {"raise": str(e)}
        return {"error": "%s: %s" % (type(e).__name__, e)}
    except Exception as e:  # noqa: BLE001 - a render error of any kind is recorded, not fatal
        return {"error": "%s: %s" % (type(e).__name__, e)}
    if messages and messages[-1]["role"] == "assistant":
        last = messages[-1]["content"]
        at = out.rfind(last)
        if at >= 0:
            out = rust_trim_end(out[:at + len(last)])
    return {"output": out}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if references.json would change")
    args = parser.parse_args()
    with open(os.path.join(FIXTURES, "templates.json"), encoding="utf-8") as f:
        templates = json.load(f)
    with open(os.path.join(FIXTURES, "messages.json"), encoding="utf-8") as f:
        cases = json.load(f)
    env = transformers_env()
    results = []
    for name, spec in templates.items():
        with open(os.path.join(FIXTURES, "templates", spec["file"]), encoding="utf-8") as f:
            source = f.read()
        for case in cases:
            result = {"template": name, "messages": case["name"]}
            result.update(render(env, spec, source, case))
            results.append(result)
    doc = {
        "generated_by": "tools/reference/render_chat_templates.py",
        "jinja2": jinja2.__version__,
        "now": FIXED_NOW.isoformat(),
        "results": results,
    }
    text = json.dumps(doc, ensure_ascii=False, indent=1) + "\n"
    path = os.path.join(FIXTURES, "references.json")
    if args.check:
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit("references.json is out of date: run tools/reference/render_chat_templates.py")
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    counts = {k: sum(1 for r in results if k in r) for k in ("output", "raise", "error")}
    print("wrote %d renders to %s (%s)" % (len(results), os.path.relpath(path), counts))


if __name__ == "__main__":
    main()
