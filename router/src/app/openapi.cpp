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
  json params = {
      {"type", "object"},
      {"properties",
       {{"best_of", intg},
        {"temperature", num},
        {"repetition_penalty", num},
        {"frequency_penalty", num},
        {"top_k", intg},
        {"top_p", num},
        {"typical_p", num},
        {"do_sample", {{"type", "boolean"}, {"default", false}}},
        {"max_new_tokens", {{"type", "integer"}, {"nullable", true}, {"default", nullptr}}},
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
        {"top_n_tokens", intg},
        {"grammar", ref("GrammarType")}}}};
  json grammar = {
      {"type", "object"},
      {"nullable", true},
      {"required", {"type"}},
      {"description",
       "Constrained output: the generated text matches a JSON Schema (\"json\", \"json_object\": "
       "value is the schema; \"json_schema\": value is {name, schema, strict}) or a regular "
       "expression (\"regex\": value is the pattern)"},
      {"properties",
       {{"type", {{"type", "string"}, {"enum", {"json", "json_object", "json_schema", "regex"}}}},
        {"value",
         {{"description", "The schema (an object, or a string of JSON) or the pattern"}}}}}};
  json message = {
      {"type", "object"},
      {"required", {"role"}},
      {"properties",
       {{"role", {{"type", "string"}}},
        {"content",
         {{"nullable", true},
          {"oneOf", {{{"type", "string"}}, {{"type", "array"}, {"items", {{"type", "object"}}}}}}}},
        {"name", {{"type", "string"}}},
        {"tool_calls", {{"type", "array"}, {"items", {{"type", "object"}}}}},
        {"tool_call_id", {{"type", "string"}}}}}};
  json chat = {
      {"type", "object"},
      {"required", {"messages"}},
      {"properties",
       {{"model", {{"type", "string"}}},
        {"messages", {{"type", "array"}, {"items", ref("Message")}}},
        {"stream", {{"type", "boolean"}}},
        {"stream_options",
         {{"type", "object"}, {"properties", {{"include_usage", {{"type", "boolean"}}}}}}},
        {"logprobs", {{"type", "boolean"}}},
        {"top_logprobs", intg},
        {"stop",
         {{"oneOf", {{{"type", "string"}}, {{"type", "array"}, {"items", {{"type", "string"}}}}}}}},
        {"seed", intg},
        {"max_tokens", intg},
        {"max_completion_tokens", intg},
        {"temperature", num},
        {"top_p", num},
        {"frequency_penalty", num},
        {"presence_penalty", num},
        {"n", {{"type", "integer"}, {"description", "Only 1"}}},
        {"response_format",
         {{"type", "object"},
          {"description",
           "{\"type\": \"text\" | \"json_object\"} or {\"type\": \"json_schema\", "
           "\"json_schema\": {name, schema, strict}}, or TGI's grammar shapes"}}},
        {"tools", {{"type", "array"}, {"items", {{"type", "object"}}}}},
        {"tool_choice",
         {{"oneOf",
           {{{"type", "string"}, {"enum", {"auto", "none", "required"}}}, {{"type", "object"}}}}}},
        {"tool_prompt", {{"type", "string"}}}}}};
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
          {"stream_options",
           {{"type", "object"}, {"properties", {{"include_usage", {{"type", "boolean"}}}}}}},
          {"stop", {{"type", "array"}, {"items", {{"type", "string"}}}}},
          {"frequency_penalty", num},
          {"presence_penalty", num},
          {"repetition_penalty", num}}}}},
      {"VertexRequest",
       {{"type", "object"},
        {"required", {"instances"}},
        {"properties",
         {{"instances",
           {{"type", "array"},
            {"items",
             {{"oneOf",
               {{{"$ref", "#/components/schemas/GenerateRequest"}},
                {{"$ref", "#/components/schemas/ChatRequest"}}}}}}}}}}}},
      {"GrammarType", grammar},
      {"Message", message},
      {"ChatRequest", chat},
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
      {"/v1/chat/completions",
       {{"post", post("OpenAI-compatible chat completions (the model's chat template; tools; "
                      "response_format); with \"stream\": true, Server-Sent Events",
                      "ChatRequest", okJson("A chat completion", {{"type", "object"}}))}}},
      {"/chat_tokenize",
       {{"post", post("The chat template's prompt for a chat request, tokenized", "ChatRequest",
                      okJson("{tokenize_response, templated_text}", {{"type", "object"}}))}}},
      {"/invocations",
       {{"post",
         post("SageMaker's route: a chat (messages), a completion (prompt) or a TGI "
              "request (inputs)",
              "CompatGenerateRequest", okJson("As the matching route", {{"type", "object"}}))}}},
      {"/vertex",
       {{"post", post("Google Vertex AI's format: {instances: [{inputs, parameters} or a chat "
                      "request]} -> {predictions: [generated text]}",
                      "VertexRequest",
                      okJson("Predictions",
                             {{"type", "object"},
                              {"properties",
                               {{"predictions",
                                 {{"type", "array"}, {"items", {{"type", "string"}}}}}}}}))}}},
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
