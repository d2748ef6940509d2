// Grammar::compile: a regex (or a JSON Schema's regex) to a trimmed byte DFA.
#include "textgen/grammar/grammar.h"

#include "automaton.h"
#include "dfa_grammar.h"
#include "fmt/core.h"
#include "regex_parser.h"

namespace textgen::grammar {
namespace {

StatusOr<std::shared_ptr<const Grammar>> compileRegex(std::string_view pattern,
                                                      const Limits& limits) {
  TG_ASSIGN_OR_RETURN(RegexAst ast, parseRegex(pattern, limits));
  TG_ASSIGN_OR_RETURN(Dfa dfa, buildDfa(ast, limits));
  return std::shared_ptr<const Grammar>(std::make_shared<DfaGrammar>(std::move(dfa)));
}

}  // namespace

StatusOr<std::shared_ptr<const Grammar>> Grammar::compile(Kind kind, std::string_view source,
                                                          const Limits& limits) {
  if (source.size() > limits.maxSourceBytes) {
    return resourceExhaustedError(fmt::format(
        "grammar: the {} is {} bytes, past maxSourceBytes ({})",
        kind == Kind::kRegex ? "regex" : "schema", source.size(), limits.maxSourceBytes));
  }
  if (kind == Kind::kRegex) return compileRegex(source, limits);
  TG_ASSIGN_OR_RETURN(std::string regex, jsonSchemaToRegex(source, limits));
  Limits forRegex = limits;
  forRegex.maxSourceBytes = limits.maxRegexBytes;
  auto g = compileRegex(regex, forRegex);
  if (!g.ok()) {
    return Status(g.status().code(),
                  "json schema: its regex: " + std::string(g.status().message()));
  }
  return g;
}

int32_t Grammar::walk(int32_t state, std::string_view bytes) const {
  for (char c : bytes) {
    if (state == kDead) return kDead;
    state = next(state, static_cast<uint8_t>(c));
  }
  return state;
}

bool Grammar::matches(std::string_view text) const {
  const int32_t s = walk(start(), text);
  return s != kDead && accepting(s);
}

}  // namespace textgen::grammar
