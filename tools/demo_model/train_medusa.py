#!/usr/bin/env python3
"""Trains Medusa heads for textgen's bundled demo model on the GPU machine.

Medusa-1 (Cai et al. 2024): the demo model stays frozen, and head i learns the token i + 2 positions
ahead from its final normed hidden state. Self-distillation: the heads learn the model's own greedy
continuations of prompts from the training documents (every 50th document is held out, as in
train.py), with plain corpus windows for a third of the batches. Written in Text Generation
Inference's Medusa layout (medusa_lm_head.safetensors, config.json naming ../demo), so that
`--model-id OUT_DIR` serves the demo model with the heads. With --reference, also writes the heads'
float32 argmax and margins over three short greedy sequences, for the C++ runtime's test.
Usage: train_medusa.py CORPUS_DIR DEMO_DIR OUT_DIR [--heads 4] [--minutes 5] [--reference REF_JSON]
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import documents, encode_all  # noqa: E402  (the demo model's own split and encoding)

SEQ, EOS = 256, 2
GEN_BATCH, MAX_SEQUENCES, HELD_SEQUENCES = 512, 20480, 384
BATCH, LR = 64, 1e-3
PROMPTS = ["The Python interpreter", "def main():\n    return", "A list comprehension"]


class Heads(torch.nn.Module):
    """TGI's MedusaHeadV1 with medusa_num_layers = 1: head i gives U_i (x + SiLU(W_i x + b_i))."""

    def __init__(self, n, lm_head):
        super().__init__()
        vocab, hidden = lm_head.shape
        self.n = n
        self.linear = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(n))
        self.out = torch.nn.ModuleList(torch.nn.Linear(hidden, vocab, bias=False) for _ in range(n))
        with torch.no_grad():  # Medusa's init: the ResBlock is the identity, U_i the base lm_head
            for lin, out in zip(self.linear, self.out):
                lin.weight.zero_()
                lin.bias.zero_()
                out.weight.copy_(lm_head.float())

    def forward(self, x, i):
        return self.out[i](x + F.silu(self.linear[i](x)))

    def tensors(self):
        t = {}
        for i in range(self.n):
            t[f"{i}.0.linear.weight"] = self.linear[i].weight
            t[f"{i}.0.linear.bias"] = self.linear[i].bias
            t[f"{i}.1.weight"] = self.out[i].weight
        return {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in t.items()}


def load_model(path, dtype, device):
    # Loading in the stored dtype and converting keeps clear of torch_dtype= vs dtype= (4.x vs 5.x).
    model = LlamaForCausalLM.from_pretrained(path).to(device=device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@torch.no_grad()
def hidden(model, x):
    # transformers' LlamaModel applies the final RMSNorm before returning last_hidden_state.
    return model.model(input_ids=x, use_cache=False).last_hidden_state.float()


@torch.no_grad()
def greedy(model, x, total):
    """Continues x [B, L] greedily to `total` tokens with the KV cache. EOS is never chosen (as with
    min_new_tokens), so every row runs to full length."""
    out = model(input_ids=x, use_cache=True)
    seq, new = [x], total - x.shape[1]
    for n in range(new):
        logits = out.logits[:, -1].float().clone()
        logits[:, EOS] = -float("inf")
        nxt = logits.argmax(-1, keepdim=True)
        seq.append(nxt)
        if n + 1 < new:
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return torch.cat(seq, 1)


def distill(model, ids, count, batch, gen, seconds, label):
    """Greedy continuations to SEQ tokens of random 32..96-token windows of ids; returns the sequences
    [N, SEQ] and where each one's continuation starts. Stops at `count` or after `seconds`."""
    xs, starts, n = [], [], 0
    t0 = last = time.time()
    while n < count and (n == 0 or time.time() - t0 < seconds):
        b = min(batch, count - n)
        plen = int(torch.randint(32, 97, (1,), generator=gen))
        s = torch.randint(0, ids.numel() - plen, (b,), generator=gen)
        prompt = ids[(s[:, None] + torch.arange(plen)[None]).to(ids.device)]
        xs.append(greedy(model, prompt, SEQ))
        starts.append(torch.full((b,), plen, dtype=torch.long, device=ids.device))
        n += b
        if time.time() - last >= 30:
            print(f"{label}: {n} sequences, {time.time() - t0:.0f} s", flush=True)
            last = time.time()
    print(f"{label}: {n} sequences in {time.time() - t0:.0f} s", flush=True)
    return torch.cat(xs), torch.cat(starts)


def loss_fn(heads, h, x, start):
    # Head i at position t predicts x[t + i + 2]; only targets at or after `start` count.
    total, T = 0.0, x.shape[1]
    for i in range(heads.n):
        logits = heads(h[:, :T - i - 2], i)
        mask = (torch.arange(i + 2, T, device=x.device)[None] >= start[:, None]).float()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, i + 2:].reshape(-1), reduction="none")
        total = total + 0.8 ** i * (ce.view_as(mask) * mask).sum() / mask.sum().clamp(min=1)
    return total


