// GET /api-doc/openapi.json: an OpenAPI 3 description of exactly the routes RouterApp serves
// (tests/integration/router_test.py calls every path it lists).
#include <nlohmann/json.hpp>

#include "textgen/base/version.h"
#include "textgen/router/router_app.h"

namespace textgen::router {
namespace {

using nlohmann::json;

json ref(const std::string& name) {
  return {{"$ref", "#/components/schemas/" + name}};
}

json errors() {
  json e = json::object();
  for (const auto& [code, what] :
       std::map<std::string, std::string>{{"401", "Missing or wrong API key"},
                                          {"413", "Payload too large"},
                                          {"422", "Input validation error"},
                                          {"424", "Generation error"},
                                          {"429", "Model is overloaded"}}) {
    e[code] = {{"description", what},
               {"content", {{"application/json", {{"schema", ref("ErrorResponse")}}}}}};
  }
  return e;
}

json post(const std::string& summary, const std::string& schema, json ok) {
  json responses = errors();
  responses["200"] = std::move(ok);
  return {{"summary", summary},
          {"requestBody",
           {{"required", true}, {"content", {{"application/json", {{"schema", ref(schema)}}}}}}},
          {"responses", responses}};
}

json okJson(const std::string& description, const json& schema) {
  return {{"description", description}, {"content", {{"application/json", {{"schema", schema}}}}}};
}

json okStream(const std::string& description) {
  return {{"description", description},
          {"content", {{"text/event-stream", {{"schema", {{"type", "string"}}}}}}}};
}

json get(const std::string& summary, json ok) {
  return {{"summary", summary}, {"responses", {{"200", std::move(ok)}}}};
}

json schemas() {
  json num = {{"type", "number"}, {"nullable", true}};
  json intg = {{"type", "integer"}, {"nullable", true}, {"minimum", 0}};
  json params = {{"type", "object"},
                 {"properties",
                  {{"best_of", intg},
                   {"temperature", num},
                   {"repetition_penalty", num},
                   {"frequency_penalty", num},
                   {"top_k", intg},
                   {"top_p", num},
                   {"typical_p", num},
                   {"do_sample", {{"type", "boolean"}, {"default", false}}},
                   {"max_new_tokens", {{"type", "integer"}, {"nullable", true}, {"default", 100}}},
                   {"return_full_text", {{"type", "boolean"}, {"nullable", true}}},
                   {"stop", {{"type", "array"}, {"items", {{"type", "string"}}}}},
                   {"truncate", intg},
                   {"watermark",
                    {{"type", "boolean"},
                     {"default", false},
                     {"description", "Not supported: true is a 422"}}},
                   {"details", {{"type", "boolean"}, {"default", false}}},
                   {"decoder_input_details", {{"type", "boolean"}, {"default", false}}},
                   {"seed", intg},
                   {"top_n_tokens", intg}}}};
  json token = {{"type", "object"},
                {"properties",
                 {{"id", {{"type", "integer"}}},
                  {"text", {{"type", "string"}}},
                  {"logprob", num},
                  {"special", {{"type", "boolean"}}}}}};
  return {
      {"GenerateParameters", params},
      {"GenerateRequest",
       {{"type", "object"},
        {"required", {"inputs"}},
        {"properties",
         {{"inputs", {{"type", "string"}}}, {"parameters", ref("GenerateParameters")}}}}},
      {"CompatGenerateRequest",
       {{"type", "object"},
        {"required", {"inputs"}},
        {"properties",
         {{"inputs", {{"type", "string"}}},
          {"parameters", ref("GenerateParameters")},
          {"stream", {{"type", "boolean"}}}}}}},
      {"Token", token},
      {"GenerateResponse",
       {{"type", "object"},
        {"properties",
         {{"generated_text", {{"type", "string"}}},
          {"details", {{"type", "object"}, {"nullable", true}}}}}}},
      {"CompletionRequest",
       {{"type", "object"},
        {"required", {"prompt"}},
        {"properties",
         {{"model", {{"type", "string"}}},
          {"prompt",
           {{"oneOf",
             {{{"type", "string"}}, {{"type", "array"}, {"items", {{"type", "string"}}}}}}}},
          {"max_tokens", intg},
          {"temperature", num},
          {"top_p", num},
          {"seed", intg},
          {"stream", {{"type", "boolean"}}},
          {"stop", {{"type", "array"}, {"items", {{"type", "string"}}}}},
          {"frequency_penalty", num},
          {"repetition_penalty", num}}}}},
      {"ErrorResponse",
       {{"type", "object"},
        {"properties", {{"error", {{"type", "string"}}}, {"error_type", {{"type", "string"}}}}}}},
  };
}

}  // namespace

std::string openApiDocument() {
  json paths = {
      {"/generate",
       {{"post", post("Generate tokens", "GenerateRequest",
                      okJson("Generated text", ref("GenerateResponse")))}}},
      {"/generate_stream",
       {{"post", post("Generate a stream of token events (Server-Sent Events)", "GenerateRequest",
                      okStream("Token events"))}}},
      {"/",
       {{"post",
         post("Generate tokens; with \"stream\": true, Server-Sent Events", "CompatGenerateRequest",
              okJson("A list of one generated text",
                     {{"type", "array"}, {"items", ref("GenerateResponse")}}))}}},
      {"/v1/completions",
       {{"post", post("OpenAI-compatible completions", "CompletionRequest",
                      okJson("Completions", {{"type", "object"}}))}}},
      {"/tokenize",
       {{"post", post("Tokenize the inputs", "GenerateRequest",
                      okJson("Tokens with byte offsets",
                             {{"type", "array"}, {"items", {{"type", "object"}}}}))}}},
      {"/info",
       {{"get", get("Model and router information", okJson("Info", {{"type", "object"}}))}}},
      {"/health",
       {{"get", get("Health of the shards (503 when unhealthy)", {{"description", "Healthy"}})}}},
      {"/metrics",
       {{"get", get("Prometheus metrics",
                    {{"description", "Prometheus text format"},
                     {"content", {{"text/plain", {{"schema", {{"type", "string"}}}}}}}})}}},
      {"/v1/models",
       {{"get", get("OpenAI-compatible model list", okJson("Models", {{"type", "object"}}))}}},
      {"/api-doc/openapi.json",
       {{"get", get("This document", okJson("OpenAPI document", {{"type", "object"}}))}}},
  };
  return json{{"openapi", "3.0.3"},
              {"info",
               {{"title", "textgen-router"},
                {"description", "Text Generation Inference compatible API"},
                {"version", kVersion}}},
              {"paths", paths},
              {"components", {{"schemas", schemas()}}}}
      .dump();
}

}  // namespace textgen::router
