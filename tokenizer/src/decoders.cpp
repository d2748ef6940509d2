// Decoders: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, BPEDecoder, Sequence.
#include "byte_level.h"
#include "components.h"
#include "unicode.h"

namespace textgen::tokenizer {
namespace {

class ByteLevelDecoder final : public Decoder {
 public:
  void decodeChain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      bool all = true;
      size_t len;
      for (size_t i = 0; i < t.size(); i += len) {
        const int b = charToByte(decodeUtf8(t, i, &len));
        if (b < 0) {
          all = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!all) {  // not a byte-level token (e.g. an added token): its own bytes
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, utf8Lossy(bytes));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, bool prependNever)
      : replacement_(replacement), never_(prependNever) {}
  void decodeChain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      size_t len;
      for (size_t k = 0; k < t.size(); k += len) {
        const char32_t c = decodeUtf8(t, k, &len);
        if (c == replacement_) {
          if (i == 0 && !never_) continue;
          out.push_back(' ');
        } else {
          out.append(t, k, len);
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool never_;
};

class ByteFallbackDecoder final : public Decoder {
 public:
  bool groupsByteTokens() const override { return true; }

  void decodeChain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (isValidUtf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xef\xbf\xbd");
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      if (auto b = parseByte(t)) {
        pending.push_back(static_cast<char>(*b));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static int hexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // "<0xAB>", parsed like Rust's u8::from_str_radix(.., 16) (which also takes a leading '+').
  static std::optional<int> parseByte(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return std::nullopt;
    if (t[3] == '+') {
      const int d = hexDigit(t[4]);
      return d < 0 ? std::nullopt : std::optional<int>(d);
    }
    const int hi = hexDigit(t[3]), lo = hexDigit(t[4]);
    if (hi < 0 || lo < 0) return std::nullopt;
    return hi * 16 + lo;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decodeChain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decodeChain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<std::pair<size_t, size_t>> chars;  // (byte offset, length)
      size_t len;
      std::vector<char32_t> cps;
      for (size_t i = 0; i < t.size(); i += len) {
        cps.push_back(decodeUtf8(t, i, &len));
        chars.push_back({i, len});
      }
      size_t startCut = 0;
      for (size_t i = 0; i < start_ && i < cps.size(); ++i) {
        if (cps[i] != content_) break;
        startCut = i + 1;
      }
      size_t stopCut = cps.size();
      for (size_t i = 0; i < stop_ && i < cps.size(); ++i) {
        const size_t index = cps.size() - i - 1;
        if (cps[index] != content_) break;
        stopCut = index;
      }
      if (startCut >= stopCut) {
        t.clear();
        continue;
      }
      const size_t from = chars[startCut].first;
      const size_t to = stopCut == cps.size() ? t.size() : chars[stopCut].first;
      t = t.substr(from, to - from);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::shared_ptr<const Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decodeChain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      for (const auto& [range, isMatch] : findMatches(*pattern_, t)) {
        if (isMatch) {
          out += content_;
        } else {
          out.append(t, range.first, range.second - range.first);
        }
      }
      t = std::move(out);
    }
  }

 private:
  std::shared_ptr<const Regex> pattern_;
  std::string content_;
};

class BpeDecoder final : public Decoder {
 public:
  explicit BpeDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decodeChain(std::vector<std::string>& tokens) const override {
    if (suffix_.empty()) return;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string replacement = i + 1 == tokens.size() ? "" : " ";
      std::string& t = tokens[i];
      std::string out;
      size_t pos = 0, hit;
      while ((hit = t.find(suffix_, pos)) != std::string::npos) {
        out.append(t, pos, hit - pos);
        out += replacement;
        pos = hit + suffix_.size();
      }
      out.append(t, pos, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  bool groupsByteTokens() const override {
    for (const auto& p : parts_) {
      if (p->groupsByteTokens()) return true;
    }
    return false;
  }
  void decodeChain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

StatusOr<std::unique_ptr<Decoder>> makeDecoder(const Json& j, const std::string& path) {
  TG_ASSIGN_OR_RETURN(std::string type, componentType(j, path));
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(std::make_unique<ByteLevelDecoder>());
  if (type == "Metaspace") {
    TG_ASSIGN_OR_RETURN(char32_t replacement, getChar(j, path, "replacement"));
    bool never = false;
    if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) {
      never = it->get<std::string>() == "never";
    } else {
      TG_ASSIGN_OR_RETURN(bool add, getBoolOr(j, path, "add_prefix_space", true));
      never = !add;
    }
    return std::unique_ptr<Decoder>(std::make_unique<MetaspaceDecoder>(replacement, never));
  }
  if (type == "ByteFallback")
    return std::unique_ptr<Decoder>(std::make_unique<ByteFallbackDecoder>());
  if (type == "Fuse") return std::unique_ptr<Decoder>(std::make_unique<FuseDecoder>());
  if (type == "Strip") {
    TG_ASSIGN_OR_RETURN(char32_t content, getChar(j, path, "content"));
    TG_ASSIGN_OR_RETURN(int64_t start, getIntOr(j, path, "start", 0));
    TG_ASSIGN_OR_RETURN(int64_t stop, getIntOr(j, path, "stop", 0));
    if (start < 0 || stop < 0) return jsonError(path, "start and stop must be >= 0");
    return std::unique_ptr<Decoder>(std::make_unique<StripDecoder>(
        content, static_cast<size_t>(start), static_cast<size_t>(stop)));
  }
  if (type == "Replace") {
    TG_ASSIGN_OR_RETURN(PatternSpec spec, getPattern(j, path, "pattern"));
    TG_ASSIGN_OR_RETURN(std::string content, getString(j, path, "content"));
    TG_ASSIGN_OR_RETURN(auto pattern, makePattern(spec, childPath(path, "pattern")));
    return std::unique_ptr<Decoder>(
        std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content)));
  }
  if (type == "BPEDecoder") {
    TG_ASSIGN_OR_RETURN(std::string suffix, getStringOr(j, path, "suffix", "</w>"));
    return std::unique_ptr<Decoder>(std::make_unique<BpeDecoder>(std::move(suffix)));
  }
  if (type == "Sequence") {
    TG_ASSIGN_OR_RETURN(const Json* list, getArray(j, path, "decoders"));
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      TG_ASSIGN_OR_RETURN(auto part,
                          makeDecoder((*list)[i], childPath(childPath(path, "decoders"), i)));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<Decoder>(std::make_unique<SequenceDecoder>(std::move(parts)));
  }
  return jsonError(path, "unsupported decoder type '" + type + "'");
}

}  // namespace textgen::tokenizer
