#include "layers/relative_bias.h"

#include <cmath>
#include <vector>

#include "textgen/kernels/relative_position.h"

namespace textgen::runtime {

StatusOr<RelativeBias> RelativeBias::load(const WeightLoader& w, const std::string& name,
                                          int64_t buckets, int64_t maxDistance,
                                          bool bidirectional) {
  if (buckets <= 0 || buckets > 4096 || maxDistance <= 0 || maxDistance > (int64_t{1} << 24) ||
      !kernels::validRelativePositionConfig(bidirectional, static_cast<int>(buckets),
                                            static_cast<int>(maxDistance))) {
    return invalidArgumentError(
        "config.json: relative_attention_num_buckets (" + std::to_string(buckets) +
        ") and relative_attention_max_distance (" + std::to_string(maxDistance) +
        ") must give exact and logarithmic buckets");
  }
  const int64_t heads = w.config().numHeads;
  TG_ASSIGN_OR_RETURN(Tensor t, w.hostF32({name, {buckets, heads}, w.partition().row()}));
  std::vector<float> values(t.f32(), t.f32() + t.numel());
  for (float v : values) {
    if (!std::isfinite(v)) return invalidArgumentError("'" + name + "': a value is not finite");
  }
  RelativeBias b;
  TG_ASSIGN_OR_RETURN(auto table, w.uploadF32(values));
  b.table = std::move(table);
  b.buckets = static_cast<int32_t>(buckets);
  b.maxDistance = static_cast<int32_t>(maxDistance);
  b.bidirectional = bidirectional;
  return b;
}

}  // namespace textgen::runtime
