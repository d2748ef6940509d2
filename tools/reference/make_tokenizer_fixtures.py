#!/usr/bin/env python3
"""Writes textgen's tokenizer reference fixtures.

Trains small tokenizers of each family with Hugging Face `tokenizers` (and `sentencepiece` for the
T5-style Precompiled charsmap), then records what Hugging Face produces for a few hundred strings:
ids (with and without special tokens), tokens, byte offsets, and decodes (skipping special tokens or
not), plus decodes of random id sequences. The C++ tokenizer must reproduce all of it exactly.

Encoding follows TGI's router: tokenizer.json as `tokenizers` loads it, with TGI's one override — for
tokenizer_class LlamaTokenizer(Fast), the post-processor is rebuilt from tokenizer_config.json's
add_bos_token / add_eos_token (see llama_post_processor below).

Run where `tokenizers` and `sentencepiece` are installed (the GPU machine):
    python3 tools/reference/make_tokenizer_fixtures.py OUT_DIR [FAMILIES]
The "opt-slow" family (vocab.json + merges.txt without tokenizer.json, converted by transformers'
AutoTokenizer) also needs transformers and the "opt" family's tokenizer.json in OUT_DIR; on this CPU:
    bash tools/reference/sid-python.sh tools/reference/make_tokenizer_fixtures.py \
        tests/reference/tokenizers opt-slow
FAMILIES (comma-separated) rebuilds only those; meta.json keeps the other families' entries.
Writes OUT_DIR/<family>/{tokenizer.json,tokenizer_config.json,cases.jsonl,decode_random.jsonl}
(opt-slow: vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json, config.json
instead of the first two) and OUT_DIR/meta.json. Deterministic for a given tokenizers/sentencepiece version.
"""
import json
import os
import random
import sys
import tempfile
import traceback
import zlib

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

SEED = 20261121

# ------------------------------------------------------------------------------------------------
# Text: training corpus and test strings

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "A tokenizer turns text into a sequence of integers that a model can read.",
    "Continuous batching keeps the accelerator busy while requests come and go.",
    "She sells sea shells by the sea shore, and the shells she sells are surely seashells.",
    "In 1969, two astronauts walked on the Moon while a third orbited above them.",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "Please return the form by Friday; late submissions won't be accepted.",
    "The server answered with status 429 because the queue was full.",
    "Kubernetes schedules pods onto nodes according to their resource requests.",
    "Paged attention stores keys and values in fixed-size blocks of memory.",
    "They'll arrive at 10:30 tomorrow, if the weather doesn't change.",
    "Is this the real life? Is this just fantasy?",
    "Mathematics is the language in which the universe is written.",
    "We measured 3.5 GB/s of throughput, about 92% of the expected peak.",
    "Don't count your chickens before they hatch!",
    "The library's new wing opened on the 3rd of March, 2024.",
    "Hello, world! Hello again, world.",
    "An apple a day keeps the doctor away, or so they say.",
    "Rain fell softly on the roof as the city slept.",
    "He said: \"I'm not sure we're ready,\" and then he left.",
]

CODE = [
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += x[i] * y[i];\n}\n",
    "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size(); }\n",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;",
    "{\"model\": \"llama\", \"max_new_tokens\": 20, \"stop\": [\"\\n\"]}",
    "if x is None:\n        raise ValueError('x must be set')\n",
    "const f = async (url) => { const r = await fetch(url); return r.json(); };",
    "    # indented comment with trailing spaces   \n",
    "fn main() {\n    println!(\"{}\", 42);\n}\n",
    "<div class=\"row\"><span>text</span></div>",
    "x = [i ** 2 for i in range(10) if i % 2 == 0]",
    "kubectl apply -f manifests/examples/llama.yaml --namespace=serving",
]

