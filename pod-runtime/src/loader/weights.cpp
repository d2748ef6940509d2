#include "textgen/runtime/weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

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

float element(const std::string& dtype, const char* p) {
  if (dtype == "F32") {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == "F16" ? kernels::f16ToFloat(h) : kernels::bf16ToFloat(h);
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

}  // namespace

StatusOr<std::unique_ptr<WeightStore>> WeightStore::open(const std::string& modelDir) {
  namespace fs = std::filesystem;
  auto store = std::make_unique<WeightStore>();
  std::vector<std::string> files;
  const fs::path index = fs::path(modelDir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return invalidArgumentError(index.string() + ": missing object 'weight_map'");
    }
    std::set<std::string> unique;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string())
        return invalidArgumentError(index.string() + ": weight_map values must be file names");
      const std::string f = it->get<std::string>();
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos) {
        return invalidArgumentError(index.string() + ": shard name '" + f +
                                    "' is not a plain file name");
      }
      unique.insert(f);
    }
    files.assign(unique.begin(), unique.end());
  } else if (fs::exists(fs::path(modelDir) / "model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    return notFoundError(modelDir +
                         ": no model.safetensors or model.safetensors.index.json "
                         "(PyTorch .bin weights are not supported)");
  }
  for (const std::string& f : files) {
    TG_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open((fs::path(modelDir) / f).string()));
    for (const auto& [name, info] : file->tensors()) {
      if (store->where_.contains(name))
        return invalidArgumentError("tensor '" + name + "' appears in two shards");
      store->where_[name] = {file.get(), &info};
    }
    store->files_.push_back(std::move(file));
  }
  return store;
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
  if (shape[shard.dim] % shard.worldSize != 0) {
    return invalidArgumentError("weight '" + name + "': dimension " + std::to_string(shard.dim) +
                                " (" + std::to_string(shape[shard.dim]) +
                                ") does not divide by world size " +
                                std::to_string(shard.worldSize));
  }
  // View the tensor as [outer, dimSize, inner] and copy rank's part of the middle dimension.
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < shard.dim; ++d) outer *= shape[d];
  for (size_t d = shard.dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t full = shape[shard.dim], part = full / shard.worldSize;
  std::vector<int64_t> outShape = info->shape.empty() ? std::vector<int64_t>{} : shape;
  if (!outShape.empty()) outShape[shard.dim] = part;
  Tensor t(dtype, outShape.empty() ? std::vector<int64_t>{1} : outShape);
  const std::string_view bytes = file->bytes(*info);
  const size_t es = info->dtype == "F32" ? 4 : 2, outEs = kernels::dtypeSize(dtype);
  const bool same = info->dtype == std::string(fileDtypeName(dtype));
  auto* dst = static_cast<unsigned char*>(t.data());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t m = 0; m < part; ++m) {
      const int64_t srcRow = (o * full + shard.rank * part + m) * inner;
      const char* src = bytes.data() + srcRow * es;
      unsigned char* d = dst + (o * part + m) * inner * outEs;
      if (same) {
        std::memcpy(d, src, inner * es);
        continue;
      }
      for (int64_t i = 0; i < inner; ++i) {
        const float v = element(info->dtype, src + i * es);
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
    }
  }
  return t;
}

}  // namespace textgen::runtime
