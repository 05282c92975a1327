"""Set bc's synthetic SFT / seq2seq data, tiny models and metrics (seeded, CPU, nothing downloaded).

A character "tokenizer": PAD=0, BOS=1, EOS=2, SEP=3 (the ">" between instruction and answer), three instruction
tokens (REV, CPY, ROT), a system-prompt filler token SYS, then 8 letters a..h. An instruction row is
``[BOS] [SYS]*k [op] word [SEP]`` and its answer ``f(word) [EOS]`` (reverse / copy / rotate each letter by one).
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

PAD, BOS, EOS, SEP, REV, CPY, ROT, SYS = range(8)
LETTERS = "abcdefgh"
L0 = 8
V = L0 + len(LETTERS) + 4          # a few spare ids
OPS = {"rev": REV, "cpy": CPY, "rot": ROT}
ITOS = ["<pad>", "<s>", "</s>", ">", "REV", "CPY", "ROT", "SYS"] + list(LETTERS)


def apply_op(op: str, word: str) -> str:
    if op == "rev":
        return word[::-1]
    if op == "cpy":
        return word
    return "".join(LETTERS[(LETTERS.index(c) + 1) % len(LETTERS)] for c in word)


def make_pairs(n: int, seed: int, ops=("rev", "cpy", "rot"), lmin: int = 3, lmax: int = 5,
               sys_max: int = 0, sys_min: int = 0) -> list[tuple[str, str, str, int]]:
    """(op, word, answer, n_sys) rows."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        op = r.choice(ops)
        word = "".join(r.choice(LETTERS) for _ in range(r.randint(lmin, lmax)))
        out.append((op, word, apply_op(op, word), r.randint(sys_min, max(sys_min, sys_max))))
    return out


def ids(text: str) -> list[int]:
    return [L0 + LETTERS.index(c) for c in text]


def prompt_ids(op: str, word: str, n_sys: int = 0) -> list[int]:
    return [BOS] + [SYS] * n_sys + [OPS[op]] + ids(word) + [SEP]


