#include "textgen/kernels/relative_position.h"

namespace textgen::kernels {

int relativePositionBucket(int relativePosition, bool bidirectional, int numBuckets,
                           int maxDistance) {
  return relativePositionBucketInline(relativePosition, bidirectional, numBuckets, maxDistance);
}

}  // namespace textgen::kernels
