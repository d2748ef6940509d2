// textgen-tokenize --tokenizer DIR [--decode] [--no-special]
//
// Encode (default): reads one JSON string per line on stdin, prints one JSON object per line:
//   {"ids": [...], "tokens": [...], "offsets": [[start, end], ...]}   (byte offsets)
// Decode (--decode): reads one JSON array of ids per line, prints {"text": "..."}.
// --no-special: encode without special tokens / decode skipping special tokens.
// A line that cannot be processed prints {"error": "..."}; the exit status is then 1.
#include <cstdint>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "textgen/base/json.h"
#include "textgen/tokenizer/tokenizer.h"

namespace {

int usage() {
  std::cerr << "usage: textgen-tokenize --tokenizer DIR [--decode] [--no-special]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  bool decode = false, special = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) {
      dir = argv[++i];
    } else if (std::strcmp(argv[i], "--decode") == 0) {
      decode = true;
    } else if (std::strcmp(argv[i], "--no-special") == 0) {
      special = false;
    } else {
      std::cerr << "textgen-tokenize: unknown argument '" << argv[i] << "'\n";
      return usage();
    }
  }
  if (dir.empty()) return usage();
  auto tok = textgen::tokenizer::Tokenizer::fromDirectory(dir);
  if (!tok.ok()) {
    std::cerr << "textgen-tokenize: " << tok.status() << "\n";
    return 1;
  }
  int status = 0;
  std::string line;
  while (std::getline(std::cin, line)) {
    auto parsed = textgen::parseJson(line, "the input line");
    nlohmann::json in = parsed.ok() ? std::move(*parsed) : nlohmann::json();
    nlohmann::json out;
    if (decode) {
      std::vector<uint32_t> ids;
      bool ok = in.is_array();
      std::string unknown;
      for (const auto& v : in) {
        if (!v.is_number_unsigned() || v.get<uint64_t>() > UINT32_MAX) {
          ok = false;
          break;
        }
        if (!(*tok)->idToToken(v.get<uint32_t>()) && unknown.empty())
          unknown = std::to_string(v.get<uint64_t>());
        ids.push_back(v.get<uint32_t>());
      }
      if (!ok) {
        out["error"] = "expected a JSON array of token ids";
      } else if (!unknown.empty()) {
        out["error"] = "token id " + unknown + " is not in the vocabulary";
      } else {
        out["text"] = (*tok)->decode(ids, !special);
      }
    } else if (!in.is_string()) {
      out["error"] = "expected a JSON string";
    } else {
      auto e = (*tok)->encode(in.get<std::string>(), special);
      if (e.ok()) {
        out["ids"] = e->ids;
        out["tokens"] = e->tokens;
        out["offsets"] = e->offsets;
      } else {
        out["error"] = e.status().message();
      }
    }
    if (out.contains("error")) status = 1;
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return status;
}
