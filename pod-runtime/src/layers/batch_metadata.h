// One forward's batch description in backend memory, as the model runner uploads it and the layers
// read it: per row the token id, position and KV slot; per sequence its first row, first position
// and block table; the rows whose logits are wanted; per row RoPE's inverse frequencies.
#pragma once

#include <cstdint>

namespace textgen::runtime {

struct BatchMetadata {
  // The shape: eager forwards use the batch's own; a decode graph fixes it for its batch size
  // (padded rows, block tables as wide as the longest context).
  struct Layout {
    int64_t rows = 0, numSeqs = 0, maxBlocksPerSeq = 1, logitRows = 0;
    int64_t maxNewRows = 0, maxContext = 0;
    int64_t minNewRows = 0;  // the fewest new rows of any sequence (0: unknown)
    // Encoder-decoder models: the widest cross-attention block table and the longest encoder
    // output (0: no cross-attention).
    int64_t crossBlocksPerSeq = 0, maxCrossLen = 0;
  };

  const int32_t* ids = nullptr;          // [rows]
  const int32_t* positions = nullptr;    // [rows]
  const int32_t* slots = nullptr;        // [rows]; -1: padding, no KV write
  const int32_t* seqStarts = nullptr;    // [numSeqs + 1]
  const int32_t* startPos = nullptr;     // [numSeqs]
  const int32_t* blockTables = nullptr;  // [numSeqs, maxBlocksPerSeq]
  const int32_t* logitRows = nullptr;    // [logitRows]
  const float* invFreq = nullptr;        // [rows, rotaryDim / 2]
  // Encoder-decoder models: each sequence's encoder length and the blocks holding its cross keys
  // and values (ForwardBatch::cross).
  const int32_t* crossLens = nullptr;    // [numSeqs]
  const int32_t* crossTables = nullptr;  // [numSeqs, crossBlocksPerSeq]
  Layout layout;
};

}  // namespace textgen::runtime
