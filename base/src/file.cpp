#include "textgen/base/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace textgen {
namespace {

Status openError(const std::string& path, int err) {
  const std::string what = path + ": " + std::strerror(err);
  switch (err) {
    case ENOENT:
    case ENOTDIR: return notFoundError(what);
    case EACCES:
    case EPERM: return permissionDeniedError(what);
    default: return internalError(what);
  }
}

const char* kindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

}  // namespace

StatusOr<RegularFile> RegularFile::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one. It has
  // no effect on the reads of a regular file, the only kind kept.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return openError(path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return openError(path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalidArgumentError(path + ": is " + kindOf(st.st_mode) + ", not a regular file");
  }
  return RegularFile(fd, static_cast<uint64_t>(st.st_size), path);
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_), path_(std::move(other.path_)) {}

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    path_ = std::move(other.path_);
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::string> RegularFile::readAll(uint64_t maxBytes) const {
  auto tooLarge = [&] {
    return invalidArgumentError(path_ + ": larger than " + std::to_string(maxBytes) + " bytes");
  };
  if (size_ > maxBytes) return tooLarge();
  std::string out;
  out.reserve(size_);
  char buf[1 << 16];
  uint64_t offset = 0;
  while (true) {
    const ssize_t n = ::pread(fd_, buf, sizeof buf, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return dataLossError(path_ + ": read failed: " + std::strerror(errno));
    }
    if (n == 0) break;
    offset += static_cast<uint64_t>(n);
    if (offset > maxBytes) return tooLarge();
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

StatusOr<std::string> readRegularFile(const std::string& path, uint64_t maxBytes) {
  TG_ASSIGN_OR_RETURN(RegularFile file, RegularFile::open(path));
  return file.readAll(maxBytes);
}

}  // namespace textgen
