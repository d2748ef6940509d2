#include "textgen/kernels/argmax.h"

#include <cmath>

#include "elements.h"

namespace textgen::kernels {

Status validateArgmax(const ArgmaxParams& p) {
  if (p.rows < 0 || p.vocab <= 0) return invalidArgumentError("argmax: bad shape");
  if (p.rows > 0 && (!p.logits || !p.ids || !p.logprobs))
    return invalidArgumentError("argmax: logits, ids and logprobs are required");
  return okStatus();
}

Status argmaxReference(const ArgmaxParams& p) {
  TG_RETURN_IF_ERROR(validateArgmax(p));
  const Elements e{p.dtype};
  for (int64_t r = 0; r < p.rows; ++r) {
    int64_t best = 0;
    float max = e.load(p.logits, r * p.vocab);
    for (int64_t i = 1; i < p.vocab; ++i) {
      const float v = e.load(p.logits, r * p.vocab + i);
      if (v > max) {
        max = v;
        best = i;
      }
    }
    double sum = 0;
    for (int64_t i = 0; i < p.vocab; ++i) sum += std::exp(e.load(p.logits, r * p.vocab + i) - max);
    p.ids[r] = static_cast<int32_t>(best);
    p.logprobs[r] = static_cast<float>(-std::log(sum));
  }
  return okStatus();
}

}  // namespace textgen::kernels
