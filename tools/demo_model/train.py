#!/usr/bin/env python3
"""Trains textgen's bundled demo model on the GPU machine.

A Llama-architecture model of ~5M parameters with its own byte-level BPE tokenizer, trained on the
Python 3.11 documentation sources (tools/demo_model/build_corpus.sh). Every 50th document is held
out; the held-out perplexity goes into the model's README. Saved in bfloat16 (~11 MB).
Usage: train.py CORPUS_DIR OUT_DIR [--minutes 6]
"""
import argparse
import json
import math
import os
import random
import time

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM

SPECIALS = ["<unk>", "<s>", "</s>"]


def documents(path):
    text = open(os.path.join(path, "corpus.txt"), encoding="utf-8").read()
    docs = [d.split("\n", 1)[1] for d in text.split("\f")[1:] if "\n" in d]
    return [d for i, d in enumerate(docs) if i % 50 != 0], [d for i, d in enumerate(docs) if i % 50 == 0]


def train_tokenizer(docs):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])])
    return tok


def encode_all(tok, docs):
    ids = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids + [2])  # <s> ... </s> per document
    return torch.tensor(ids, dtype=torch.long)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=6.0)
    a = ap.parse_args()
    torch.manual_seed(0)
    random.seed(0)
    train_docs, held_docs = documents(a.corpus)
    tok = train_tokenizer(train_docs)
    train_ids, held_ids = encode_all(tok, train_docs).cuda(), encode_all(tok, held_docs).cuda()
    print(f"tokens: train {train_ids.numel()}, held-out {held_ids.numel()}", flush=True)
    config = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=6,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=1,
                         eos_token_id=2)
    model = LlamaForCausalLM(config).cuda()
    params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {params}", flush=True)
    seq, batch = 256, 96
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
    deadline = time.time() + a.minutes * 60
    est_steps = 3000

    def held_out_ppl():
        # Perplexity over non-overlapping held-out windows.
        model.eval()
        nll, count = 0.0, 0
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for s in range(0, held_ids.numel() - seq - 1, seq):
                x = held_ids[s:s + seq].unsqueeze(0)
                nll += model(input_ids=x, labels=x).loss.item() * (seq - 1)
                count += seq - 1
        model.train()
        return math.exp(nll / count)

    # Early stopping: the corpus is small (3M tokens), so keep the checkpoint with the best
    # held-out perplexity rather than the last one.
    best_ppl, best_state, best_step = float("inf"), None, 0
    step = 0
    model.train()
    while time.time() < deadline:
        lr = 2e-3 * min(1.0, (step + 1) / 200) * max(0.05, 0.5 * (1 + math.cos(math.pi * min(step, est_steps) / est_steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train_ids.numel() - seq - 1, (batch,), device="cuda")
        x = torch.stack([train_ids[s:s + seq] for s in starts.tolist()])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 250 == 0 and step > 0:
            ppl = held_out_ppl()
            if ppl < best_ppl:
                best_ppl, best_step = ppl, step
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            print(f"step {step} loss {loss.item():.3f} lr {lr:.2e} held-out ppl {ppl:.2f}", flush=True)
        step += 1
    model.load_state_dict(best_state)
    model.eval()
    ppl = held_out_ppl()
    print(f"steps {step}, best at step {best_step}, held-out perplexity {ppl:.2f}", flush=True)
    os.makedirs(a.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(a.out, safe_serialization=True)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
               "unk_token": "<unk>", "model_max_length": 512},
              open(os.path.join(a.out, "tokenizer_config.json"), "w"), indent=2)
    samples = []
    for prompt in ["The Python interpreter", "A list comprehension", "To open a file"]:
        ids = torch.tensor([tok.encode(prompt).ids], device="cuda")
        with torch.no_grad():
            g = model.to(torch.float32).generate(ids, max_new_tokens=40, do_sample=False)
        samples.append((prompt, tok.decode(g[0].tolist()[len(ids[0]):])))
    meta = {"parameters": params, "steps": step, "best_step": best_step, "held_out_perplexity": ppl, "train_tokens": int(train_ids.numel()),
            "held_out_tokens": int(held_ids.numel()), "samples": samples,
            "corpus_version": open(os.path.join(a.corpus, "VERSION")).read().strip()}
    json.dump(meta, open(os.path.join(a.out, "training.json"), "w"), indent=2)
    print(json.dumps(meta, indent=1), flush=True)


if __name__ == "__main__":
    main()
