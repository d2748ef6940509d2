// Causal attention of a flattened batch of new rows over the paged KV cache (the rows' own keys
// and values are written to the cache first). Sequence s owns rows seqStarts[s]..seqStarts[s+1]-1;
// its first new row sits at position startPos[s], after startPos[s] cached positions (an earlier
// chunk or a reused prefix). Row t of s attends to positions [lo, startPos[s] + t], lo limited by
// the sliding window. Query head h reads KV head h / (numHeads / numKvHeads) (GQA, MQA).
//
// ALiBi (BLOOM, MPT, Falcon with alibi): with alibiSlopes set, the score of query position i and
// key position j <= i is q·k * scale + slope[h] * (j - i), the bias added after the scale as both
// models do. BLOOM adds slope * j and MPT slope * (j - (seqLen - 1)); each differs from
// slope * (j - i) by a constant per query row, which softmax cancels, so all three give the same
// attention. The relative form keeps the bias small next to the scores at long contexts. A sliding
// window still limits the keys (the bias applies to those left).
// Falcon (alibiBf16Divisor > 0): the bias is bf16(slope[h] * j) / alibiBf16Divisor, j the key's
// absolute position, the product rounded to bfloat16 as transformers' build_alibi_tensor rounds it
// (then divided by sqrt(head_dim)): exact only in the absolute form, which softmax also accepts.
//
// T5 (relative_position.h): with causal = false every row of sequence s attends to all of the
// sequence's positions [0, startPos[s] + rows of s) (encoder self-attention), and with contextLens
// to [0, contextLens[s]) of its blocks whatever startPos and the rows (cross-attention over the
// encoder's cached keys and values, which the rows do not write). With relativeBias the score of
// query position i = startPos[s] + t and key position j is q·k * scale + bias[bucket(j - i), h]
// (T5 passes scale 1). Neither mixes with ALiBi; a non-causal call takes no sliding window.
//
// On the device: a flash-attention kernel on tensor cores for prefill tiles (f16/bf16, head sizes
// 64 and 128), and a split-K ("flash-decoding") kernel for decode rows and every other case, whose
// partial results are merged by a second pass. Scores, softmax and accumulation are fp32; the
// output is rounded once to the dtype. An fp8 cache (cacheDtype, kv_cache_dtype.h) is read as its
// codes widened to float (on the device into dtype for the tensor cores: exact), the same
// attention over the fp8-rounded keys and values.
#pragma once

#include <cstddef>
#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/kv_cache_dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct PagedAttentionParams {
  const void* q = nullptr;  // [rows, numHeads, headDim], rows qRowStride elements apart
  int64_t qRowStride = 0;
  const void* kCache = nullptr;  // [numSlots, numKvHeads, headDim] in cacheDtype
  const void* vCache = nullptr;
  void* out = nullptr;                   // [rows, numHeads, headDim], contiguous
  const int32_t* seqStarts = nullptr;    // [numSeqs + 1]; seqStarts[numSeqs] == rows
  const int32_t* startPos = nullptr;     // [numSeqs]
  const int32_t* blockTables = nullptr;  // [numSeqs, maxBlocksPerSeq]
  int64_t rows = 0, numSeqs = 0, maxBlocksPerSeq = 0;
  int64_t numHeads = 0, numKvHeads = 0, headDim = 0, blockSize = 0;
  int64_t slidingWindow = 0;  // 0: none
  float scale = 1.0f;
  // ALiBi slopes of this call's heads (this rank's, in the order of q's heads), [numHeads] fp32 in
  // the backend's memory; null: no bias.
  const float* alibiSlopes = nullptr;
  // > 0: Falcon's bias bf16(slope * j) / alibiBf16Divisor (above); 0: slope * (j - i).
  float alibiBf16Divisor = 0.0f;
  // false: no causal mask, each row sees its sequence's whole context (above).
  bool causal = true;
  // [numSeqs] in the backend's memory, each >= 0: the keys of sequence s are positions
  // [0, contextLens[s]) (requires causal = false); null: the rows' own context.
  const int32_t* contextLens = nullptr;
  // T5's bias table of this call's heads, [relativeBuckets, numHeads] fp32 in the backend's memory
  // (transformers' relative_attention_bias.weight, its columns this rank's heads); null: none.
  const float* relativeBias = nullptr;
  int32_t relativeBuckets = 0, relativeMaxDistance = 0;
  bool relativeBidirectional = false;  // true: the encoder's buckets; false: the decoder's
  // Launch shape, known on the host: the most new rows of any sequence, and the longest context
  // (startPos + new rows, or with contextLens the largest of them). Both are upper bounds; larger
  // values only cost idle blocks.
  int64_t maxNewRows = 0, maxContext = 0;
  // The fewest new rows of any sequence (0: unknown). A batch mixing prompts with decode rows
  // (chunked prefill beside running requests) takes the tensor-core kernel for the prompts and the
  // split-K kernel for the rest, instead of a 64-row tile for every one-row sequence.
  int64_t minNewRows = 0;
  DType dtype = DType::kF32;  // of q and out (and of the cache under kAuto)
  KvCacheDType cacheDtype = KvCacheDType::kAuto;
  // Device scratch for split-K partial results, zero-filled once before first use (it holds
  // arrival counters that every call leaves at zero); fewer splits when it is small.
  void* workspace = nullptr;
  size_t workspaceBytes = 0;
};

Status validatePagedAttention(const PagedAttentionParams& p);
// Host memory; the block tables and sequence arrays are read as given (no device indirection).
Status pagedAttentionReference(const PagedAttentionParams& p);
Status invokePagedAttention(const PagedAttentionParams& p, Stream stream);
// Tests only: the prompt kernels' comparison switches, each 1 (on), 0 (off) or -1 (as the
// environment says: TEXTGEN_FLASH_FOLD, TEXTGEN_FLASH_MMA_FP8), so that tests reach the variants
// a serving shard takes only when told to.
void setFlashVariantsForTesting(int fold, int mmaFp8);

}  // namespace textgen::kernels
