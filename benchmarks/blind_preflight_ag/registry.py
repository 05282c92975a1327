"""Set ag's case registry: set a's Case / CaseTable and data helpers, its own case table, the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved), and the small text helpers the
cases share (a vocabulary built from a synthetic corpus, padding, a tiny causal Transformer LM)."""

from __future__ import annotations

import math
from collections import Counter

import torch
from torch import nn

from benchmarks.blind_preflight.fixes import FixTable, accuracy, val_acc  # noqa: F401
from benchmarks.blind_preflight.registry import (  # noqa: F401
    Case,
    CaseTable,
    gen,
    loader,
    mean_over,
    model_device,
    seed,
    teacher_classes,
    teacher_regression,
    token_sequences,
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_ag")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def acc_of(fwd):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels); -100 entries are skipped."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


# ---------------------------------------------------------------- text helpers (tokenisation done in code)

def words(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def build_vocab(texts, specials=("<pad>", "<unk>"), min_freq: int = 1) -> dict[str, int]:
    """Word -> id from whitespace-split texts, specials first, then by frequency (ties by first appearance)."""
    counts = Counter(w for t in texts for w in t.split())
    vocab = {s: i for i, s in enumerate(specials)}
    for w, c in counts.most_common():
        if c >= min_freq and w not in vocab:
            vocab[w] = len(vocab)
    return vocab


def encode(text: str, vocab: dict[str, int], unk: str = "<unk>") -> list[int]:
    return [vocab.get(w, vocab.get(unk, 0)) for w in text.split()]


def pad_to(seqs, length: int, value: int = 0) -> torch.Tensor:
    out = torch.full((len(seqs), length), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        s = list(s)[:length]
        out[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def choice(g: torch.Generator, items, k: int | None = None):
    """One item (k None) or k items with replacement, drawn with the torch generator."""
    idx = torch.randint(0, len(items), (1 if k is None else k,), generator=g).tolist()
    return items[idx[0]] if k is None else [items[i] for i in idx]


class TinyCausalLM(nn.Module):
    """A small decoder-only Transformer LM over token ids (batch-first), the shape of a minGPT-style script."""

    def __init__(self, vocab: int, d: int = 48, heads: int = 4, layers: int = 2, max_len: int = 32, causal: bool = True):
        super().__init__()
        self.causal = causal
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        t = ids.shape[1]
        h = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device) if self.causal else None
        return self.head(self.norm(self.blocks(h, mask=mask, is_causal=self.causal)))


def markov_text(n: int, length: int, vocab: int, s: int = 0, low: int = 3) -> torch.Tensor:
    """Token streams from a sparse first-order Markov chain: each token has 3 successors with probabilities
    0.6 / 0.3 / 0.1 (ids >= low), so the best next-token accuracy from the past is about 0.6."""
    table = torch.stack([torch.randperm(vocab - low, generator=gen(9000 + i))[:3] + low for i in range(vocab)])
    g = gen(s)
    out = torch.zeros(n, length, dtype=torch.long)
    out[:, 0] = torch.randint(low, vocab, (n,), generator=g)
    pick = torch.multinomial(torch.tensor([0.6, 0.3, 0.1]), n * length, replacement=True, generator=g).view(n, length)
    for t in range(1, length):
        out[:, t] = table[out[:, t - 1], pick[:, t]]
    return out


@torch.no_grad()
def next_token_acc(model, kw, key=None) -> float:
    """Teacher-forced next-token accuracy on the validation batches (logits at t scored against the token at t+1)."""
    def fn(m, b):
        ids = b[key] if key else b[0]
        logits = m(ids)
        logits = logits.logits if hasattr(logits, "logits") else logits
        p, y = logits[:, :-1].argmax(-1), ids[:, 1:]
        return (p == y).sum().item(), y.numel()
    return mean_over(model, kw["val_loader"], fn)


def ctc_greedy(logits: torch.Tensor, lengths: torch.Tensor, blank: int) -> list[list[int]]:
    """Greedy CTC decoding of batch-first logits (B, T, C) over each row's first lengths[b] frames."""
    best = logits.argmax(-1).cpu()
    out = []
    for b in range(best.shape[0]):
        prev, seq = None, []
        for s in best[b, : int(lengths[b])].tolist():
            if s != prev and s != blank:
                seq.append(s)
            prev = s
        out.append(seq)
    return out


def cosine_warm(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
