// Marlin's checkpoint layout (IST-DASLab/marlin, Frantar et al. 2024: `Layer.pack`), as TGI's and
// vLLM's Marlin loaders read it, unpacked into a QuantizedTensor: 4-bit symmetric codes, zero 8,
// w[o, i] = (q - 8) * s[i / groupSize, o] with one float16 scale per group of inputs (128) or per
// output channel (group_size -1).
//
// "<prefix>.":
//   B int32 [in / 16, out * 2]   the [in, out] codes cut into 16x16 tiles (tile row = 16 inputs,
//                                tiles of a tile row in output order, each tile row-major), every
//                                1024 consecutive codes of a tile row (4 tiles) reordered by
//                                Marlin's fixed permutation (the order its GEMM's threads load them
//                                in), then packed 8 to a word, low nibble first
//   s fp16  [groups, out]        flattened and reordered in runs of 64 (an 8x8 transpose) when
//                                there are several groups, of 32 when there is one
// The layout needs in % 16 == 0 and out % 64 == 0 (a permutation run spans 4 tiles of outputs);
// Marlin's GPU kernels further want in % 128 (their thread tiles), which the host reader does not.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "loader/quantized_tensor.h"

namespace textgen::runtime {

// Codes per Marlin tile side, and per permutation run of a tile row.
inline constexpr int64_t kMarlinTile = 16;
inline constexpr int64_t kMarlinPermLength = 1024;

// The [out, in] codes (zero 8) and [out, groups] scales of a Marlin layer. `packedB`: the bytes of
// B, [in / 16, out * 2] little-endian int32; `s`: [groups, out] as stored (permuted). The caller
// has checked the shapes (in % 16, out % 64, groups dividing in).
QuantizedTensor unpackMarlin(std::string_view packedB, const std::vector<float>& s, int64_t out,
                             int64_t in, int64_t groups);

}  // namespace textgen::runtime