WHITESPACE = [
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "a  b", "a\t\tb", "   leading",
    "trailing   ", "line1\nline2\r\nline3", "tabs\tand\tspaces  mixed \t\n", "a \n\n\n b",
    "    four spaces", "\t\tdouble tab", "word\n", "\n\nparagraph\n\n", "  \t  \n  ",
]

EMOJI = [
    "😀", "👍🏽", "👨‍👩‍👧‍👦 family", "🇫🇷🇩🇪", "❤️", "🏳️‍🌈", "emoji at end 🎉", "😀😃😄😁",
    "1️⃣ keycap", "I ❤ NY", "🤖 robots 🤖 everywhere", "mixed 😀text😃here",
]

SCRIPTS = [
    "中文分词测试", "日本語のテキストです。", "한국어 문장입니다", "混合 mixed 文本 text",
    "全角ＡＢＣ１２３", "مرحبا بالعالم", "שלום עולם", "العربية 123 English", "Привет, мир!",
    "Ελληνικά γράμματα", "ΣΊΣΥΦΟΣ", "हिन्दी पाठ", "ภาษาไทย", "Tiếng Việt có dấu",
    "Straße", "İstanbul", "ǅemal", "ﬁnancial ﬂow", "Ⅻ roman", "x² superscript", "½ fraction",
    "ｶﾀｶﾅ halfwidth", "𝐀𝐁𝐂 math bold", "𝄞 music", "𐍈 gothic", "⠁⠃⠉ braille",
]

COMBINING = [
    "e\u0301", "Cafe\u0301", "n\u0303o", "Z\u0335\u0321a\u0336l\u0337g\u0338o\u0334",
    "\u0041\u030a vs \u00c5", "a\u0308\u0301", "\u1e9b\u0323", "\u00a0nbsp", "zero\u200bwidth",
    "soft\u00adhyphen", "\ufeffBOM start", "line\u2028separator", "private\ue000use",
    "replacement\ufffdchar", "ctrl\x01\x1fchars", "nul\x00byte",
]

DIGITS = [
    "1234567890", "3.14159", "1,000,000", "phone 555-0123", "2026-11-21T11:12:13Z",
    "0x1F 0b1010 1e-5", "٣٤٥ arabic-indic", "１２３ fullwidth", "v1.2.3-rc4", "12345678901234567890",
    "a1b2c3", "99 bottles", "$100.00 €50 ¥1000 £20", "50%",
]

LONG = [
    "a" * 300,
    "supercalifragilisticexpialidocious" * 8,
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "ab" * 250,
    "https://example.com/a/very/long/path/with/many/segments?query=string&and=more#fragment",
    "x" * 1000,
    "Lorem ipsum dolor sit amet, " * 40,
]

SPECIAL_INLINE = [
    "Hello<|endoftext|>world", "<|endoftext|>", "<s>Hello</s>", "<s> <s>", "</s>",
    "text <mask> text", "before<mask>after", "[CUSTOM] word", "x[CUSTOM]y", "a [CUSTOM]",
    "<|begin_of_text|>hi<|eot_id|>", "<extra_id_0> fill", "<pad><pad>", "<unk>",
    "say hello world now", " custom custom", "<sep>  after sep", "[CLS] [SEP]",
    "<|im_start|>user\nHi<|im_end|>",
]

BYTE_LOOKALIKE = ["<0x41>", "<0xE2><0x96><0x81>", "<0x00>", "<0xZZ>", "<0x4>", "<0x0A>text"]

MISC = [
    "", "mixed CASE Words", "ALL CAPS SHOUTING", "I'm you're we've they'll he'd it's",
    "don't CAN'T Won't", "email@example.com", "#hashtag @mention", "quotes “smart” ‘single’ «guillemets»",
    "math ∑∫√∞ ≤≥≠", "arrows ←→↑↓", "box ┌─┐", "tab\tseparated\tvalues", "CSV,comma,separated",
    "multiple!!! punctuation??? ...", "—em dash– en dash", "ellipsis…", "(parens) [brackets] {braces}",
    "a.b.c", "U.S.A.", "'quoted'", "\"double\"", "end.", "?", "!!", "...",
]