@torch.no_grad()
def evaluate(heads, held, lm_head):
    """Held-out top-1 per head over continuation targets, and what greedy verification would accept:
    per position, the number of leading heads that are all right, and a walk through each sequence
    taking 1 + accepted tokens per step."""
    x, start, h = held
    N, T, n = x.shape[0], x.shape[1], heads.n
    match = torch.zeros(N, n, T, dtype=torch.bool, device=x.device)
    base = torch.zeros(N, T, dtype=torch.bool, device=x.device)
    for c in range(0, N, 64):
        hc, xc = h[c:c + 64], x[c:c + 64]
        base[c:c + 64, :T - 1] = (hc[:, :T - 1] @ lm_head.T).argmax(-1) == xc[:, 1:]
        for i in range(n):
            match[c:c + 64, i, :T - i - 2] = heads(hc[:, :T - i - 2], i).argmax(-1) == xc[:, i + 2:]
    pos = torch.arange(T, device=x.device)[None]
    top1 = []
    for i in range(n):
        m = (pos + i + 2 >= start[:, None]) & (pos + i + 2 < T)
        top1.append(match[:, i][m].float().mean().item())
    m = (pos + 1 >= start[:, None]) & (pos + 1 < T)
    lm_top1 = base[m].float().mean().item()
    accepted = match.long().cumprod(1).sum(1)  # [N, T]
    m = (pos + 1 >= start[:, None]) & (pos + n + 1 < T)
    per_position = accepted[m].float().mean().item()
    steps = tokens = 0
    acc, st = accepted.tolist(), start.tolist()
    for b in range(N):
        t = st[b] - 1  # the step that produces the first continuation token
        while t + n + 1 < T:
            a = acc[b][t]
            steps, tokens, t = steps + 1, tokens + 1 + a, t + 1 + a
    return {"top1": top1, "lm_head_top1": lm_top1, "accepted_per_position": per_position,
            "tokens_per_step": tokens / max(steps, 1)}


def head_logits(t, i, h):
    return F.linear(h + F.silu(F.linear(h, t[f"{i}.0.linear.weight"], t[f"{i}.0.linear.bias"])), t[f"{i}.1.weight"])


def write_reference(path, demo, out, tok, n):
    """float32 reference on the CPU: the saved bfloat16 heads and the base model, both cast to float32."""
    t = {k: v.float() for k, v in load_file(os.path.join(out, "medusa_lm_head.safetensors")).items()}
    base = load_model(demo, torch.float32, "cpu")
    seqs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok.encode(prompt).ids  # adds <s>
            for _ in range(20):
                nxt = int(base(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].argmax())
                ids.append(nxt)
                if nxt == EOS:
                    break
            h = hidden(base, torch.tensor([ids]))[0]
            argmax, margin = [[] for _ in ids], [[] for _ in ids]
            for i in range(n):
                top = head_logits(t, i, h).topk(2, dim=-1)
                for p in range(len(ids)):
                    argmax[p].append(int(top.indices[p, 0]))
                    margin[p].append(round(float(top.values[p, 0] - top.values[p, 1]), 6))
            seqs.append({"prompt": prompt, "ids": ids, "argmax": argmax, "margin": margin})
    ref = {"heads": n, "dtype": "float32", "transformers": transformers.__version__, "torch": torch.__version__,
           "sequences": seqs}
    # One line per position keeps the file small and readable.
    rows = lambda v: "[\n    " + ",\n    ".join(json.dumps(r) for r in v) + "]"  # noqa: E731
    body = ",\n".join('  {"prompt": %s,\n   "ids": %s,\n   "argmax": %s,\n   "margin": %s}'
                      % (json.dumps(s["prompt"]), json.dumps(s["ids"]), rows(s["argmax"]), rows(s["margin"]))
                      for s in seqs)
    top = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in ref.items() if k != "sequences")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("{\n" + top + ',\n "sequences": [\n' + body + "]\n}\n")
    json.load(open(path))  # must parse
    print(f"reference: {path} ({len(seqs)} sequences, {sum(len(s['ids']) for s in seqs)} positions)", flush=True)


