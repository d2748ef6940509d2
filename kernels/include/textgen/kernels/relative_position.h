// T5's relative position buckets (transformers' T5Attention._relative_position_bucket): the bucket
// of relativePosition = key position - query position, whose row of the [numBuckets, numHeads]
// bias table T5 adds to the scores (PagedAttentionParams::relativeBias).
//
// Bidirectional (encoder): half the buckets per direction, keys after the query in the upper half.
// Causal (decoder): keys after the query (rel > 0) fall in bucket 0 (masked anyway). Per direction
// the first half of the buckets are exact distances, then log-spaced up to maxDistance, then the
// last bucket. The log is evaluated as torch does it, in float32: log(float(n) / maxExact) divided
// by log(maxDistance / maxExact) (a double rounded to float), times the bucket count, truncated.
// Requires numBuckets >= 2 (>= 4 bidirectional) and maxDistance > the exact range (numBuckets / 2,
// / 4 bidirectional); validRelativePositionConfig checks both.
#pragma once

#include <cmath>

#ifndef TEXTGEN_HOST_DEVICE
#if defined(__CUDACC__)
#define TEXTGEN_HOST_DEVICE __host__ __device__
#else
#define TEXTGEN_HOST_DEVICE
#endif
#endif

namespace textgen::kernels {

inline bool validRelativePositionConfig(bool bidirectional, int numBuckets, int maxDistance) {
  const int perDirection = bidirectional ? numBuckets / 2 : numBuckets;
  const int maxExact = perDirection / 2;
  return numBuckets > 0 && maxExact >= 1 && maxDistance > maxExact;
}

// The same arithmetic on the host and in device code (inlined into the attention kernel).
TEXTGEN_HOST_DEVICE inline int relativePositionBucketInline(int relativePosition,
                                                            bool bidirectional, int numBuckets,
                                                            int maxDistance) {
  int bucket = 0;
  int n = 0;
  if (bidirectional) {
    numBuckets /= 2;
    if (relativePosition > 0) bucket += numBuckets;
    n = relativePosition < 0 ? -relativePosition : relativePosition;
  } else {
    n = relativePosition < 0 ? -relativePosition : 0;
  }
  const int maxExact = numBuckets / 2;
  if (n < maxExact) return bucket + n;
  // float32 as torch: the divisor is the Python double math.log(maxDistance / maxExact), rounded
  // to float32 when it meets the float32 tensor.
  const float divisor = static_cast<float>(log(static_cast<double>(maxDistance) / maxExact));
  const float scaled = logf(static_cast<float>(n) / static_cast<float>(maxExact)) / divisor *
                       static_cast<float>(numBuckets - maxExact);
  const int large = maxExact + static_cast<int>(scaled);  // .to(long): truncation (scaled >= 0)
  return bucket + (large < numBuckets - 1 ? large : numBuckets - 1);
}

// Host entry point (relative_position.cpp); the same result as the inline version.
int relativePositionBucket(int relativePosition, bool bidirectional, int numBuckets,
                           int maxDistance);

}  // namespace textgen::kernels