FIXED_CASES = (PROSE + CODE + WHITESPACE + EMOJI + SCRIPTS + COMBINING + DIGITS + LONG +
               SPECIAL_INLINE + BYTE_LOOKALIKE + MISC)


def random_cases(rng, count):
    pieces = [p for group in (PROSE, CODE, WHITESPACE, EMOJI, SCRIPTS, COMBINING, DIGITS,
                              SPECIAL_INLINE, BYTE_LOOKALIKE, MISC) for p in group]
    alphabet = "abcXYZ019 \t\n.,;'\"!?-_/\\()[]{}<>é中😀\u0301\u200dΣİß"
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.6:
                p = rng.choice(pieces)
                start = rng.randint(0, max(0, len(p) - 1))
                parts.append(p[start:start + rng.randint(1, 40)])
            else:
                parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))))
        out.append("".join(parts))
    return out


def training_corpus(rng):
    lines = []
    for _ in range(60):
        lines.extend(PROSE)
    for _ in range(20):
        lines.extend(CODE)
    lines.extend(SCRIPTS * 5)
    lines.extend(DIGITS * 5)
    words = " ".join(PROSE).split()
    for _ in range(3000):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 15))))
    # Emoji and most combining marks stay out of training: byte fallback / unk must handle them.
    return lines


# ------------------------------------------------------------------------------------------------
# Families

GPT2_SPECIALS = ["<|endoftext|>"]
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def as_json(tok):
    return json.loads(tok.to_str())


def from_json(obj):
    return Tokenizer.from_str(json.dumps(obj, ensure_ascii=False))


def merges_as_strings(obj):
    """Rewrites BPE merges into the legacy "a b" string format (both formats must load)."""
    merges = obj["model"]["merges"]
    if merges and isinstance(merges[0], list):
        obj["model"]["merges"] = [" ".join(m) for m in merges]
    return obj


def train_gpt2(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=GPT2_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True),
                            AddedToken("<sep>", rstrip=True, special=True)])
    tok.add_tokens([AddedToken("[CUSTOM]", single_word=True),
                    AddedToken(" hello world", normalized=False)])
    return from_json(merges_as_strings(as_json(tok)))


def gpt2_config():
    return {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "model_max_length": 1024}


def gpt2_split_variant(gpt2, variant):
    obj = as_json(gpt2)
    if variant == "a":
        splits = [
            {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Split", "pattern": {"Regex": "\\d"}, "behavior": "Contiguous", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[,.;]"}, "behavior": "MergedWithPrevious",
             "invert": False},
        ]
    else:
        splits = [
            {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Removed", "invert": False},
            {"type": "Split", "pattern": {"Regex": "\\p{L}+"}, "behavior": "Isolated", "invert": True},
            {"type": "Digits", "individual_digits": False},
            {"type": "Punctuation", "behavior": "Contiguous"},
        ]
    obj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": splits + [
        {"type": "ByteLevel", "add_prefix_space": variant == "b", "trim_offsets": True,
         "use_regex": False}]}
    return from_json(obj)


