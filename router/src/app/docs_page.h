// DocsPage: GET /docs, TGI's API page. Swagger UI (npm's swagger-ui-dist, pinned and vendored at
// build time by tools/fetch-swagger-ui.sh; no CDN, it works offline) over /api-doc/openapi.json.
// The HTML page and the script that starts Swagger UI are ours; the vendored files are read once,
// at start-up, from the docs directory (--docs-dir; by default <dir of textgen-router>/swagger-ui,
// else <that dir>/../share/textgen/swagger-ui) and served from memory.
//
// Only an allow-list of exact paths is served (/docs, /docs/ and /docs/<known file>): nothing from
// the request reaches the file system, so traversal (`..`, `%2e%2e`, absolute paths, NUL bytes) is
// a 404 like any other unknown name. GET and HEAD only (405 otherwise). When a vendored file is
// missing, every /docs path answers 503 naming it, and the rest of the router serves as usual.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "textgen/router/http_server.h"

namespace textgen::router {

class DocsPage {
 public:
  // The swagger-ui-dist files the page loads, as named in the package and under /docs/.
  static const std::vector<std::string>& vendoredFiles();

  // The vendored files read from `dir`. Never fails: what is missing or unreadable makes a page
  // whose problem() names it, and that answers 503.
  static std::shared_ptr<const DocsPage> load(const std::string& dir);
  // load() of --docs-dir, or (empty) of the first default directory that exists.
  static std::shared_ptr<const DocsPage> find(const std::string& flagDir);
  // From file contents in memory (tests, fuzzing): name -> bytes; missing names make a problem.
  static std::shared_ptr<const DocsPage> fromFiles(std::map<std::string, std::string> files,
                                                   std::string dir);

  // True for every path DocsPage answers: /docs and everything under /docs/.
  static bool owns(std::string_view path);

  // Answers one request to a path that owns() accepts. Thread-safe.
  void serve(const HttpRequest& request, HttpResponder& responder) const;

  // Empty when every vendored file is there; otherwise what is wrong (the 503's message).
  const std::string& problem() const { return problem_; }
  const std::string& dir() const { return dir_; }

 private:
  struct Asset {
    std::string body;
    const char* contentType = "";
    const char* cacheControl = "";
  };
  DocsPage() = default;
  std::map<std::string, Asset, std::less<>> assets_;  // by request path
  std::string problem_;
  std::string dir_;
};

// DocsPage::serve, or 503 when there is no page (a RouterApp built without one).
void serveDocs(const DocsPage* page, const HttpRequest& request, HttpResponder& responder);

}  // namespace textgen::router
