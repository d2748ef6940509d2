// The CPU backend: OpenBLAS GEMMs, everything else plain loops over float32.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "textgen/runtime/backend.h"

namespace textgen::runtime {
namespace {

// calloc, not std::vector: large blocks come from mmap as untouched zero pages, so a KV pool of
// gigabytes costs nothing until it is used (a vector writes every page: seconds at start-up).
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes)
      : data_(static_cast<float*>(std::calloc(bytes / sizeof(float) + 1, sizeof(float)))),
        bytes_(bytes) {
    if (!data_) throw std::bad_alloc();
  }
  ~HostBuffer() override { std::free(data_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  float* data_;
  size_t bytes_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) {
    openblas_set_num_threads(
        threads > 0 ? threads
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  }

  const char* name() const override { return "cpu"; }

  StatusOr<std::unique_ptr<Buffer>> allocate(size_t bytes) override {
    try {
      return std::unique_ptr<Buffer>(std::make_unique<HostBuffer>(bytes));
    } catch (const std::bad_alloc&) {
      return resourceExhaustedError("cpu: cannot allocate " + std::to_string(bytes) + " bytes");
    }
  }

  Status upload(Buffer& dst, const void* src, size_t bytes) override {
    if (bytes > dst.bytes()) return invalidArgumentError("upload larger than the buffer");
    std::memcpy(dst.data(), src, bytes);
    return okStatus();
  }

  Status download(void* dst, const Buffer& src, size_t bytes) override {
    if (bytes > src.bytes()) return invalidArgumentError("download larger than the buffer");
    std::memcpy(dst, const_cast<Buffer&>(src).data(), bytes);
    return okStatus();
  }

  Status embedding(const EmbeddingParams& p) override {
    for (int64_t r = 0; r < p.rows; ++r) {
      if (p.ids[r] >= p.vocab)
        return invalidArgumentError("token id " + std::to_string(p.ids[r]) + " out of vocabulary");
      std::memcpy(p.out + r * p.hidden, p.table + static_cast<int64_t>(p.ids[r]) * p.hidden,
                  p.hidden * sizeof(float));
    }
    return okStatus();
  }

  Status rmsNorm(const kernels::RmsNormParams& p) override { return kernels::rmsNormReference(p); }

  Status linear(const LinearParams& p) override {
    if (p.rows == 0) return okStatus();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(p.rows),
                static_cast<blasint>(p.out), static_cast<blasint>(p.in), 1.0f, p.x,
                static_cast<blasint>(p.in), p.weight, static_cast<blasint>(p.in), 0.0f, p.y,
                static_cast<blasint>(p.out));
    return okStatus();
  }

  Status rope(const RopeParams& p) override {
    const int64_t half = p.rotaryDim / 2;
    std::vector<float> cosv(half), sinv(half);
    for (int64_t r = 0; r < p.rows; ++r) {
      const float pos = static_cast<float>(p.positions[r]);
      for (int64_t i = 0; i < half; ++i) {
        const float f = pos * p.invFreq[r * half + i];
        cosv[i] = std::cos(f);
        sinv[i] = std::sin(f);
      }
      auto rotate = [&](float* head) {
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = head[i], x2 = head[i + half];
          head[i] = x1 * cosv[i] - x2 * sinv[i];
          head[i + half] = x2 * cosv[i] + x1 * sinv[i];
        }
      };
      for (int64_t h = 0; h < p.numHeads; ++h) rotate(p.q + (r * p.numHeads + h) * p.headDim);
      for (int64_t h = 0; h < p.numKvHeads; ++h) rotate(p.k + (r * p.numKvHeads + h) * p.headDim);
    }
    return okStatus();
  }

  Status writeKv(const KvWriteParams& p) override {
    const int64_t width = p.numKvHeads * p.headDim;
    for (int64_t r = 0; r < p.rows; ++r) {
      if (p.slots[r] >= p.numSlots)
        return invalidArgumentError("slot " + std::to_string(p.slots[r]) + " out of range");
      std::memcpy(p.kCache + static_cast<int64_t>(p.slots[r]) * width, p.k + r * width,
                  width * sizeof(float));
      std::memcpy(p.vCache + static_cast<int64_t>(p.slots[r]) * width, p.v + r * width,
                  width * sizeof(float));
    }
    return okStatus();
  }

  Status attention(const AttentionParams& p) override {
    const int64_t group = p.numHeads / p.numKvHeads;
    const int64_t kvWidth = p.numKvHeads * p.headDim;
    std::vector<float> scores;
    for (const SequenceRows& s : p.sequences) {
      const int64_t contextLen = s.startPos + s.numRows;
      if (static_cast<int64_t>(s.blocks.size()) * p.blockSize < contextLen) {
        return invalidArgumentError("a sequence's blocks hold fewer positions than its context");
      }
      scores.resize(contextLen);
      for (int64_t t = 0; t < s.numRows; ++t) {
        const int64_t row = s.firstRow + t;
        const int64_t pos = s.startPos + t;
        const int64_t lo =
            p.slidingWindow > 0 ? std::max<int64_t>(0, pos - p.slidingWindow + 1) : 0;
        for (int64_t h = 0; h < p.numHeads; ++h) {
          const float* q = p.q + (row * p.numHeads + h) * p.headDim;
          const int64_t kvh = h / group;
          float maxScore = -INFINITY;
          for (int64_t j = lo; j <= pos; ++j) {
            const int64_t slot =
                static_cast<int64_t>(s.blocks[j / p.blockSize]) * p.blockSize + j % p.blockSize;
            const float* k = p.kCache + slot * kvWidth + kvh * p.headDim;
            float dot = 0.0f;
            for (int64_t d = 0; d < p.headDim; ++d) dot += q[d] * k[d];
            scores[j] = dot * p.scale;
            maxScore = std::max(maxScore, scores[j]);
          }
          float sum = 0.0f;
          for (int64_t j = lo; j <= pos; ++j) {
            scores[j] = std::exp(scores[j] - maxScore);
            sum += scores[j];
          }
          float* out = p.out + (row * p.numHeads + h) * p.headDim;
          std::fill(out, out + p.headDim, 0.0f);
          for (int64_t j = lo; j <= pos; ++j) {
            const int64_t slot =
                static_cast<int64_t>(s.blocks[j / p.blockSize]) * p.blockSize + j % p.blockSize;
            const float* v = p.vCache + slot * kvWidth + kvh * p.headDim;
            const float w = scores[j] / sum;
            for (int64_t d = 0; d < p.headDim; ++d) out[d] += w * v[d];
          }
        }
      }
    }
    return okStatus();
  }

  Status siluMul(const SiluMulParams& p) override {
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* gate = p.gateUp + r * 2 * p.n;
      const float* up = gate + p.n;
      float* out = p.out + r * p.n;
      for (int64_t i = 0; i < p.n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    }
    return okStatus();
  }
};

}  // namespace

std::unique_ptr<Backend> makeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace textgen::runtime