def train_llama_bpe(corpus):
    """The BPE model shared by the Llama-2-style families: byte tokens, byte_fallback, fuse_unk."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=2500, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    obj = as_json(tok)
    # As in Llama's tokenizer.json, byte tokens are vocabulary, not added tokens.
    obj["added_tokens"] = [t for t in obj["added_tokens"] if not t["content"].startswith("<0x")]
    return obj


def llama_decoder():
    return {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def llama2_legacy(base):
    obj = json.loads(json.dumps(base))
    obj["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    obj["pre_tokenizer"] = None
    obj["decoder"] = llama_decoder()
    # tokenizer.json adds only <s>; tokenizer_config asks for <s> and </s>: TGI's override wins.
    obj["post_processor"] = {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "<s>", "type_id": 1}},
                                      {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    tok = from_json(obj)
    tok.add_special_tokens([AddedToken("<|im_start|>", normalized=False, special=True),
                            AddedToken("<|im_end|>", normalized=False, special=True)])
    tok.add_tokens([AddedToken("▁custom", normalized=True)])
    return tok


def llama2_config():
    return {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True, "add_eos_token": True,
            "bos_token": {"content": "<s>", "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "__type": "AddedToken"},
            "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None, "legacy": True,
            "model_max_length": 4096}


def mistral_metaspace(base):
    obj = json.loads(json.dumps(base))
    obj["normalizer"] = None
    obj["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                            "split": False}
    obj["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                      "split": False}
    obj["post_processor"] = {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                      {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return from_json(obj)


def mistral_config():
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}


def train_llama3(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    obj = as_json(tok)
    obj["model"]["ignore_merges"] = True
    return from_json(obj)


def llama3_config():
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>", "model_max_length": 131072}


def train_spm(corpus, workdir, name, **kwargs):
    import sentencepiece as spm
    prefix = os.path.join(workdir, name)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_prefix=prefix,
                                   model_type="unigram", minloglevel=2, hard_vocab_limit=False,
                                   **kwargs)
    from sentencepiece import sentencepiece_model_pb2 as sp_pb2
    proto = sp_pb2.ModelProto()
    with open(prefix + ".model", "rb") as f:
        proto.ParseFromString(f.read())
    return proto


def t5_unigram(corpus, workdir):
    proto = train_spm(corpus, workdir, "t5", vocab_size=1200, normalization_rule_name="nmt_nfkc",
                      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=0.9995)
    vocab = [(p.piece, p.score) for p in proto.pieces]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([
        normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap),
        normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)])
    tok.add_special_tokens(["<pad>", "</s>", "<unk>", AddedToken("<extra_id_0>", special=True)])
    return tok


def t5_config():
    return {"tokenizer_class": "T5Tokenizer", "eos_token": "</s>", "unk_token": "<unk>",
            "pad_token": "<pad>", "model_max_length": 512}


def unigram_byte_fallback(corpus, workdir):
    proto = train_spm(corpus, workdir, "ubf", vocab_size=1200, normalization_rule_name="identity",
                      byte_fallback=True, pad_id=-1, unk_id=0, bos_id=1, eos_id=2,
                      character_coverage=0.98)
    vocab = [(p.piece, p.score) for p in proto.pieces]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(),
                                           normalizers.Replace("``", "\""),
                                           normalizers.Strip(left=False, right=True)])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    obj = as_json(tok)
    obj["decoder"] = llama_decoder()
    tok = from_json(obj)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B </s>",
        special_tokens=[("<s>", 1), ("</s>", 2)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tok


def ubf_config():
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>"}


def train_wordlevel(corpus):
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(), normalizers.NFC()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True)])
    trainer = trainers.WordLevelTrainer(vocab_size=3000, special_tokens=["[UNK]", "[CLS]", "[SEP]"],
                                        show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return tok


def wordlevel_ws(wordlevel):
    obj = as_json(wordlevel)
    obj["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": True}, {"type": "NFKD"},
        {"type": "Lowercase"}]}
    obj["pre_tokenizer"] = {"type": "Whitespace"}
    return from_json(obj)


def wordlevel_config():
    return {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "cls_token": "[CLS]",
            "sep_token": "[SEP]"}


def train_bpe_suffix(corpus):
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##",
                               end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["[UNK]"],
                                  continuing_subword_prefix="##", end_of_word_suffix="</w>",
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    return tok


# ------------------------------------------------------------------------------------------------
# Recording

# ------------------------------------------------------------------------------------------------
# Decoder-only families beyond Llama (issue 15). Each mirrors the structure of that family's published
# tokenizer.json (normalizer, pre-tokenizer, post-processor, special tokens), trained small.

def train_byte_level(corpus, specials, pre_tokenizer, normalizer=None, post_processor=None):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = post_processor or processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok


def train_gpt_neox(corpus):
    """EleutherAI/gpt-neox-20b (Pythia, MPT): NFC, byte-level with GPT-2's regex."""
    return train_byte_level(corpus, ["<|endoftext|>", "<|padding|>"],
                            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                            normalizer=normalizers.NFC())


