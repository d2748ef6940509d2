// /docs (DocsPage::serve) on fuzzed methods and paths: every request is answered once; 200 only for
// GET or HEAD of an allow-listed path, with that file's bytes (for HEAD the HTTP layer sends only
// their length); anything else is a 404, 405 or 503 with TGI's error JSON. Pages with every file
// and with none.
//
// Input: byte 0: the method (low 3 bits), bit 3 the page without files; the rest is the path.
#include <map>
#include <nlohmann/json.hpp>

#include "app/docs_page.h"
#include "fuzz_util.h"

namespace {

using namespace textgen::router;

const char* const kMethods[] = {"GET", "HEAD", "POST", "PUT", "OPTIONS", "", "get", "DELETE"};

class RecordingResponder final : public HttpResponder {
 public:
  void reply(int code, const std::string& text, const HttpHeaders& h) override {
    ++answers;
    status = code;
    body = text;
    headers = h;
  }
  std::shared_ptr<HttpStream> startStream(int, const HttpHeaders&) override {
    FUZZ_CHECK(false, "DocsPage started a stream");
    return nullptr;
  }
  void onDisconnect(std::function<void()>) override {}
  int answers = 0;
  int status = 0;
  std::string body;
  HttpHeaders headers;
};

// The vendored files' stand-ins: name -> bytes.
const std::map<std::string, std::string>& files() {
  static const std::map<std::string, std::string> kFiles = [] {
    std::map<std::string, std::string> f;
    for (const std::string& name : DocsPage::vendoredFiles()) f[name] = "bytes of " + name;
    return f;
  }();
  return kFiles;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto full = DocsPage::fromFiles(files(), "fuzz");
  static const auto empty = DocsPage::fromFiles({}, "fuzz");
  textgen::fuzz::Input in(data, size);
  const uint8_t pick = in.byte();
  HttpRequest request;
  request.method = kMethods[pick & 7];
  request.path = std::string(in.rest());
  const bool complete = !(pick & 8);
  FUZZ_CHECK(DocsPage::owns(request.path) ==
                 (request.path == "/docs" || request.path.rfind("/docs/", 0) == 0),
             "owns(" + request.path + ")");

  RecordingResponder r;
  (complete ? full : empty)->serve(request, r);
  const std::string what = request.method + " " + request.path;
  FUZZ_CHECK(r.answers == 1, std::to_string(r.answers) + " answers to " + what);

  std::string file;  // the vendored file the path names, if any
  for (const auto& [name, bytes] : files()) {
    if (request.path == "/docs/" + name) file = name;
  }
  const bool listed = !file.empty() || request.path == "/docs" || request.path == "/docs/" ||
                      request.path == "/docs/textgen-docs.js";
  const bool readMethod = request.method == "GET" || request.method == "HEAD";
  if (!listed) {
    FUZZ_CHECK(r.status == 404, "status " + std::to_string(r.status) + " for " + what);
  } else if (!readMethod) {
    FUZZ_CHECK(r.status == 405 && r.headers["Allow"] == "GET, HEAD", what);
  } else {
    FUZZ_CHECK(r.status == (complete ? 200 : 503),
               "status " + std::to_string(r.status) + " for " + what);
  }
  if (r.status == 200) {
    FUZZ_CHECK(!r.headers["Content-Type"].empty() && !r.headers["Cache-Control"].empty(), what);
    // HEAD hands over the GET's body too: the HTTP layer sends its length and not the bytes.
    if (!file.empty()) {
      FUZZ_CHECK(r.body == files().at(file), "not the file's bytes for " + what);
    }
    return 0;
  }
  const auto j = nlohmann::json::parse(r.body, nullptr, false);
  FUZZ_CHECK(j.is_object() && j.contains("error") && j["error"].is_string() &&
                 j.contains("error_type") && j["error_type"].is_string(),
             "not TGI's error JSON for " + what + ": " + r.body);
  return 0;
}
