#include "textgen/runtime/weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "loader/parallel_for.h"
#include "textgen/base/file.h"
#include "textgen/base/json.h"
#include "textgen/kernels/half.h"

namespace textgen::runtime {

std::string Tensor::shapeString() const {
  std::string s = "[";
  for (size_t i = 0; i < shape_.size(); ++i) s += (i ? ", " : "") + std::to_string(shape_[i]);
  return s + "]";
}

namespace {

std::string shapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The safetensors name of a dtype.
const char* fileDtypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "";
}

// The shard files named by model.safetensors.index.json, each a plain file name.
StatusOr<std::vector<std::string>> indexShards(const std::string& index) {
  TG_ASSIGN_OR_RETURN(std::string text, readRegularFile(index));
  TG_ASSIGN_OR_RETURN(nlohmann::json j, parseJson(text, index));
  auto map = j.is_object() ? j.find("weight_map") : j.end();
  if (!j.is_object() || map == j.end() || !map->is_object())
    return invalidArgumentError(index + ": missing object 'weight_map'");
  std::set<std::string> unique;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string())
      return invalidArgumentError(index + ": weight_map values must be file names");
    const std::string f = it->get<std::string>();
    if (f.empty() || f == "." || f.find('/') != std::string::npos ||
        f.find("..") != std::string::npos || f.find('\0') != std::string::npos) {
      return invalidArgumentError(index + ": shard name '" + f + "' is not a plain file name");
    }
    unique.insert(f);
  }
  return std::vector<std::string>(unique.begin(), unique.end());
}

}  // namespace

StatusOr<std::unique_ptr<WeightStore>> WeightStore::open(const std::string& modelDir) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  const std::string index = (fs::path(modelDir) / "model.safetensors.index.json").string();
  std::error_code ec;
  if (fs::exists(fs::symlink_status(index, ec))) {
    TG_ASSIGN_OR_RETURN(files, indexShards(index));
  } else if (fs::exists(fs::symlink_status(fs::path(modelDir) / "model.safetensors", ec))) {
    files.push_back("model.safetensors");
  } else {
    return notFoundError(modelDir +
                         ": no model.safetensors or model.safetensors.index.json "
                         "(PyTorch .bin weights are not supported)");
  }
  for (std::string& f : files) f = (fs::path(modelDir) / f).string();
  return openFiles(files);
}

StatusOr<std::unique_ptr<WeightStore>> WeightStore::openFile(const std::string& path) {
  return openFiles({path});
}

StatusOr<std::unique_ptr<WeightStore>> WeightStore::openFiles(
    const std::vector<std::string>& paths) {
  auto store = std::make_unique<WeightStore>();
  for (const std::string& path : paths) {
    TG_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
    for (const auto& [name, info] : file->tensors()) {
      if (store->where_.contains(name))
        return invalidArgumentError("tensor '" + name + "' appears in two shards");
      store->where_[name] = {file.get(), &info};
    }
    store->files_.push_back(std::move(file));
  }
  return store;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, where] : where_) out.push_back(name);
  return out;
}

const TensorInfo* WeightStore::info(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second.second;
}

