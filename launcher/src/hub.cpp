#include "textgen/launcher/hub.h"

#include <cpprest/http_client.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "textgen/base/file.h"
#include "textgen/base/json.h"

namespace textgen::launcher {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace web::http;
using namespace web::http::client;

std::string envOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// Files a textgen shard and router need: top-level JSON and safetensors, plain names only.
bool wanted(const std::string& f) {
  if (f.find('/') != std::string::npos || f.find('\\') != std::string::npos || f.front() == '.')
    return false;
  for (unsigned char c : f) {
    if (c < 0x20 || c == 0x7f) return false;
  }
  return f.ends_with(".json") || f.ends_with(".safetensors");
}

// A revision becomes a path under refs/ (refs/pr/1 nests, as in huggingface_hub), so it must be a
// git ref name (the rules of git check-ref-format) or a commit id: no '..', no component that
// starts with '.' or ends with ".lock", no empty component, no leading or trailing '/', no control
// characters, space, '~', '^', ':', '?', '*', '[', '\\' or "@{", at most 255 bytes.
Status checkRevision(const std::string& rev) {
  auto bad = [&](const std::string& why) {
    std::string shown;
    for (unsigned char c : rev.substr(0, 80)) {
      shown += c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c);
    }
    return invalidArgumentError("revision '" + shown + "' is not a valid git ref name: " + why);
  };
  if (rev.empty() || rev.size() > 255) return bad("must be 1 to 255 bytes");
  for (unsigned char c : rev) {
    if (c < 0x20 || c == 0x7f ||
        std::string_view(" ~^:?*[\\").find(static_cast<char>(c)) != std::string_view::npos)
      return bad("control characters, space and ~^:?*[\\ are not allowed");
  }
  if (rev.find("..") != std::string::npos) return bad("'..' is not allowed");
  if (rev.find("@{") != std::string::npos || rev == "@") return bad("'@{' is not allowed");
  if (rev.front() == '/' || rev.back() == '/' || rev.back() == '.')
    return bad("must not start with '/' or end with '/' or '.'");
  size_t start = 0;
  while (start <= rev.size()) {
    const size_t end = std::min(rev.find('/', start), rev.size());
    const std::string_view part(rev.data() + start, end - start);
    if (part.empty() || part.front() == '.' || part.ends_with(".lock"))
      return bad("each '/' component must be non-empty, not start with '.', not end with '.lock'");
    start = end + 1;
  }
  return okStatus();
}

