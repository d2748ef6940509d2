// A model.safetensors file from untrusted bytes. The input is the whole file: the loader opens it
// as it opens a checkpoint (mmap, the 8-byte header length, header validation); then every tensor
// it accepted is read as bytes and loaded in each compute dtype, whole and as tensor-parallel
// slices. An accepted header must never lead a read outside the file.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fuzz_util.h"
#include "textgen/runtime/safetensors.h"
#include "textgen/runtime/weights.h"

namespace {

namespace fs = std::filesystem;
using textgen::runtime::DType;
using textgen::runtime::SafetensorsFile;
using textgen::runtime::Shard;
using textgen::runtime::WeightStore;

// One directory per fuzzing process (libFuzzer's -jobs/-fork run several), removed at exit.
const fs::path& modelDir() {
  static const fs::path dir = [] {
    fs::path d =
        fs::temp_directory_path() / ("textgen-fuzz-safetensors-" + std::to_string(getpid()));
    fs::create_directories(d);
    std::atexit([] { fs::remove_all(modelDir()); });
    return d;
  }();
  return dir;
}

}  // namespace

volatile unsigned gSink = 0;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The header parser alone, with a data section large enough for any offsets (the overlap and
  // shape checks then decide).
  if (size >= 8) {
    const std::string_view header(reinterpret_cast<const char*>(data) + 8, size - 8);
    (void)textgen::runtime::parseSafetensorsHeader(header, UINT64_MAX);
  }

  const fs::path path = modelDir() / "model.safetensors";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  auto file = SafetensorsFile::open(path.string());
  if (!file.ok()) {
    FUZZ_CHECK(!file.status().message().empty(), "an error without a message");
    return 0;
  }
  unsigned sum = 0;
  for (const auto& [name, info] : (*file)->tensors()) {
    const std::string_view bytes = (*file)->bytes(info);
    FUZZ_CHECK(bytes.size() == info.end - info.begin, name);
    for (char c : bytes) sum += static_cast<unsigned char>(c);  // every byte must be mapped
  }
  auto store = WeightStore::open(modelDir().string());
  FUZZ_CHECK(store.ok(),
             "WeightStore rejects a file SafetensorsFile accepts: " + store.status().toString());
  for (const auto& [name, info] : (*file)->tensors()) {
    FUZZ_CHECK((*store)->contains(name), name);
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (Shard shard : {Shard{}, Shard{.dim = 0, .rank = 1, .worldSize = 2},
                          Shard{.dim = 1, .rank = 0, .worldSize = 2},
                          Shard{.dim = 1, .rank = 2, .worldSize = 3}}) {
        auto t = (*store)->load(name, dtype, {}, shard);
        if (t.ok()) sum += static_cast<unsigned>(t->shape().size());
      }
    }
  }
  gSink = sum;  // keeps the reads
  return 0;
}