StatusOr<Tensor> WeightStore::load(const std::string& name, DType dtype,
                                   const std::vector<int64_t>& expectShape, Shard shard) const {
  auto it = where_.find(name);
  if (it == where_.end()) return notFoundError("weight '" + name + "' not found in the checkpoint");
  const auto& [file, info] = it->second;
  if (info->dtype != "F32" && info->dtype != "F16" && info->dtype != "BF16") {
    return invalidArgumentError("weight '" + name + "' has dtype " + info->dtype +
                                " (expected F32, F16 or BF16)");
  }
  if (!expectShape.empty() && info->shape != expectShape) {
    return invalidArgumentError("weight '" + name + "' has shape " + shapeString(info->shape) +
                                ", expected " + shapeString(expectShape));
  }
  std::vector<int64_t> shape = info->shape;
  if (shard.worldSize < 1 || shard.rank < 0 || shard.rank >= shard.worldSize || shard.dim < 0 ||
      static_cast<size_t>(shard.dim) >= std::max<size_t>(shape.size(), 1)) {
    return invalidArgumentError("weight '" + name + "': invalid shard");
  }
  if (shape.empty()) shape.push_back(1);
  if (!shard.pad && shape[shard.dim] % shard.worldSize != 0) {
    return invalidArgumentError("weight '" + name + "': dimension " + std::to_string(shard.dim) +
                                " (" + std::to_string(shape[shard.dim]) +
                                ") does not divide by world size " +
                                std::to_string(shard.worldSize));
  }
  // View the tensor as [outer, dimSize, inner] and copy rank's part of the middle dimension. The
  // header was checked, but the copy below reads by these products, so check them again here: they
  // must cover exactly the tensor's bytes.
  int64_t outer = 1, inner = 1;
  bool overflow = false;
  for (int d = 0; d < shard.dim; ++d) overflow |= __builtin_mul_overflow(outer, shape[d], &outer);
  for (size_t d = shard.dim + 1; d < shape.size(); ++d)
    overflow |= __builtin_mul_overflow(inner, shape[d], &inner);
  const int64_t full = shape[shard.dim],
                part = (full + shard.worldSize - 1) / shard.worldSize;  // exact unless `pad`
  const std::string_view bytes = file->bytes(*info);
  const size_t es = info->dtype == "F32" ? 4 : 2, outEs = kernels::dtypeSize(dtype);
  int64_t total = 0;
  overflow |= __builtin_mul_overflow(outer, full, &total) ||
              __builtin_mul_overflow(total, inner, &total) ||
              __builtin_mul_overflow(total, static_cast<int64_t>(es), &total);
  if (overflow || full < 0 || total != static_cast<int64_t>(bytes.size())) {
    return invalidArgumentError("weight '" + name + "': shape " + shapeString(info->shape) +
                                " does not match its " + std::to_string(bytes.size()) + " bytes");
  }
  std::vector<int64_t> outShape = info->shape.empty() ? std::vector<int64_t>{} : shape;
  if (!outShape.empty()) outShape[shard.dim] = part;
  Tensor t(dtype, outShape.empty() ? std::vector<int64_t>{1} : outShape);
  const bool same = info->dtype == std::string(fileDtypeName(dtype));
  auto* dst = static_cast<unsigned char*>(t.data());
  if (outer == 0 || part == 0 || inner == 0) return t;  // no elements (and no buffer) to fill
  // Rows of `inner` values: copied as they are, or converted on every core (the source dtype
  // decided once, not per element).
  const int srcKind = info->dtype == "F32" ? 0 : info->dtype == "F16" ? 1 : 2;
  auto convertRow = [&](const char* src, unsigned char* d) {
    for (int64_t i = 0; i < inner; ++i) {
      float v;
      if (srcKind == 0) {
        std::memcpy(&v, src + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        v = srcKind == 1 ? kernels::f16ToFloat(h) : kernels::bf16ToFloat(h);
      }
      switch (dtype) {
        case DType::kF32: std::memcpy(d + 4 * i, &v, 4); break;
        case DType::kF16: {
          const uint16_t h = kernels::floatToF16(v);
          std::memcpy(d + 2 * i, &h, 2);
          break;
        }
        case DType::kBF16: {
          const uint16_t h = kernels::floatToBf16(v);
          std::memcpy(d + 2 * i, &h, 2);
          break;
        }
      }
    }
  };
  parallelFor(
      outer * part,
      [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t o = k / part, m = k % part;
          if (shard.rank * part + m >= full) continue;  // padding: the tensor is zero-initialised
          const int64_t srcRow = (o * full + shard.rank * part + m) * inner;
          const char* src = bytes.data() + srcRow * es;
          unsigned char* d = dst + (o * part + m) * inner * outEs;
          if (same)
            std::memcpy(d, src, inner * es);
          else
            convertRow(src, d);
        }
      },
      rowGrain(inner));
  return t;
}

StatusOr<std::string_view> WeightStore::raw(const std::string& name,
                                            const std::vector<std::string>& dtypes,
                                            const std::vector<int64_t>& expectShape) const {
  auto it = where_.find(name);
  if (it == where_.end()) return notFoundError("weight '" + name + "' not found in the checkpoint");
  const auto& [file, info] = it->second;
  if (std::find(dtypes.begin(), dtypes.end(), info->dtype) == dtypes.end()) {
    std::string want;
    for (const std::string& d : dtypes) want += (want.empty() ? "" : " or ") + d;
    return invalidArgumentError("weight '" + name + "' has dtype " + info->dtype + " (expected " +
                                want + ")");
  }
  if (info->shape != expectShape) {
    return invalidArgumentError("weight '" + name + "' has shape " + shapeString(info->shape) +
                                ", expected " + shapeString(expectShape));
  }
  const std::string_view bytes = file->bytes(*info);
  const uint64_t es = info->dtype == "F32" || info->dtype == "I32"   ? 4
                      : info->dtype == "I64" || info->dtype == "F64" ? 8
                      : info->dtype == "I8" || info->dtype == "U8" || info->dtype == "BOOL" ||
                              info->dtype == "F8_E4M3" || info->dtype == "F8_E5M2"
                          ? 1
                          : 2;
  uint64_t total = es;
  bool overflow = false;
  for (int64_t d : expectShape)
    overflow |= d < 0 || __builtin_mul_overflow(total, static_cast<uint64_t>(d), &total);
  if (overflow || total != bytes.size()) {
    return invalidArgumentError("weight '" + name + "': shape " + shapeString(info->shape) +
                                " does not match its " + std::to_string(bytes.size()) + " bytes");
  }
  return bytes;
}

}  // namespace textgen::runtime