class InstructionSet(Dataset):
    """Rows of (prompt ids, answer ids incl. EOS)."""

    def __init__(self, pairs):
        self.rows = [(prompt_ids(op, w, k), ids(a) + [EOS]) for op, w, a, k in pairs]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def causal_collate(rows, pad_id: int = PAD):
    """HF convention: labels = input ids (unshifted), -100 on the prompt and the padding; right padding."""
    T = max(len(p) + len(a) for p, a in rows)
    x = torch.full((len(rows), T), pad_id, dtype=torch.long)
    y = torch.full((len(rows), T), -100, dtype=torch.long)
    m = torch.zeros((len(rows), T), dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        seq = p + a
        x[i, :len(seq)] = torch.tensor(seq)
        m[i, :len(seq)] = 1
        y[i, len(p):len(seq)] = torch.tensor(a)
    return {"input_ids": x, "attention_mask": m, "labels": y}


def s2s_collate(rows, start_id: int = BOS, pad_id: int = PAD):
    """Encoder input = prompt; labels = answer (+EOS) padded with -100; decoder inputs = labels shifted right."""
    S = max(len(p) for p, _ in rows)
    T = max(len(a) for _, a in rows)
    x = torch.full((len(rows), S), pad_id, dtype=torch.long)
    m = torch.zeros((len(rows), S), dtype=torch.long)
    y = torch.full((len(rows), T), -100, dtype=torch.long)
    d = torch.full((len(rows), T), pad_id, dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        x[i, :len(p)] = torch.tensor(p)
        m[i, :len(p)] = 1
        y[i, :len(a)] = torch.tensor(a)
        d[i, 0] = start_id
        d[i, 1:len(a)] = torch.tensor(a[:-1])
    return {"input_ids": x, "attention_mask": m, "decoder_input_ids": d, "labels": y}


# ---------------------------------------------------------------- hand-written GPT

class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask=None, pad_mask=None):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, key_padding_mask=pad_mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-style decoder: token + learned position embeddings, pre-LN blocks, a tied LM head. Returns logits."""

    def __init__(self, vocab: int = V, d: int = 64, layers: int = 2, heads: int = 4, max_len: int = 48):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def causal_mask(self, T, device):
        return torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)

    def embed(self, input_ids, position_ids=None):
        T = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)
        return self.tok(input_ids) + self.pos(position_ids)

    def forward(self, input_ids, attention_mask=None):
        x = self.embed(input_ids)
        mask = self.causal_mask(input_ids.shape[1], input_ids.device)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln_f(x))


def shifted_ce(logits, labels, **kw):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                           ignore_index=-100, **kw)


# ---------------------------------------------------------------- hand-written encoder-decoder

class TinySeq2Seq(nn.Module):
    def __init__(self, vocab: int = V, d: int = 64, heads: int = 4, layers: int = 2, max_len: int = 32,
                 batch_first: bool = True):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.core = nn.Transformer(d, heads, layers, layers, 4 * d, dropout=0.0, batch_first=batch_first)
        self.out = nn.Linear(d, vocab)

    def _emb(self, t):
        return self.emb(t) + self.pos(torch.arange(t.shape[1], device=t.device))

    def forward(self, input_ids, attention_mask, decoder_input_ids, causal=True):
        T = decoder_input_ids.shape[1]
        tgt_mask = self.core.generate_square_subsequent_mask(T, device=input_ids.device) if causal else None
        h = self.core(self._emb(input_ids), self._emb(decoder_input_ids), tgt_mask=tgt_mask,
                      src_key_padding_mask=attention_mask == 0, memory_key_padding_mask=attention_mask == 0)
        return self.out(h)


# ---------------------------------------------------------------- tiny Hugging Face models

def hf_gpt2(vocab: int = V, pad: int = PAD, **kw):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=vocab, n_positions=48, n_embd=64, n_layer=2, n_head=4, bos_token_id=BOS,
                     eos_token_id=EOS, pad_token_id=pad, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **kw)
    return GPT2LMHeadModel(cfg)


def hf_llama(vocab: int = V, pad: int = PAD):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      bos_token_id=BOS, eos_token_id=EOS, pad_token_id=pad, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


def hf_t5(vocab: int = V):
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=vocab, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                   num_heads=4, dropout_rate=0.0, pad_token_id=PAD, eos_token_id=EOS,
                   decoder_start_token_id=PAD, relative_attention_num_buckets=16)
    return T5ForConditionalGeneration(cfg)


def hf_bart(vocab: int = V):
    from transformers import BartConfig, BartForConditionalGeneration
    cfg = BartConfig(vocab_size=vocab, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=48,
                     dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=PAD, bos_token_id=BOS,
                     eos_token_id=EOS, decoder_start_token_id=EOS, forced_eos_token_id=None)
    return BartForConditionalGeneration(cfg)


# ---------------------------------------------------------------- metrics (independent of the case's own pipeline)

def val_rows(n: int = 256, seed: int = 999, **kw):
    return InstructionSet(make_pairs(n, seed, **kw)).rows


def _logits(model, input_ids, attention_mask):
    out = model(input_ids=input_ids, attention_mask=attention_mask)
    return out.logits if hasattr(out, "logits") else out


@torch.no_grad()
def causal_answer_acc(model, rows=None, fwd=_logits, batch: int = 64):
    """Teacher-forced next-token accuracy on the answer tokens (EOS included), reference collate."""
    rows = rows or val_rows()
    was = model.training
    model.eval()
    right = n = 0
    for i in range(0, len(rows), batch):
        b = causal_collate(rows[i:i + batch])
        logits = fwd(model, b["input_ids"], b["attention_mask"])
        pred, tgt = logits[:, :-1].argmax(-1), b["labels"][:, 1:]
        keep = tgt != -100
        right += (pred[keep] == tgt[keep]).sum().item()
        n += keep.sum().item()
    model.train(was)
    return right / max(n, 1)


@torch.no_grad()
def causal_eos_acc(model, rows=None, fwd=_logits):
    """Fraction of rows where the model predicts EOS right after the answer (teacher forced)."""
    rows = rows or val_rows()
    was = model.training
    model.eval()
    b = causal_collate(rows)
    logits = fwd(model, b["input_ids"], b["attention_mask"])
    lengths = b["attention_mask"].sum(1)
    pred = logits[torch.arange(len(rows)), lengths - 2].argmax(-1)
    model.train(was)
    return (pred == EOS).float().mean().item()


@torch.no_grad()
def causal_greedy_acc(model, rows=None, fwd=_logits):
    """Greedy decoding from the prompt alone, token accuracy over the answer (no future tokens present)."""
    rows = rows or val_rows(128)
    was = model.training
    model.eval()
    right = n = 0
    for p, a in rows:
        seq = list(p)
        for t in a:
            logits = fwd(model, torch.tensor([seq]), torch.ones(1, len(seq), dtype=torch.long))
            nxt = logits[0, -1].argmax().item()
            right += nxt == t
            n += 1
            seq.append(nxt)
    model.train(was)
    return right / n


@torch.no_grad()
def s2s_acc(model, rows=None, fwd=None, start_id: int = BOS, batch: int = 64):
    """Teacher-forced decoder accuracy with correctly shifted decoder inputs, reference collate."""
    rows = rows or val_rows()
    was = model.training
    model.eval()
    right = n = 0
    for i in range(0, len(rows), batch):
        b = s2s_collate(rows[i:i + batch], start_id=start_id)
        if fwd is None:
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                           decoder_input_ids=b["decoder_input_ids"]).logits
        else:
            logits = fwd(model, b)
        keep = b["labels"] != -100
        right += (logits.argmax(-1)[keep] == b["labels"][keep]).sum().item()
        n += keep.sum().item()
    model.train(was)
    return right / max(n, 1)


@torch.no_grad()
def s2s_greedy_acc(model, rows=None, fwd=None, start_id: int = BOS):
    """Greedy decoding (batched, fixed answer length per row), token accuracy over the answer."""
    rows = rows or val_rows(128)
    was = model.training
    model.eval()
    b = s2s_collate(rows, start_id=start_id)
    T = b["labels"].shape[1]
    dec = torch.full((len(rows), 1), start_id, dtype=torch.long)
    for _ in range(T):
        logits = fwd(model, {**b, "decoder_input_ids": dec})
        dec = torch.cat([dec, logits[:, -1:].argmax(-1)], 1)
    keep = b["labels"] != -100
    model.train(was)
    return (dec[:, 1:][keep] == b["labels"][keep]).float().mean().item()


def nll_causal(model, rows=None, fwd=_logits):
    rows = rows or val_rows()
    was = model.training
    model.eval()
    with torch.no_grad():
        b = causal_collate(rows)
        v = shifted_ce(fwd(model, b["input_ids"], b["attention_mask"]), b["labels"]).item()
    model.train(was)
    return v


def lr_lambda_cosine(total, warm=20):
    def f(s):
        if s < warm:
            return (s + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warm) / max(1, total - warm))))
    return f