def gpt_neox_config():
    return {"tokenizer_class": "GPTNeoXTokenizer", "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "add_bos_token": False,
            "add_eos_token": False, "model_max_length": 2048}


def train_bloom(corpus):
    """bigscience/bloom: a Split on BLOOM's regex, then byte-level without the GPT-2 regex."""
    split = pre_tokenizers.Split(Regex(" ?[^(\\s|[.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c])]+"),
                                 behavior="isolated", invert=False)
    pre = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                   use_regex=False)])
    return train_byte_level(corpus, ["<unk>", "<s>", "</s>", "<pad>"], pre)


def bloom_config():
    return {"tokenizer_class": "BloomTokenizer", "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": 2048}


FALCON_SPECIALS = [">>TITLE<<", ">>ABSTRACT<<", ">>INTRODUCTION<<", ">>SUMMARY<<", ">>COMMENT<<",
                   ">>ANSWER<<", ">>QUESTION<<", ">>DOMAIN<<", ">>PREFIX<<", ">>SUFFIX<<",
                   ">>MIDDLE<<", "<|endoftext|>"]


def train_falcon(corpus):
    """tiiuae/falcon-7b: punctuation, byte-level, digits, then runs of three digits isolated."""
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Punctuation(behavior="contiguous"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated", invert=False),
    ])
    return train_byte_level(corpus, FALCON_SPECIALS, pre)


def falcon_config():
    return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
            "model_max_length": 2048}


def train_opt(corpus):
    """facebook/opt-*: GPT-2's byte-level BPE whose encodings start with </s> (OPT's BOS)."""
    tok = train_byte_level(corpus, ["<s>", "<pad>", "</s>", "<unk>"],
                           pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    bos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="</s>:0 $A:0", pair="</s>:0 $A:0 $B:1", special_tokens=[("</s>", bos)])
    return tok


def opt_config():
    return {"tokenizer_class": "GPT2Tokenizer", "bos_token": "</s>", "eos_token": "</s>",
            "unk_token": "</s>", "pad_token": "<pad>", "add_bos_token": True, "model_max_length": 2048}


STARCODER_SPECIALS = ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
                      "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>",
                      "<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>",
                      "<empty_output>", "<commit_before>", "<commit_msg>", "<commit_after>",
                      "<reponame>"]


def train_starcoder(corpus):
    """bigcode/starcoder: single digits, then byte-level with GPT-2's regex."""
    pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return train_byte_level(corpus, STARCODER_SPECIALS, pre)


def starcoder_config():
    return {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "model_max_length": 8192}


def config_token(config, key):
    value = config.get(key)
    if isinstance(value, dict):
        return value.get("content")
    return value


def llama_post_processor(tok, config):
    """TGI's router override for LlamaTokenizer(Fast): a TemplateProcessing built from
    add_bos_token (default true) and add_eos_token (default false)."""
    add_bos = config.get("add_bos_token", True)
    add_eos = config.get("add_eos_token", False)
    bos, eos = config_token(config, "bos_token"), config_token(config, "eos_token")
    single, pair, specials = [], [], []
    if add_bos:
        specials.append((bos, tok.token_to_id(bos)))
        single.append(f"{bos}:0")
        pair.append(f"{bos}:0")
    single.append("$A:0")
    pair.append("$A:0")
    if add_eos:
        specials.append((eos, tok.token_to_id(eos)))
        single.append(f"{eos}:0")
        pair.append(f"{eos}:0")
    if add_bos:
        pair.append(f"{bos}:1")
    pair.append("$B:1")
    if add_eos:
        pair.append(f"{eos}:1")
    return processors.TemplateProcessing(single=" ".join(single), pair=" ".join(pair),
                                         special_tokens=specials)


