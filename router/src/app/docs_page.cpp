#include "docs_page.h"

#include <unistd.h>

#include <filesystem>

#include "textgen/base/file.h"
#include "textgen/base/log.h"
#include "textgen/router/router_app.h"

namespace textgen::router {
namespace {

namespace fs = std::filesystem;

// The swagger-ui-dist version the page is written for: tools/fetch-swagger-ui.sh's pin (with its
// hash), passed on by router/CMakeLists.txt; the ?v= of the page's URLs.
#ifndef TEXTGEN_SWAGGER_UI_VERSION
#error "router/CMakeLists.txt defines TEXTGEN_SWAGGER_UI_VERSION from tools/fetch-swagger-ui.sh"
#endif
constexpr const char* kSwaggerUiVersion = TEXTGEN_SWAGGER_UI_VERSION;

// Far above swagger-ui-bundle.js (1.7 MB); a bound, so a wrong file is an error, not memory.
constexpr uint64_t kMaxAssetBytes = uint64_t{16} << 20;

// The vendored files are referenced with ?v=<version>: a new version is a new URL, so the browser
// may keep them a week. The page itself is revalidated on every load.
constexpr const char* kAssetCache = "public, max-age=604800";
constexpr const char* kPageCache = "no-cache";

// Same-origin only: Swagger UI's validator badge and any other remote URL would be refused by the
// browser too, not only left out of the page. Inline styles are Swagger UI's own (React).
constexpr const char* kPagePolicy =
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'";

std::string pageHtml() {
  const std::string v = kSwaggerUiVersion;
  return R"(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>textgen-router API</title>
<link rel="stylesheet" href="/docs/swagger-ui.css?v=)" +
         v + R"(">
<link rel="icon" type="image/png" sizes="32x32" href="/docs/favicon-32x32.png?v=)" +
         v + R"(">
<link rel="icon" type="image/png" sizes="16x16" href="/docs/favicon-16x16.png?v=)" +
         v + R"(">
</head>
<body>
<div id="swagger-ui"></div>
<noscript>This page needs JavaScript. The API description is at
<a href="/api-doc/openapi.json">/api-doc/openapi.json</a>.</noscript>
<script src="/docs/swagger-ui-bundle.js?v=)" +
         v + R"("></script>
<script src="/docs/textgen-docs.js?v=)" +
         v + R"("></script>
</body>
</html>
)";
}

// Starts Swagger UI (a file, not an inline script: the page's policy allows only 'self').
// validatorUrl null: no call to the public validator.
constexpr const char* kStartScript = R"(window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/api-doc/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout"
  });
});
)";

const char* contentType(const std::string& name) {
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (name.ends_with(".css")) return "text/css; charset=utf-8";
  if (name.ends_with(".png")) return "image/png";
  return "application/octet-stream";
}

std::string unavailable(const std::string& file) {
  return std::string("The API page is unavailable: swagger-ui-dist ") + kSwaggerUiVersion + "'s " +
         file +
         " is not in the router's docs directory (run tools/fetch-swagger-ui.sh and rebuild "
         "textgen-router, or pass --docs-dir)";
}

fs::path executableDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return fs::current_path();
  buf[n] = '\0';
  return fs::path(buf).parent_path();
}

}  // namespace

const std::vector<std::string>& DocsPage::vendoredFiles() {
  static const std::vector<std::string> kFiles = {"swagger-ui-bundle.js", "swagger-ui.css",
                                                  "favicon-32x32.png", "favicon-16x16.png"};
  return kFiles;
}

std::shared_ptr<const DocsPage> DocsPage::fromFiles(std::map<std::string, std::string> files,
                                                    std::string dir) {
  std::shared_ptr<DocsPage> page(new DocsPage());
  page->dir_ = std::move(dir);
  const std::string html = pageHtml();
  page->assets_["/docs"] = {html, "text/html; charset=utf-8", kPageCache};
  page->assets_["/docs/"] = page->assets_["/docs"];
  page->assets_["/docs/textgen-docs.js"] = {kStartScript, contentType(".js"), kAssetCache};
  for (const std::string& name : vendoredFiles()) {
    Asset& a = page->assets_["/docs/" + name];
    a.contentType = contentType(name);
    a.cacheControl = kAssetCache;
    auto it = files.find(name);
    if (it != files.end()) {
      a.body = std::move(it->second);
    } else if (page->problem_.empty()) {
      page->problem_ = unavailable(name);
    }
  }
  return page;
}

std::shared_ptr<const DocsPage> DocsPage::load(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const std::string& name : vendoredFiles()) {
    auto body = readRegularFile((fs::path(dir) / name).string(), kMaxAssetBytes);
    if (body.ok()) {
      files[name] = std::move(*body);
    } else {
      spdlog::warn("/docs: {}", body.status().toString());
    }
  }
  if (auto v = readRegularFile((fs::path(dir) / "VERSION").string(), 64); v.ok()) {
    std::string got = *v;
    while (!got.empty() && (got.back() == '\n' || got.back() == '\r')) got.pop_back();
    if (got != kSwaggerUiVersion) {
      spdlog::warn("/docs: {} holds swagger-ui-dist {}; the page is written for {}", dir, got,
                   kSwaggerUiVersion);
    }
  }
  return fromFiles(std::move(files), dir);
}

std::shared_ptr<const DocsPage> DocsPage::find(const std::string& flagDir) {
  if (!flagDir.empty()) return load(flagDir);
  const fs::path exe = executableDir();
  const fs::path candidates[] = {exe / "swagger-ui",
                                 exe / ".." / "share" / "textgen" / "swagger-ui"};
  for (const fs::path& c : candidates) {
    std::error_code ec;
    if (fs::is_directory(c, ec)) return load(c.lexically_normal().string());
  }
  return load(candidates[0].string());
}

bool DocsPage::owns(std::string_view path) {
  return path == "/docs" || path.starts_with("/docs/");
}

void DocsPage::serve(const HttpRequest& request, HttpResponder& responder) const {
  // The allow-list: an exact match, so no request byte is ever part of a file name.
  const auto it = assets_.find(request.path);
  if (it == assets_.end()) {
    responder.reply(404, errorJson("Not Found: not a file of the API page", "not_found"), {});
    return;
  }
  const bool head = request.method == "HEAD";
  if (request.method != "GET" && !head) {
    responder.reply(
        405,
        errorJson("Method Not Allowed: the API page answers GET and HEAD", "method_not_allowed"),
        {{"Allow", "GET, HEAD"}});
    return;
  }
  if (!problem_.empty()) {
    responder.reply(503, errorJson(problem_, "docs_unavailable"), {});
    return;
  }
  const Asset& a = it->second;
  HttpHeaders h{{"Content-Type", a.contentType},
                {"Cache-Control", a.cacheControl},
                {"X-Content-Type-Options", "nosniff"}};
  if (std::string_view(a.contentType).starts_with("text/html")) {
    h["Content-Security-Policy"] = kPagePolicy;
    h["Referrer-Policy"] = "no-referrer";
  }
  // HEAD: the same status and headers (Content-Length included); the HTTP layer sends no body.
  responder.reply(200, a.body, h);
}

void serveDocs(const DocsPage* page, const HttpRequest& request, HttpResponder& responder) {
  // Without a page (a RouterApp built without one): as with an empty docs directory.
  static const std::shared_ptr<const DocsPage> kNone = DocsPage::fromFiles({}, "");
  (page ? page : kNone.get())->serve(request, responder);
}

}  // namespace textgen::router
