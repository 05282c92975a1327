"""Small helpers shared by set bc's case modules."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bc.synth import BOS, EOS, PAD, V


class GRUSeq2Seq(nn.Module):
    """A hand-written GRU encoder-decoder (Bahdanau-free), teacher forced; sequences padded to a fixed length."""

    def __init__(self, vocab: int = V, d: int = 64, h: int = 128, batch_first: bool = True,
                 teacher_forcing: float = 1.0):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.GRU(d, h, batch_first=batch_first)
        self.dec = nn.GRU(d, h, batch_first=batch_first)
        self.out = nn.Linear(h, vocab)
        self.teacher_forcing = teacher_forcing

    def forward(self, input_ids, decoder_input_ids):
        _, hid = self.enc(self.emb(input_ids))
        if self.teacher_forcing >= 1.0 or not self.training:
            out, _ = self.dec(self.emb(decoder_input_ids), hid)
            return self.out(out)
        # scheduled sampling: feed the model's own previous prediction with prob 1 - teacher_forcing
        steps, tok = [], decoder_input_ids[:, :1]
        for t in range(decoder_input_ids.shape[1]):
            o, hid = self.dec(self.emb(tok), hid)
            logits = self.out(o)
            steps.append(logits)
            if t + 1 < decoder_input_ids.shape[1]:
                use_gold = torch.rand(()) < self.teacher_forcing
                tok = decoder_input_ids[:, t + 1:t + 2] if use_gold else logits.argmax(-1).detach()
        return torch.cat(steps, 1)


def fixed_len_collate(length: int = 8):
    """Encoder and decoder both padded to ``length`` (max_length padding)."""
    def collate(rows):
        B = len(rows)
        x = torch.full((B, length), PAD, dtype=torch.long)
        d = torch.full((B, length), PAD, dtype=torch.long)
        y = torch.full((B, length), -100, dtype=torch.long)
        for i, (p, a) in enumerate(rows):
            x[i, :len(p)] = torch.tensor(p)
            y[i, :len(a)] = torch.tensor(a)
            d[i, 0] = BOS
            d[i, 1:len(a)] = torch.tensor(a[:-1])
        return x, d, y
    return collate


def gru_fwd(model, b):
    x = b["input_ids"]
    return model(x, b["decoder_input_ids"])


def ce(logits, labels, **kw):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, **kw)


__all__ = ["GRUSeq2Seq", "fixed_len_collate", "gru_fwd", "ce", "EOS"]