def byte_offsets(text, char_offsets):
    starts = [0]
    for ch in text:
        starts.append(starts[-1] + len(ch.encode("utf-8")))
    return [[starts[s], starts[e]] for s, e in char_offsets]


def record(name, tok, config, cases, outdir, rng):
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    # What textgen loads is the saved file; record against exactly that, with TGI's override.
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    if config.get("tokenizer_class") in ("LlamaTokenizer", "LlamaTokenizerFast"):
        tok.post_processor = llama_post_processor(tok, config)
    return record_cases(d, tok, cases, rng)


def record_cases(d, tok, cases, rng):
    """Writes d/cases.jsonl and d/decode_random.jsonl from a `tokenizers` Tokenizer (what TGI's router
    encodes and decodes with)."""
    with open(os.path.join(d, "cases.jsonl"), "w", encoding="utf-8") as f:
        for text in cases:
            enc = tok.encode(text, add_special_tokens=True)
            plain = tok.encode(text, add_special_tokens=False)
            row = {
                "text": text,
                "ids": enc.ids,
                "tokens": enc.tokens,
                "offsets": byte_offsets(text, enc.offsets),
                "ids_no_special": plain.ids,
                "offsets_no_special": byte_offsets(text, plain.offsets),
                "decode": tok.decode(enc.ids, skip_special_tokens=False),
                "decode_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
            }
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    with open(os.path.join(d, "decode_random.jsonl"), "w", encoding="utf-8") as f:
        for _ in range(60):
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 24))]
            row = {"ids": ids, "decode": tok.decode(ids, skip_special_tokens=False),
                   "decode_skip_special": tok.decode(ids, skip_special_tokens=True)}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(cases)


def opt_slow_token(content):
    return {"content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": True, "__type": "AddedToken"}


