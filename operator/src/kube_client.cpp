#include "textgen/operator/kube_client.h"

#include <cpprest/containerstream.h>
#include <cpprest/http_client.h>
#include <cpprest/rawptrstream.h>
#include <yaml-cpp/yaml.h>

#include <boost/asio/ssl.hpp>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

namespace textgen::op {
namespace {

using namespace web::http;
using namespace web::http::client;

std::optional<std::string> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string base64Decode(const std::string& in) {
  static const std::string chars =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (char c : in) {
    const size_t pos = chars.find(c);
    if (pos == std::string::npos) continue;  // '=', whitespace
    val = (val << 6) + static_cast<int>(pos);
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

// "<key>-data" (base64) or "<key>" (a file, relative to the kubeconfig's folder).
StatusOr<std::string> pemField(const YAML::Node& node, const std::string& key,
                               const std::filesystem::path& dir) {
  if (node[key + "-data"]) return base64Decode(node[key + "-data"].as<std::string>());
  if (!node[key]) return std::string();
  std::filesystem::path p = node[key].as<std::string>();
  if (p.is_relative()) p = dir / p;
  auto data = readFile(p.string());
  if (!data) return invalidArgumentError("kubeconfig: cannot read " + key + " " + p.string());
  return *data;
}

YAML::Node named(const YAML::Node& list, const std::string& name, const char* field) {
  if (!list || !list.IsSequence()) return {};
  for (const YAML::Node& item : list)
    if (item["name"] && item["name"].as<std::string>() == name) return item[field];
  return {};
}

class CppRestClient final : public KubeClient {
 public:
  explicit CppRestClient(KubeConfig config) : config_(std::move(config)) {}

  StatusOr<KubeResponse> request(const std::string& method, const std::string& path,
                                 const std::optional<json>& body,
                                 const std::string& contentType) override {
    try {
      http_client client(config_.server, clientConfig(std::chrono::seconds(30)));
      http_request req(method);
      req.set_request_uri(path);
      addAuth(req);
      if (body) req.set_body(body->dump(), contentType);
      http_response resp = client.request(req).get();
      KubeResponse out;
      out.status = resp.status_code();
      const std::string text = resp.extract_utf8string(true).get();
      out.body = json::parse(text, nullptr, false);
      if (out.body.is_discarded()) out.body = nullptr;
      return out;
    } catch (const std::exception& e) {
      return unavailableError("kubernetes " + method + " " + path + ": " + e.what());
    }
  }

  Status watch(const std::string& path, const std::function<bool(const json&)>& onEvent,
               const std::atomic<bool>& stop) override {
    try {
      // The server ends a watch after its timeoutSeconds (at most 30 minutes here); the client
      // waits longer than that.
      http_client client(config_.server, clientConfig(std::chrono::seconds(1860)));
      http_request req(methods::GET);
      req.set_request_uri(path);
      addAuth(req);
      http_response resp = client.request(req).get();
      if (resp.status_code() != status_codes::OK) {
        KubeResponse r;
        r.status = resp.status_code();
        r.body = json::parse(resp.extract_utf8string(true).get(), nullptr, false);
        return responseStatus(r, "watch " + path);
      }
      auto stream = resp.body();
      while (!stop.load()) {
        concurrency::streams::container_buffer<std::string> line;
        const size_t n = stream.read_line(line).get();
        if (n == 0 && stream.is_eof()) break;
        if (line.collection().empty()) continue;
        json event = json::parse(line.collection(), nullptr, false);
        if (event.is_discarded()) return internalError("watch " + path + ": a line is not JSON");
        if (!onEvent(event)) break;
      }
      return okStatus();
    } catch (const std::exception& e) {
      return unavailableError("kubernetes watch " + path + ": " + e.what());
    }
  }

 private:
  http_client_config clientConfig(std::chrono::seconds timeout) const {
    http_client_config c;
    c.set_timeout(timeout);
    const KubeConfig cfg = config_;
    c.set_ssl_context_callback([cfg](boost::asio::ssl::context& ctx) {
      if (!cfg.caPem.empty()) ctx.add_certificate_authority(boost::asio::buffer(cfg.caPem));
      if (!cfg.clientCertPem.empty()) {
        ctx.use_certificate_chain(boost::asio::buffer(cfg.clientCertPem));
        ctx.use_private_key(boost::asio::buffer(cfg.clientKeyPem), boost::asio::ssl::context::pem);
      }
    });
    return c;
  }

  void addAuth(http_request& req) {
    const std::string token = currentToken();
    if (!token.empty()) req.headers().add("Authorization", "Bearer " + token);
    req.headers().add("Accept", "application/json");
  }

  // The service account's token is rotated by the kubelet: read it again once a minute.
  std::string currentToken() {
    if (config_.tokenFile.empty()) return config_.token;
    std::lock_guard<std::mutex> lock(tokenMu_);
    const auto now = std::chrono::steady_clock::now();
    if (tokenReadAt_ == std::chrono::steady_clock::time_point{} ||
        now - tokenReadAt_ > std::chrono::minutes(1)) {
      if (auto t = readFile(config_.tokenFile)) config_.token = *t;
      tokenReadAt_ = now;
    }
    return config_.token;
  }

  KubeConfig config_;
  std::mutex tokenMu_;
  std::chrono::steady_clock::time_point tokenReadAt_{};
};

}  // namespace

std::string KubeResponse::message() const {
  if (body.is_object() && body.contains("message") && body["message"].is_string())
    return body["message"].get<std::string>();
  return "HTTP " + std::to_string(status);
}

Status responseStatus(const KubeResponse& r, const std::string& what) {
  if (r.ok()) return okStatus();
  const std::string m = what + ": " + r.message();
  switch (r.status) {
    case 404: return notFoundError(m);
    case 409: return abortedError(m);
    case 410: return failedPreconditionError(m);
    case 400:
    case 422: return invalidArgumentError(m);
    case 401:
    case 403: return permissionDeniedError(m);
    default: return r.status >= 500 || r.status == 429 ? unavailableError(m) : internalError(m);
  }
}

StatusOr<KubeResponse> KubeClient::apply(const std::string& path, const json& object,
                                         const std::string& fieldManager, bool force) {
  return request("PATCH", path + "?fieldManager=" + fieldManager + (force ? "&force=true" : ""),
                 object, "application/apply-patch+yaml");
}

StatusOr<std::unique_ptr<KubeClient>> KubeClient::create(const KubeConfig& config) {
  if (config.server.rfind("https://", 0) != 0 && config.server.rfind("http://", 0) != 0)
    return invalidArgumentError("kubernetes server '" + config.server + "' is not an http(s) URL");
  return std::unique_ptr<KubeClient>(std::make_unique<CppRestClient>(config));
}

StatusOr<KubeConfig> loadKubeconfig(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    return invalidArgumentError("kubeconfig " + path + ": " + e.what());
  }
  try {
    const std::string current =
        root["current-context"] ? root["current-context"].as<std::string>() : std::string();
    YAML::Node context = named(root["contexts"], current, "context");
    if (!context || !context.IsMap())
      return invalidArgumentError("kubeconfig " + path + ": no current context");
    if (!context["cluster"])
      return invalidArgumentError("kubeconfig " + path + ": the current context names no cluster");
    YAML::Node cluster = named(root["clusters"], context["cluster"].as<std::string>(), "cluster");
    YAML::Node user = context["user"]
                          ? named(root["users"], context["user"].as<std::string>(), "user")
                          : YAML::Node();
    if (!cluster || !cluster.IsMap() || !cluster["server"])
      return invalidArgumentError("kubeconfig " + path + ": the context's cluster has no server");
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    KubeConfig c;
    c.server = cluster["server"].as<std::string>();
    TG_ASSIGN_OR_RETURN(c.caPem, pemField(cluster, "certificate-authority", dir));
    if (user && user.IsMap()) {
      TG_ASSIGN_OR_RETURN(c.clientCertPem, pemField(user, "client-certificate", dir));
      TG_ASSIGN_OR_RETURN(c.clientKeyPem, pemField(user, "client-key", dir));
      if (user["token"]) c.token = user["token"].as<std::string>();
    }
    if (context["namespace"]) c.namespace_ = context["namespace"].as<std::string>();
    return c;
  } catch (const std::exception& e) {
    return invalidArgumentError("kubeconfig " + path + ": " + e.what());
  }
}

namespace {

json yamlToJson(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = yamlToJson(kv.second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& item : n) a.push_back(yamlToJson(item));
      return a;
    }
    case YAML::NodeType::Scalar: {
      const std::string v = n.Scalar();
      if (n.Tag() == "!") return v;  // quoted
      if (v == "true" || v == "false") return v == "true";
      if (v == "null" || v == "~") return nullptr;
      json number = json::parse(v, nullptr, false);
      if (!number.is_discarded() && number.is_number()) return number;
      return v;
    }
    default: return nullptr;
  }
}

}  // namespace

std::string urlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

StatusOr<json> parseYamlDocument(const std::string& text) {
  try {
    return yamlToJson(YAML::Load(text));
  } catch (const std::exception& e) {
    return invalidArgumentError(std::string("YAML: ") + e.what());
  }
}

StatusOr<KubeConfig> inClusterConfig() {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !port)
    return failedPreconditionError("not in a cluster: KUBERNETES_SERVICE_HOST/PORT are unset");
  const std::string dir = "/var/run/secrets/kubernetes.io/serviceaccount/";
  KubeConfig c;
  const std::string h = host;
  c.server = "https://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + port;
  auto token = readFile(dir + "token");
  auto ca = readFile(dir + "ca.crt");
  if (!token || !ca) return failedPreconditionError("cannot read the service account in " + dir);
  c.token = *token;
  c.tokenFile = dir + "token";
  c.caPem = *ca;
  if (auto ns = readFile(dir + "namespace")) c.namespace_ = *ns;
  return c;
}

}  // namespace textgen::op
