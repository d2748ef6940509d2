#!/usr/bin/env python3
"""/docs, the API page (Swagger UI over /api-doc/openapi.json), on the real textgen-router in front of a
real textgen-shard (router_test.py's Server), rendered offline by headless Chromium.

Usage: docs_page_test.py ROUTER_BINARY SHARD_BINARY MODEL_DIR

- The page, its script and the vendored swagger-ui-dist files (next to the router: <build>/swagger-ui/)
  with their Content-Type, Cache-Control and security headers; HEAD; no remote URL in what is served.
- Hostile paths (traversal, encoded dots, absolute forms, NUL bytes, very long names, files of the
  package outside the allow-list) answer 404 with TGI's error JSON; other methods 405.
- Chromium (--headless, no network but 127.0.0.1) takes a screenshot, which must be a PNG of the window's
  size showing GET's blue and POST's green, and dumps the rendered DOM, which must show every path of
  /api-doc/openapi.json; the screenshot stays in the test's temporary directory.
- A router whose --docs-dir lacks the files (empty, a FIFO, a directory in a file's place) starts and
  serves, and /docs answers 503 naming the missing file.
Prints "N passed, M failed" and exits non-zero on any failure.
"""
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import router_test as rt  # noqa: E402  (router_test reads the same three arguments)

ROUTER, SHARD, MODEL = sys.argv[1:4]
ASSETS = os.path.join(os.path.dirname(os.path.abspath(ROUTER)), "swagger-ui")
VENDORED = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
            "favicon-32x32.png": "image/png", "favicon-16x16.png": "image/png"}
results = rt.results


def check(cond, what):
    rt.check(cond, what)
    return cond


def raw(port, target, method="GET", body=b"", timeout=30):
    """One request with the request target sent byte for byte; (status, headers, body) or (0, {}, b"")
    when the server closed without answering."""
    target = target if isinstance(target, bytes) else target.encode()
    head = b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % (
        method.encode(), target, len(body))
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    if not data:
        return 0, {}, b""
    header, _, content = data.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(lines[0].split()[1]), headers, content


def is_error_json(body, error_type=None):
    try:
        j = json.loads(body)
    except ValueError:
        return False
    return isinstance(j, dict) and isinstance(j.get("error"), str) and isinstance(j.get("error_type"), str) and (
        error_type is None or j["error_type"] == error_type)


def test_page(port):
    status, h, page = raw(port, "/docs")
    text = page.decode()
    check(status == 200 and h.get("content-type") == "text/html; charset=utf-8", f"/docs: {status} {h}")
    check(h.get("cache-control") == "no-cache" and h.get("x-content-type-options") == "nosniff" and
          "default-src 'none'" in h.get("content-security-policy", "") and
          "connect-src 'self'" in h.get("content-security-policy", ""), f"/docs headers {h}")
    check("http://" not in text and "https://" not in text and "//" not in text.replace("<!DOCTYPE", ""),
          "the page names no other origin")
    for name in ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png", "textgen-docs.js"):
        check(f'"/docs/{name}?v=' in text, f"the page loads /docs/{name}")
    check(raw(port, "/docs/")[2] == page, "/docs/ is the same page")
    check(raw(port, "/docs?x=1")[2] == page, "/docs with a query")

    status, h, script = raw(port, "/docs/textgen-docs.js")
    check(status == 200 and h.get("content-type") == "text/javascript; charset=utf-8" and
          b'url: "/api-doc/openapi.json"' in script and b"validatorUrl: null" in script and
          b"http" not in script, f"/docs/textgen-docs.js: {status} {h} {script[:200]!r}")

    for name, ctype in VENDORED.items():
        path = os.path.join(ASSETS, name)
        if not check(os.path.isfile(path), f"{path} missing: tools/fetch-swagger-ui.sh, then build textgen-router"):
            continue
        status, h, body = raw(port, f"/docs/{name}?v=1")
        check(status == 200 and h.get("content-type", "").startswith(ctype) and
              h.get("cache-control") == "public, max-age=604800" and h.get("x-content-type-options") == "nosniff",
              f"/docs/{name}: {status} {h}")
        check(body == open(path, "rb").read(), f"/docs/{name} is the vendored file")

    # HEAD: the GET's status and headers, Content-Length the GET's body's, no body (the connection
    # stays usable, which http.client checks by reading the next answer).
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("HEAD", "/docs/swagger-ui.css")
    r = c.getresponse()
    r.read()
    check(r.status == 200 and r.getheader("Content-Type") == "text/css; charset=utf-8", f"HEAD: {r.status}")
    css_path = os.path.join(ASSETS, "swagger-ui.css")
    css = open(css_path, "rb").read() if os.path.isfile(css_path) else None
    check(css is not None and r.getheader("Content-Length") == str(len(css)),
          f"HEAD: Content-Length is the GET's body's ({r.getheader('Content-Length')})")
    c.request("GET", "/docs")
    r = c.getresponse()
    check(r.status == 200 and r.read() == page, "GET after HEAD on one connection")
    c.close()


