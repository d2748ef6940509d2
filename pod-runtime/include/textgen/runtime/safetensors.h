// Safetensors files through mmap, with every header field validated before any byte is read: a
// truncated, oversized or malicious file is an error, never a crash or an out-of-bounds read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "textgen/base/status_or.h"

namespace textgen::runtime {

// One tensor's entry in a safetensors header.
struct TensorInfo {
  std::string dtype;  // as written: "F32", "F16", "BF16", "I64", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range within the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  static StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::string& path() const { return path_; }
  // The validated bytes of a tensor (within the mapping).
  std::string_view bytes(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  const unsigned char* map_ = nullptr;
  size_t size_ = 0;
  size_t dataStart_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

// Parses and validates a header against the data section size (exposed for tests).
StatusOr<std::map<std::string, TensorInfo>> parseSafetensorsHeader(std::string_view header,
                                                                   uint64_t dataSize);

}  // namespace textgen::runtime