def write_card(out, a, meta, corpus_version):
    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    acc = ", ".join(f"head {i} (token t+{i + 2}) {pct(v)}" for i, v in enumerate(meta["held_out_top1"]))
    text = f"""# textgen demo model: Medusa heads

{a.heads} Medusa heads (Cai et al. 2024, "Medusa-1": the base model is frozen) for textgen's demo model,
in Text Generation Inference's layout: `config.json` names the base model (`../demo`), and
`medusa_lm_head.safetensors` holds head i as a ResBlock `{{i}}.0.linear` (x + SiLU(W x + b)) and an
output projection `{{i}}.1`, in bfloat16. `--model-id` this folder serves the demo model with the heads
proposing tokens. Like the demo model, it is a fixture for speculative decoding, not an assistant.

| | |
| --- | --- |
| heads | {a.heads} × (ResBlock {meta['hidden_size']}×{meta['hidden_size']} + bias, output {meta['vocab_size']}×{meta['hidden_size']}), {meta['parameters']:,} parameters (bfloat16) |
| training data | self-distillation: {meta['sequences']:,} greedy continuations by the demo model (EOS never chosen) of 32..96-token windows of its training documents, to {SEQ} tokens; plain {SEQ}-token corpus windows for a third of the batches |
| corpus | the reStructuredText sources of the Python 3.11 documentation, Debian 12 package `python3.11-doc` {corpus_version} (as for the demo model) |
| licence of the corpus | Python Software Foundation License Version 2 (see the package's copyright file; `tools/demo_model/build_corpus.sh` copies it next to the corpus) |
| held-out data | {meta['held_out_sequences']} greedy continuations of windows of the held-out documents (every 50th) |
| held-out top-1 | {acc} (the base lm_head itself: {pct(meta['held_out_lm_head_top1'])}) |
| greedy verification | {meta['accepted_per_position']:.2f} proposals accepted per step (mean over positions); walking the held-out continuations, {meta['tokens_per_step']:.2f} tokens per step |
| training | `tools/demo_model/train_medusa.py` on one {meta['device']}, {a.minutes:g} minutes, {meta['steps']} steps (best at step {meta['best_step']}), AdamW lr {LR:g} with cosine decay, batch {BATCH} × {SEQ} tokens, loss Σ 0.8^i CE_i, float32 heads on the base model's bfloat16 hidden states, transformers {transformers.__version__} / torch {torch.__version__} |

Regenerate: `tools/demo_model/build_corpus.sh .demo` here, then on the GPU machine
`python3 tools/demo_model/train_medusa.py .demo models/demo OUT --heads {a.heads} --minutes {a.minutes:g}` and copy OUT
to a folder beside `models/demo` (config.json names `../demo`).
"""
    open(os.path.join(out, "README.md"), "w").write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("demo")
    ap.add_argument("out")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--reference", default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    random.seed(0)
    gen = torch.Generator().manual_seed(0)
    model = load_model(a.demo, torch.bfloat16, "cuda")
    tok = Tokenizer.from_file(os.path.join(a.demo, "tokenizer.json"))
    train_docs, held_docs = documents(a.corpus)
    train_ids, held_ids = encode_all(tok, train_docs).cuda(), encode_all(tok, held_docs).cuda()
    print(f"tokens: train {train_ids.numel()}, held-out {held_ids.numel()}", flush=True)

    held_x, held_start = distill(model, held_ids, HELD_SEQUENCES, 64, gen, 1e9, "held-out")
    held = (held_x, held_start, torch.cat([hidden(model, held_x[c:c + 64]) for c in range(0, len(held_x), 64)]))
    data_x, data_start = distill(model, train_ids, MAX_SEQUENCES, GEN_BATCH, gen,
                                 min(a.minutes * 15, 150), "train")

    lm_head = model.lm_head.weight.detach().float()
    heads = Heads(a.heads, lm_head).cuda()
    params = sum(p.numel() for p in heads.parameters())
    opt = torch.optim.AdamW(heads.parameters(), lr=LR, weight_decay=0.0)
    ev = evaluate(heads, held, lm_head)
    print(f"init: held-out top-1 {[round(v, 3) for v in ev['top1']]}, lm_head {ev['lm_head_top1']:.3f}, "
          f"accepted {ev['accepted_per_position']:.3f}", flush=True)
    ar = torch.arange(SEQ, device="cuda")
    budget = a.minutes * 60
    t0 = last = time.time()
    best_score, best_state, best_step, step = -1.0, None, 0, 0
    while time.time() - t0 < budget:
        frac = (time.time() - t0) / budget
        lr = LR * min(1.0, (step + 1) / 100) * max(0.02, 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        if step % 3 == 2:  # plain corpus windows
            s = torch.randint(0, train_ids.numel() - SEQ, (BATCH,), device="cuda")
            x, start = train_ids[s[:, None] + ar], torch.zeros(BATCH, dtype=torch.long, device="cuda")
        else:
            j = torch.randint(0, data_x.shape[0], (BATCH,), device="cuda")
            x, start = data_x[j], data_start[j]
        loss = loss_fn(heads, hidden(model, x), x, start)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if time.time() - last >= 30 or time.time() - t0 >= budget:
            ev = evaluate(heads, held, lm_head)
            if ev["accepted_per_position"] > best_score:
                best_score, best_step = ev["accepted_per_position"], step
                best_state = {k: v.detach().clone() for k, v in heads.state_dict().items()}
            print(f"step {step} loss {loss.item():.3f} lr {lr:.2e} held-out top-1 "
                  f"{[round(v, 3) for v in ev['top1']]} accepted {ev['accepted_per_position']:.3f} "
                  f"tokens/step {ev['tokens_per_step']:.3f}", flush=True)
            last = time.time()
    train_seconds = time.time() - t0
    if best_state is not None:
        heads.load_state_dict(best_state)
    ev = evaluate(heads, held, lm_head)

    os.makedirs(a.out, exist_ok=True)
    save_file(heads.tensors(), os.path.join(a.out, "medusa_lm_head.safetensors"), metadata={"format": "pt"})
    cfg = model.config
    json.dump({"medusa_num_heads": a.heads, "medusa_num_layers": 1, "base_model_name_or_path": "../demo",
               "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size},
              open(os.path.join(a.out, "config.json"), "w"), indent=2)
    version_file = os.path.join(a.corpus, "VERSION")
    corpus_version = open(version_file).read().strip() if os.path.exists(version_file) else "unknown"
    meta = {"heads": a.heads, "parameters": params, "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
            "steps": step, "best_step": best_step, "minutes": a.minutes, "train_seconds": round(train_seconds, 1),
            "sequences": int(data_x.shape[0]),
            "held_out_sequences": int(held_x.shape[0]), "held_out_top1": [round(v, 4) for v in ev["top1"]],
            "held_out_lm_head_top1": round(ev["lm_head_top1"], 4),
            "accepted_per_position": round(ev["accepted_per_position"], 4),
            "tokens_per_step": round(ev["tokens_per_step"], 4), "batch": BATCH, "lr": LR,
            "device": torch.cuda.get_device_name(0), "transformers": transformers.__version__,
            "torch": torch.__version__, "corpus_version": corpus_version}
    json.dump(meta, open(os.path.join(a.out, "training.json"), "w"), indent=2)
    write_card(a.out, a, meta, corpus_version)
    print(json.dumps(meta, indent=1), flush=True)
    if a.reference:
        write_reference(a.reference, a.demo, a.out, tok, a.heads)
    print(f"done: {a.heads} heads, {step} steps (best {best_step}), held-out top-1 {meta['held_out_top1']}, "
          f"{meta['accepted_per_position']:.3f} accepted per step, {meta['tokens_per_step']:.3f} tokens per step, "
          f"{train_seconds:.0f} s of training", flush=True)


if __name__ == "__main__":
    main()