def record_opt_slow(outdir, cases, rng):
    """facebook/opt-*'s files without tokenizer.json: vocab.json + merges.txt (the trained "opt"
    family's vocabulary and merges), tokenizer_config.json and special_tokens_map.json shaped as
    facebook/opt-125m's (no tokenizer_class: AutoTokenizer picks GPT2Tokenizer from config.json's
    model_type "opt"; </s> as bos, eos and unk, <pad>, add_bos_token). Recorded with the backend
    tokenizer that transformers' AutoTokenizer builds from that directory. Needs transformers
    (tools/reference/sid-python.sh) and OUT_DIR/opt/tokenizer.json."""
    from transformers import AutoTokenizer
    src = json.load(open(os.path.join(outdir, "opt", "tokenizer.json"), encoding="utf-8"))
    d = os.path.join(outdir, "opt-slow")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(src["model"]["vocab"], f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for m in src["model"]["merges"]:
            f.write((m if isinstance(m, str) else " ".join(m)) + "\n")
    config = {"errors": "replace", "unk_token": opt_slow_token("</s>"),
              "bos_token": opt_slow_token("</s>"), "eos_token": opt_slow_token("</s>"),
              "pad_token": opt_slow_token("<pad>"), "add_prefix_space": False, "add_bos_token": True,
              "special_tokens_map_file": None, "name_or_path": "patrickvonplaten/opt-30b"}
    special_map = {k: {f: v for f, v in config[k].items() if f != "__type"}
                   for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    for name, obj in (("tokenizer_config.json", config), ("special_tokens_map.json", special_map),
                      ("config.json", {"architectures": ["OPTForCausalLM"], "model_type": "opt"})):
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=2)
    auto = AutoTokenizer.from_pretrained(d)
    assert type(auto).__name__ == "GPT2Tokenizer", type(auto).__name__
    tok = auto.backend_tokenizer
    return record_cases(d, tok, cases, rng), tok.get_vocab_size(True)


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    outdir = sys.argv[1]
    only = set(sys.argv[2].split(",")) if len(sys.argv) == 3 else None
    os.makedirs(outdir, exist_ok=True)
    rng = random.Random(SEED)
    corpus = training_corpus(rng)
    cases = FIXED_CASES + random_cases(rng, 150)
    workdir = tempfile.mkdtemp()
    meta = {"tokenizers": tokenizers.__version__, "seed": SEED, "cases": len(cases), "families": {}}
    try:
        import sentencepiece
        meta["sentencepiece"] = sentencepiece.__version__
    except ImportError:
        pass

    built = {}

    def family(name, build, config):
        if only is not None and name not in only:
            return
        try:
            tok = build()
            built[name] = tok
            n = record(name, tok, config, cases, outdir, random.Random(zlib.crc32(name.encode()) ^ SEED))
            meta["families"][name] = {"cases": n, "vocab": tok.get_vocab_size(True)}
            print(f"{name}: {n} cases, vocab {tok.get_vocab_size(True)}")
        except Exception:  # keep the other families
            traceback.print_exc()
            meta["families"][name] = {"error": traceback.format_exc(limit=3)}

    family("gpt2", lambda: train_gpt2(corpus), gpt2_config())
    if "gpt2" in built:
        family("gpt2-splits-a", lambda: gpt2_split_variant(built["gpt2"], "a"), gpt2_config())
        family("gpt2-splits-b", lambda: gpt2_split_variant(built["gpt2"], "b"), gpt2_config())
    llama_base = None
    try:
        llama_base = train_llama_bpe(corpus)
    except Exception:
        traceback.print_exc()
    if llama_base is not None:
        family("llama2", lambda: llama2_legacy(llama_base), llama2_config())
        family("mistral", lambda: mistral_metaspace(llama_base), mistral_config())
    family("llama3", lambda: train_llama3(corpus), llama3_config())
    family("t5", lambda: t5_unigram(corpus, workdir), t5_config())
    family("unigram-byte-fallback", lambda: unigram_byte_fallback(corpus, workdir), ubf_config())
    family("wordlevel", lambda: train_wordlevel(corpus), wordlevel_config())
    if "wordlevel" in built:
        family("wordlevel-whitespace", lambda: wordlevel_ws(built["wordlevel"]), wordlevel_config())
    family("bpe-suffix", lambda: train_bpe_suffix(corpus), {"unk_token": "[UNK]"})
    family("gpt-neox", lambda: train_gpt_neox(corpus), gpt_neox_config())
    family("bloom", lambda: train_bloom(corpus), bloom_config())
    family("falcon", lambda: train_falcon(corpus), falcon_config())
    family("opt", lambda: train_opt(corpus), opt_config())
    family("starcoder", lambda: train_starcoder(corpus), starcoder_config())
    if only is None or "opt-slow" in only:
        try:
            import transformers
            n, vocab = record_opt_slow(outdir, cases, random.Random(zlib.crc32(b"opt-slow") ^ SEED))
            meta["families"]["opt-slow"] = {"cases": n, "vocab": vocab,
                                            "transformers": transformers.__version__}
            print(f"opt-slow: {n} cases, vocab {vocab}")
        except Exception:
            traceback.print_exc()
            meta["families"]["opt-slow"] = {"error": traceback.format_exc(limit=3)}

    if only is not None:  # keep the families not rebuilt
        path = os.path.join(outdir, "meta.json")
        if os.path.exists(path):
            old = json.load(open(path))
            for k, v in old.get("families", {}).items():
                if k not in only:
                    meta["families"][k] = v

    with open(os.path.join(outdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
    failed = [k for k, v in meta["families"].items() if "error" in v]
    print("failed families:", failed or "none")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
