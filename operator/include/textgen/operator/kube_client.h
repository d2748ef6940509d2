// A small Kubernetes API client over HTTPS (cpprestsdk): requests with JSON bodies, server-side
// apply, and watch streams read one event per line. Credentials come from a kubeconfig (yaml-cpp)
// or the pod's service account.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "textgen/base/status_or.h"

namespace textgen::op {

using nlohmann::json;

struct KubeConfig {
  std::string server;  // https://host:port
  std::string caPem;   // empty: the system's trust store
  std::string clientCertPem, clientKeyPem;
  std::string token;                   // bearer token (service account)
  std::string tokenFile;               // re-read every minute (projected tokens rotate)
  std::string namespace_ = "default";  // the context's namespace
};

// The current context of a kubeconfig file (certificate data inline or as files, or a token).
StatusOr<KubeConfig> loadKubeconfig(const std::string& path);
// The pod's service account (KUBERNETES_SERVICE_HOST/PORT and /var/run/secrets/...).
StatusOr<KubeConfig> inClusterConfig();

struct KubeResponse {
  int status = 0;
  json body;  // null when the body is not JSON
  bool ok() const { return status >= 200 && status < 300; }
  // The API's Status message, or the HTTP code.
  std::string message() const;
};

class KubeClient {
 public:
  virtual ~KubeClient() = default;
  static StatusOr<std::unique_ptr<KubeClient>> create(const KubeConfig& config);

  // UNAVAILABLE when the server cannot be reached; any HTTP answer is a response.
  virtual StatusOr<KubeResponse> request(const std::string& method, const std::string& path,
                                         const std::optional<json>& body = std::nullopt,
                                         const std::string& contentType = "application/json") = 0;

  // Server-side apply of `object` at `path` (the object's own URL) by `fieldManager`.
  StatusOr<KubeResponse> apply(const std::string& path, const json& object,
                               const std::string& fieldManager, bool force = true);

  // Streams the watch at `path` (a collection URL with ?watch=1&...), calling onEvent for each
  // event until the server ends the stream, onEvent returns false, or `stop` is set.
  virtual Status watch(const std::string& path, const std::function<bool(const json&)>& onEvent,
                       const std::atomic<bool>& stop) = 0;
};

// Maps a non-OK response to a Status with the API's message (409 ABORTED, 404 NOT_FOUND, 410
// FAILED_PRECONDITION, 422 INVALID_ARGUMENT, 401/403 PERMISSION_DENIED, else UNAVAILABLE/INTERNAL).
Status responseStatus(const KubeResponse& r, const std::string& what);

}  // namespace textgen::op

namespace textgen::op {

// Percent-encodes a query parameter value (label selectors, resourceVersions).
std::string urlEncode(const std::string& s);

// A YAML (or JSON) document as JSON: plain scalars become numbers, booleans and null where YAML 1.2
// reads them so, quoted scalars stay strings.
StatusOr<json> parseYamlDocument(const std::string& text);

}  // namespace textgen::op
