"""Small models shared by set ae's cases (each case builds its own instance; no weights are downloaded)."""

from __future__ import annotations

import torch
from torch import nn


class GRUSeq2Seq(nn.Module):
    """Encoder-decoder GRU with teacher forcing: forward(src, dec_in) -> logits (B, T, V)."""

    def __init__(self, vocab: int, d: int = 96, init_from_encoder: bool = True):
        super().__init__()
        self.emb_src = nn.Embedding(vocab, d)
        self.emb_tgt = nn.Embedding(vocab, d)
        self.encoder = nn.GRU(d, d, batch_first=True)
        self.decoder = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, vocab)
        self.init_from_encoder = init_from_encoder

    def forward(self, src, dec_in):
        _, h = self.encoder(self.emb_src(src))
        if not self.init_from_encoder:
            h = torch.zeros_like(h)
        o, _ = self.decoder(self.emb_tgt(dec_in), h)
        return self.out(o)


def seq2seq_batches(n: int, length: int, vocab: int, task: str, s: int = 0):
    """(src, dec_in, tgt) with tokens 2..vocab-1, BOS = 1: ``reverse``, ``sort`` or ``shift`` (tgt = src + 3 mod)."""
    g = torch.Generator().manual_seed(s)
    src = torch.randint(2, vocab, (n, length), generator=g)
    if task == "reverse":
        tgt = src.flip(1)
    elif task == "sort":
        tgt = src.sort(1).values
    else:
        tgt = (src - 2 + 3) % (vocab - 2) + 2
    dec_in = torch.cat([torch.ones(n, 1, dtype=torch.long), tgt[:, :-1]], 1)
    return src, dec_in, tgt


class MLPEncoder(nn.Module):
    def __init__(self, d_in: int, hidden: int = 128, d_out: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, d_out))

    def forward(self, x):
        return self.net(x)
