#include "textgen/kernels/rope_kv_write.h"

namespace textgen::kernels {

Status validateRopeKvWrite(const RopeKvWriteParams& p) {
  TG_RETURN_IF_ERROR(validateRope(p.rope));
  TG_RETURN_IF_ERROR(validateKvWrite(p.kv));
  if (p.kv.k != p.rope.k || p.kv.kvRowStride != p.rope.kRowStride || p.kv.rows != p.rope.rows ||
      p.kv.numKvHeads != p.rope.numKvHeads || p.kv.headDim != p.rope.headDim ||
      p.kv.dtype != p.rope.dtype)
    return invalidArgumentError("rope_kv_write: the KV write must read the rows RoPE rotates");
  return okStatus();
}

Status ropeKvWriteReference(const RopeKvWriteParams& p) {
  TG_RETURN_IF_ERROR(validateRopeKvWrite(p));
  TG_RETURN_IF_ERROR(ropeReference(p.rope));
  return kvWriteReference(p.kv);
}

}  // namespace textgen::kernels