def test_hostile(port):
    not_found = [
        "/docs/../../etc/passwd", "/docs/../api-doc/openapi.json", "/docs/%2e%2e/%2e%2e/etc/passwd",
        "/docs/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd", "/docs/..%2f..%2fetc%2fpasswd", "/docs/..%5c..%5cetc%5cpasswd",
        "/docs/..\\..\\etc\\passwd", "/docs//etc/passwd", "/docs/etc/passwd", "/docs/swagger-ui.css/../../../etc/passwd",
        "/docs/./swagger-ui.css", "/docs/%73wagger-ui.css", "/docs/SWAGGER-UI.CSS", "/docs/swagger-ui.css.map",
        "/docs/swagger-ui.css%00.png", "/docs/%00", "/docs/index.html", "/docs/LICENSE", "/docs/NOTICE",
        "/docs/VERSION", "/docs/INTEGRITY", "/docs/swagger-ui-standalone-preset.js", "/docs/swagger-ui",
        "/docs/" + "A" * 60000, "/docs/" + "../" * 5000 + "etc/passwd", "/docs/%" , "/docs/%zz",
        "/docs/\xff\xfe".encode("latin-1"),
    ]
    for target in not_found:
        status, h, body = raw(port, target)
        check(status == 404 and is_error_json(body, "not_found") and b"root:" not in body,
              f"{target[:80]!r}: {status} {body[:200]!r}")
    # Not /docs at all (the router's own 404), or refused by the HTTP layer before any route.
    for target in ("/etc/passwd", "//docs/swagger-ui.css", "/docsx", "/Docs", "http://127.0.0.1/etc/passwd",
                   "/api-doc/../etc/passwd"):
        status, _, body = raw(port, target)
        check(status == 404 and is_error_json(body) and b"root:" not in body, f"{target!r}: {status} {body[:200]!r}")
    for target in (b"/docs/swagger-ui.css\x00", b"/docs/\x00/../etc/passwd", b"/docs/a b", b"/docs/" + b"A" * 70000):
        status, _, body = raw(port, target)
        check(status in (400, 404, 431) and (not body or is_error_json(body)), f"{target[:60]!r}: {status} {body[:200]!r}")
    # Other methods: 405 naming GET and HEAD, whatever the body.
    for method, target in (("POST", "/docs"), ("PUT", "/docs/swagger-ui.css"), ("DELETE", "/docs/"),
                           ("PATCH", "/docs/textgen-docs.js"), ("POST", "/docs/favicon-16x16.png")):
        status, h, body = raw(port, target, method, b'{"inputs": "x"}')
        check(status == 405 and h.get("allow") == "GET, HEAD" and is_error_json(body, "method_not_allowed"),
              f"{method} {target}: {status} {h} {body[:200]!r}")
    check(raw(port, "/docs/nope", "POST")[0] == 404, "POST to an unknown name: 404")
    check(raw(port, "/health")[0] == 200, "the router serves after the hostile requests")