// The commit the hub names becomes snapshots/<commit>: exactly 40 lowercase hex digits.
bool isCommitId(const std::string& s) {
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

struct HttpResult {
  int status = 0;
  std::string body;
};

// GET with redirects followed by hand (keeping the token only on the hub's own host). When `file`
// is given the body is appended to it from byte `offset` (Range), else returned.
StatusOr<HttpResult> get(std::string url, const HubOptions& o, const fs::path* file = nullptr,
                         uint64_t offset = 0, std::function<void(uint64_t)> progress = {}) {
  for (int hop = 0; hop < 8; ++hop) {
    const web::uri uri(url);
    http_client_config config;
    config.set_timeout(std::chrono::seconds(60));
    config.set_max_redirects(0);  // by hand, so the token never follows to another host
    http_client client(web::uri_builder(uri).set_path("").set_query("").set_fragment("").to_uri(),
                       config);
    http_request req(methods::GET);
    req.set_request_uri(web::uri_builder().set_path(uri.path()).set_query(uri.query()).to_string());
    if (!o.token.empty() && url.rfind(o.endpoint + "/", 0) == 0)
      req.headers().add("Authorization", "Bearer " + o.token);
    if (file && offset > 0) req.headers().add("Range", "bytes=" + std::to_string(offset) + "-");
    try {
      http_response r = client.request(req).get();
      const int status = r.status_code();
      if (status == 301 || status == 302 || status == 303 || status == 307 || status == 308) {
        const std::string loc = r.headers().has("Location") ? r.headers()["Location"] : "";
        if (loc.empty()) return unavailableError(url + ": redirect without a Location");
        url = loc.rfind("http", 0) == 0
                  ? loc
                  : web::uri_builder(uri).set_path("").set_query("").to_string() + loc;
        continue;
      }
      HttpResult result{status, {}};
      if (!file || (status != 200 && status != 206)) {
        result.body = r.extract_utf8string(true).get();
        return result;
      }
      // A 200 to a Range request restarts the file.
      std::ofstream out(*file,
                        std::ios::binary | (status == 206 ? std::ios::app : std::ios::trunc));
      auto body = r.body();
      concurrency::streams::container_buffer<std::vector<uint8_t>> chunk;
      uint64_t written = status == 206 ? offset : 0;
      while (true) {
        const size_t n = body.read(chunk, 1 << 20).get();
        if (n == 0) break;
        out.write(reinterpret_cast<const char*>(chunk.collection().data()),
                  static_cast<std::streamsize>(n));
        written += n;
        chunk.collection().clear();
        chunk.seekpos(0, std::ios::out);
        if (progress) progress(written);
      }
      return result;
    } catch (const std::exception& e) {
      return unavailableError(url + ": " + e.what());
    }
  }
  return unavailableError(url + ": too many redirects");
}

StatusOr<std::string> sha256(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return notFoundError("cannot read " + p.string());
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char digest[32];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

Status httpError(int status, const std::string& what, const std::string& modelId) {
  if (status == 401 || status == 403) {
    return unauthenticatedError(what + ": HTTP " + std::to_string(status) +
                                " — HF_TOKEN is missing or not allowed to read " + modelId);
  }
  if (status == 404) return notFoundError(what + ": HTTP 404 — not found");
  return unavailableError(what + ": HTTP " + std::to_string(status));
}

}  // namespace

HubOptions hubOptionsFromEnv() {
  HubOptions o;
  o.endpoint = envOr("HF_ENDPOINT", "https://huggingface.co");
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  o.token = envOr("HF_TOKEN", envOr("HUGGING_FACE_HUB_TOKEN", ""));
  const std::string home = envOr("HF_HOME", envOr("HOME", "/root") + "/.cache/huggingface");
  o.cacheDir = envOr("HUGGINGFACE_HUB_CACHE", envOr("HF_HUB_CACHE", home + "/hub"));
  o.progressBar = isatty(STDERR_FILENO);
  return o;
}

namespace {

StatusOr<std::string> resolveModelOrThrow(const std::string& modelId, const std::string& revision,
                                          const HubOptions& o) {
  if (fs::is_directory(modelId)) return modelId;
  const size_t slash = modelId.find('/');
  if (modelId.empty() || modelId.find("..") != std::string::npos || modelId.front() == '/' ||
      std::count(modelId.begin(), modelId.end(), '/') > 1) {
    return invalidArgumentError("'" + modelId +
                                "' is neither a local directory nor a hub id (org/name)");
  }
  std::string repoDir = "models--" + modelId;  // the hub cache's name: models--org--name
  if (slash != std::string::npos) repoDir.replace(std::string("models--").size() + slash, 1, "--");
  const fs::path repo = fs::path(o.cacheDir) / repoDir;
  const std::string rev = revision.empty() ? "main" : revision;
  TG_RETURN_IF_ERROR(checkRevision(rev));
  // A snapshot completed earlier needs no network.
  if (auto ref = readRegularFile((repo / "refs" / rev).string(), 4096); ref.ok()) {
    const std::string commit = ref->substr(0, ref->find_first_of("\r\n"));
    if (isCommitId(commit) && fs::exists(repo / "snapshots" / commit / ".textgen-complete")) {
      return (repo / "snapshots" / commit).string();
    }
  }
  TG_ASSIGN_OR_RETURN(HttpResult api, get(o.endpoint + "/api/models/" + modelId + "/revision/" +
                                              web::uri::encode_data_string(rev) + "?blobs=true",
                                          o));
  if (api.status != 200)
    return httpError(api.status, "model " + modelId + " (revision " + rev + ") on " + o.endpoint,
                     modelId);
  auto parsed = parseJson(api.body, o.endpoint + "'s answer for model " + modelId);
  if (!parsed.ok()) return unavailableError(parsed.status().message());
  const json& info = *parsed;
  auto sha = info.is_object() ? info.find("sha") : info.end();
  auto siblings = info.is_object() ? info.find("siblings") : info.end();
  if (sha == info.end() || siblings == info.end() || !siblings->is_array()) {
    return unavailableError(o.endpoint + ": unexpected answer for model " + modelId);
  }
  if (!sha->is_string() || !isCommitId(sha->get<std::string>())) {
    return unavailableError(o.endpoint + ": model " + modelId + " revision " + rev +
                            ": the commit id " + sha->dump().substr(0, 80) +
                            " is not 40 hex digits");
  }
  const std::string commit = sha->get<std::string>();
  const fs::path snapshot = repo / "snapshots" / commit;
  fs::create_directories(snapshot);
  fs::create_directories(
      (repo / "refs" / rev).parent_path());  // refs/pr/1 nests, as in huggingface_hub
  for (const json& s : *siblings) {
    auto rfilename = s.is_object() ? s.find("rfilename") : s.end();
    if (rfilename == s.end() || !rfilename->is_string()) {
      return unavailableError(o.endpoint + ": model " + modelId +
                              ": a sibling without a string 'rfilename'");
    }
    const std::string name = rfilename->get<std::string>();
    if (name.empty() || !wanted(name)) continue;
    const fs::path target = snapshot / name;
    auto fileError = [&](const std::string& what) {
      return unavailableError(o.endpoint + ": model " + modelId + " file " + name + ": " + what);
    };
    std::optional<uint64_t> size;
    std::string expectSha;
    auto lfs = s.find("lfs");
    const json& sizeSource = lfs != s.end() && lfs->is_object() ? *lfs : s;
    if (auto sz = sizeSource.find("size"); sz != sizeSource.end() && !sz->is_null()) {
      if (!sz->is_number_unsigned()) return fileError("'size' is not a byte count");
      size = sz->get<uint64_t>();
    }
    if (lfs != s.end() && lfs->is_object()) {
      if (auto h = lfs->find("sha256"); h != lfs->end() && !h->is_null()) {
        if (!h->is_string()) return fileError("'lfs.sha256' is not a string");
        expectSha = h->get<std::string>();
      }
    }
    if (fs::exists(target) && (!size || fs::file_size(target) == *size)) continue;
    const fs::path partial = target.string() + ".incomplete";
    std::fprintf(stderr, "downloading %s/%s\n", modelId.c_str(), name.c_str());
    int lastReport = -1;
    auto progress = [&](uint64_t done) {
      if (!size || *size == 0) return;
      const int pct = static_cast<int>(100 * done / *size);
      if (o.progressBar) {
        std::fprintf(stderr, "\r  [%-40s] %3d%%", std::string(pct * 40 / 100, '#').c_str(), pct);
      } else if (pct / 10 != lastReport / 10) {
        std::fprintf(stderr, "  %s: %d%% (%llu of %llu bytes)\n", name.c_str(), pct,
                     static_cast<unsigned long long>(done), static_cast<unsigned long long>(*size));
      }
      lastReport = pct;
    };
    Status last;
    for (int attempt = 0; attempt < 5; ++attempt) {  // resume after an interrupted transfer
      const uint64_t have = fs::exists(partial) ? fs::file_size(partial) : 0;
      auto r = get(o.endpoint + "/" + modelId + "/resolve/" + commit + "/" + name, o, &partial,
                   have, progress);
      if (r.ok() && (r->status == 200 || r->status == 206)) {
        if (!size || fs::file_size(partial) == *size) {
          last = okStatus();
          break;
        }
        last =
            dataLossError(name + ": transfer ended at " + std::to_string(fs::file_size(partial)) +
                          " of " + std::to_string(*size) + " bytes");
        std::fprintf(stderr, "%s  %s: interrupted, resuming\n", o.progressBar ? "\n" : "",
                     name.c_str());
        continue;
      }
      last = r.ok() ? httpError(r->status, "file " + name + " of " + modelId, modelId) : r.status();
      if (r.ok()) break;  // an HTTP error answer is final
      std::fprintf(stderr, "%s  %s: %s; resuming\n", o.progressBar ? "\n" : "", name.c_str(),
                   r.status().message().c_str());
    }
    if (o.progressBar) std::fprintf(stderr, "\n");
    TG_RETURN_IF_ERROR(last);
    if (!expectSha.empty()) {
      TG_ASSIGN_OR_RETURN(std::string got, sha256(partial));
      if (got != expectSha) {
        fs::remove(partial);
        return dataLossError(name + ": sha256 " + got + " does not match the hub's " + expectSha);
      }
    }
    fs::rename(partial, target);
  }
  std::ofstream(repo / "refs" / rev) << commit;
  std::ofstream(snapshot / ".textgen-complete") << commit << "\n";
  return snapshot.string();
}

}  // namespace

StatusOr<std::string> resolveModel(const std::string& modelId, const std::string& revision,
                                   const HubOptions& o) {
  // The cache's file operations throw on a read-only, full or vanished cache: an error naming the
  // path, never an abort.
  try {
    return resolveModelOrThrow(modelId, revision, o);
  } catch (const fs::filesystem_error& e) {
    return Status(e.code() == std::errc::permission_denied ? StatusCode::kPermissionDenied
                                                           : StatusCode::kInternal,
                  std::string("hub cache: ") + e.what());
  }
}

}  // namespace textgen::launcher
