// RoPE and the paged KV write in one pass (decode steps are latency-bound: one kernel less per
// layer). Exactly rope(p.rope) then kvWrite(p.kv), with p.kv.k and p.kv.v reading the rows p.rope
// rotates; on the device the rotated keys go to the cache straight from registers (the k rows in
// the activation buffer are rotated too).
#pragma once

#include "textgen/base/status.h"
#include "textgen/kernels/kv_write.h"
#include "textgen/kernels/rope.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct RopeKvWriteParams {
  RopeParams rope;
  KvWriteParams kv;  // kv.k must equal rope.k, and the shapes and dtype must agree
};

Status validateRopeKvWrite(const RopeKvWriteParams& p);
Status ropeKvWriteReference(const RopeKvWriteParams& p);
Status invokeRopeKvWrite(const RopeKvWriteParams& p, Stream stream);

}  // namespace textgen::kernels