def png_pixels(data):
    """(width, height, rows of RGB(A) tuples' bytes) of an 8-bit RGB or RGBA PNG, checking its chunks' CRCs."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        crc = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]
        assert zlib.crc32(kind + chunk) == crc, f"bad CRC in {kind}"
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and color in (2, 6), f"depth {depth} color type {color}"
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
        pos += 12 + length
    raw_rows, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw_rows[y * (stride + 1)], bytearray(raw_rows[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def chromium(work, port, *args):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    # No network but the router: every other host fails to resolve, so a remote URL cannot load.
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           "--disable-background-networking", "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
           f"--user-data-dir={os.path.join(work, 'profile')}",
           "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--virtual-time-budget=15000",
           "--enable-logging=stderr", "--v=0", *args, f"http://127.0.0.1:{port}/docs"]
    return subprocess.run(cmd, capture_output=True, timeout=90, cwd=work)


def test_chromium(port, work):
    if not check(shutil.which("chromium") or shutil.which("chromium-browser"),
                 "chromium is not installed (tools/install-deps.sh installs it)"):
        return
    paths = list(json.loads(raw(port, "/api-doc/openapi.json")[2])["paths"])
    shot = os.path.join(work, "docs.png")
    width, height = 1280, 1600
    r = chromium(work, port, f"--screenshot={shot}", f"--window-size={width},{height}")
    if not check(os.path.isfile(shot), f"no screenshot: {r.returncode} {r.stderr.decode(errors='replace')[-2000:]}"):
        return
    try:
        w, h, bpp, rows = png_pixels(open(shot, "rb").read())
    except (AssertionError, zlib.error, struct.error) as e:
        check(False, f"{shot} is not a valid PNG: {e}")
        return
    check((w, h) == (width, height), f"screenshot {w}x{h}, window {width}x{height}")
    colors, blue, green = set(), 0, 0
    for row in rows[::2]:
        for x in range(0, w * bpp, bpp * 2):
            px = row[x:x + 3]
            colors.add(px)
            blue += px == b"\x61\xaf\xfe"   # GET's badge (#61affe)
            green += px == b"\x49\xcc\x90"  # POST's badge (#49cc90)
    check(len(colors) > 50 and blue > 100 and green > 100,
          f"screenshot not rendered: {len(colors)} colours, {blue} GET-blue and {green} POST-green samples")
    print(f"screenshot: {shot}", flush=True)

    r = chromium(work, port, "--dump-dom")
    dom = r.stdout.decode(errors="replace")
    with open(os.path.join(work, "docs.html"), "w") as f:
        f.write(dom)
    check("swagger-ui" in dom and "textgen-router" in dom, f"DOM not rendered: {dom[:500]!r}")
    for path in paths:
        check(f'data-path="{path}"' in dom, f"{path} of openapi.json is not on the rendered page")
    logs = r.stderr.decode(errors="replace")
    check("Content Security Policy" not in logs and "ERR_NAME_NOT_RESOLVED" not in logs and
          "Failed to load" not in logs,
          f"the page reached for something it may not: {logs[-2000:]}")


def test_missing_assets(shard_addr, work):
    """Routers whose docs directory lacks swagger-ui-dist's files: they start, serve, and /docs says why."""
    empty = os.path.join(work, "empty")
    odd = os.path.join(work, "odd")  # a FIFO and a directory where files belong: no hang, no crash
    os.makedirs(empty)
    os.makedirs(os.path.join(odd, "swagger-ui.css"))
    os.mkfifo(os.path.join(odd, "swagger-ui-bundle.js"))
    for docs_dir, missing in ((empty, "swagger-ui-bundle.js"), (odd, "swagger-ui-bundle.js"),
                              (os.path.join(work, "nowhere"), "swagger-ui-bundle.js")):
        router, url = rt.start([ROUTER, "--tokenizer-name", MODEL, "--shard-master", shard_addr, "--hostname", "127.0.0.1",
                                "--port", "0", "--max-batch-prefill-tokens", "256", "--log-level", "warn",
                                "--docs-dir", docs_dir], "textgen-router ready ")
        port = int(url.rsplit(":", 1)[1])
        try:
            for target in ("/docs", "/docs/swagger-ui.css", "/docs/textgen-docs.js"):
                status, _, body = raw(port, target)
                check(status == 503 and is_error_json(body, "docs_unavailable") and missing.encode() in body and
                      b"fetch-swagger-ui.sh" in body, f"{docs_dir} {target}: {status} {body[:300]!r}")
            check(raw(port, "/docs/../etc/passwd")[0] == 404, "missing files: traversal still 404")
            check(raw(port, "/docs", "POST")[0] == 405, "missing files: POST still 405")
            check(raw(port, "/health")[0] == 200 and raw(port, "/api-doc/openapi.json")[0] == 200,
                  f"{docs_dir}: the router serves without the page")
        finally:
            rt.stop(router)


def main():
    work = tempfile.mkdtemp(prefix="textgen-docs-page-test-")
    s = rt.Server(work)
    try:
        test_page(s.port)
        test_hostile(s.port)
        test_chromium(s.port, work)
        rt.stop(s.router)
        test_missing_assets(s.shard_addr, work)
    finally:
        s.close()
    shutil.rmtree(os.path.join(work, "profile"), ignore_errors=True)
    print(f"{results['passed']} passed, {results['failed']} failed (screenshot and DOM in {work})")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
