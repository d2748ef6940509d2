// The tokenizer.json document that transformers (5.12, GPT2Tokenizer on the `tokenizers` backend)
// builds from a slow tokenizer's files when a checkpoint ships no tokenizer.json — Hub OPT
// checkpoints (facebook/opt-125m ... opt-66b) ship only vocab.json + merges.txt.
//
//   model          BPE(vocab.json, merges.txt), no unk token, "" prefix and suffix
//   pre_tokenizer  ByteLevel(add_prefix_space from tokenizer_config.json, default false)
//   decoder        ByteLevel
//   post_processor TemplateProcessing: [bos:0] $A:0 [eos:0], from add_bos_token / add_eos_token
//   added_tokens   tokenizer_config.json's added_tokens_decoder, then the named special tokens
//                  (bos, eos, unk, sep, pad, cls, mask; from special_tokens_map.json when there is
//                  no added_tokens_decoder), then additional_special_tokens, with transformers'
//                  flags and id assignment (a vocabulary id when the token is in vocab.json, else
//                  the next id after the vocabulary).
//
// Errors name the file: vocab.json that is not an object of token -> integer id, ids out of range
// or given twice, merges.txt lines that are not two tokens separated by one space (lines starting
// "#version" are skipped, as in `tokenizers`), merge parts or merged tokens not in vocab.json (an
// error in `tokenizers` too), text that is not UTF-8.
#pragma once

#include <string_view>

#include "json_util.h"
#include "textgen/base/status_or.h"
#include "textgen/tokenizer/tokenizer.h"

namespace textgen::tokenizer {

StatusOr<Json> gpt2TokenizerJson(const Gpt2Files& files);

}  // namespace textgen::tokenizer
