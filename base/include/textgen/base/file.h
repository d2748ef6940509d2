// Files named from outside the process (a model folder, a tokenizer directory, the hub cache) are
// opened here: regular files only, and without blocking, so a FIFO or a device put where a
// config.json belongs is an error that names it instead of a start-up that never ends.
#pragma once

#include <cstdint>
#include <string>

#include "textgen/base/status_or.h"

namespace textgen {

// Far above any config.json, tokenizer.json or index we read (the largest tokenizer.json files are
// about 30 MiB); a bound, so that a huge file is an error rather than memory exhausted.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{64} << 20;

// An open regular file (the descriptor closes with the object) and its size when it was opened.
class RegularFile {
 public:
  // NOT_FOUND when `path` does not exist; INVALID_ARGUMENT naming it when it is not a regular file
  // (directory, FIFO, socket, device); PERMISSION_DENIED or INTERNAL for the other open errors.
  static StatusOr<RegularFile> open(const std::string& path);

  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // The whole content, or INVALID_ARGUMENT when it is larger than maxBytes (checked while reading,
  // so a file that grows is caught too).
  StatusOr<std::string> readAll(uint64_t maxBytes = kMaxTextFileBytes) const;

 private:
  RegularFile(int fd, uint64_t size, std::string path)
      : fd_(fd), size_(size), path_(std::move(path)) {}
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
};

// RegularFile::open(path) then readAll(maxBytes).
StatusOr<std::string> readRegularFile(const std::string& path,
                                      uint64_t maxBytes = kMaxTextFileBytes);

}  // namespace textgen
