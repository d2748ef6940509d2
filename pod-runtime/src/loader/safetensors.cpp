#include "textgen/runtime/safetensors.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "textgen/base/file.h"
#include "textgen/base/json.h"

namespace textgen::runtime {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100 * 1024 * 1024;  // the safetensors format's own limit
constexpr size_t kMaxRank = 8;  // torch's tensors stop well before; checkpoints use 1 to 4

int64_t elementSize(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

}  // namespace

StatusOr<std::map<std::string, TensorInfo>> parseSafetensorsHeader(std::string_view header,
                                                                   uint64_t dataSize) {
  TG_ASSIGN_OR_RETURN(nlohmann::json j, parseJson(header, "header"));
  if (!j.is_object()) return invalidArgumentError("header is not a JSON object");
  std::map<std::string, TensorInfo> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const nlohmann::json& t = it.value();
    auto bad = [&](const std::string& what) {
      return invalidArgumentError("tensor '" + name + "': " + what);
    };
    if (!t.is_object()) return bad("entry is not an object");
    if (!t.contains("dtype") || !t["dtype"].is_string()) return bad("missing dtype");
    if (!t.contains("shape") || !t["shape"].is_array()) return bad("missing shape");
    if (!t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2) {
      return bad("data_offsets must be [begin, end]");
    }
    TensorInfo info;
    info.dtype = t["dtype"].get<std::string>();
    const int64_t es = elementSize(info.dtype);
    if (es == 0) return bad("unknown dtype '" + info.dtype + "'");
    if (t["shape"].size() > kMaxRank)
      return bad("rank " + std::to_string(t["shape"].size()) + " is more than " +
                 std::to_string(kMaxRank));
    // The element count and byte size in checked arithmetic: each dimension fits an int64 and the
    // byte size fits the data section, so nothing computed from the shape later can overflow.
    uint64_t elements = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned()) return bad("shape entries must be non-negative integers");
      const uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(elements, v, &elements))
        return bad("shape overflows");
      info.shape.push_back(static_cast<int64_t>(v));
    }
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(es), &bytes) ||
        bytes > static_cast<uint64_t>(INT64_MAX)) {
      return bad("shape overflows");
    }
    for (int k = 0; k < 2; ++k) {
      if (!t["data_offsets"][k].is_number_unsigned())
        return bad("data_offsets must be non-negative integers");
    }
    info.begin = t["data_offsets"][0].get<uint64_t>();
    info.end = t["data_offsets"][1].get<uint64_t>();
    if (info.begin > info.end || info.end > dataSize) {
      return bad("data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                 ") outside the " + std::to_string(dataSize) + "-byte data section");
    }
    if (info.end - info.begin != bytes) {
      return bad("data_offsets span " + std::to_string(info.end - info.begin) +
                 " bytes, shape and dtype need " + std::to_string(bytes));
    }
    ranges.push_back({info.begin, info.end});
    out.emplace(name, std::move(info));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second)
      return invalidArgumentError("tensors overlap in the data section");
  }
  return out;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  // A regular file only: a FIFO or device would block the open or the mapping.
  TG_ASSIGN_OR_RETURN(RegularFile regular, RegularFile::open(path));
  const uint64_t size = regular.size();
  if (size < 8) return invalidArgumentError(path + ": shorter than the 8-byte header length");
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, regular.fd(), 0);
  if (map == MAP_FAILED) return internalError(path + ": mmap failed: " + std::strerror(errno));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = static_cast<const unsigned char*>(map);
  file->size_ = size;
  uint64_t headerLen = 0;
  for (int i = 7; i >= 0; --i) headerLen = (headerLen << 8) | file->map_[i];
  if (headerLen > kMaxHeaderBytes) {
    return invalidArgumentError(path + ": header length " + std::to_string(headerLen) +
                                " exceeds 100 MB");
  }
  if (headerLen > size - 8) {
    return invalidArgumentError(path + ": header length " + std::to_string(headerLen) +
                                " exceeds the file (" + std::to_string(size) +
                                " bytes): truncated?");
  }
  file->dataStart_ = 8 + headerLen;
  std::string_view header(reinterpret_cast<const char*>(file->map_ + 8), headerLen);
  auto tensors = parseSafetensorsHeader(header, size - file->dataStart_);
  if (!tensors.ok()) return tensors.status().withContext(path);
  file->tensors_ = std::move(*tensors);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(const_cast<unsigned char*>(map_), size_);
}

std::string_view SafetensorsFile::bytes(const TensorInfo& info) const {
  return {reinterpret_cast<const char*>(map_ + dataStart_ + info.begin),
          static_cast<size_t>(info.end - info.begin)};
}

}  // namespace textgen::runtime
