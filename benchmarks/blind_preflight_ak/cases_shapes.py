"""Set ak, family shapes: tensors of the right size in the wrong order (no crash, no broadcast error)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ak.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# --- 1. seq2seq: batch-first logits flattened against seq-first targets --------------------------------------------


class Transliterator(nn.Module):
    def __init__(self, vocab=10, dim=48):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, vocab)

    def forward(self, src):                     # (N, T) -> (N, T, V)
        h, _ = self.gru(self.emb(src))
        return self.out(h)


def _translit_data(n, T=12, V=10, s=0):
    src = torch.randint(0, V, (n, T), generator=gen(s))
    prev = torch.cat([torch.zeros(n, 1, dtype=torch.long), src[:, :-1]], 1)
    return src, (src + prev) % V


def _seq_first_collate(batch):
    src = torch.stack([b[0] for b in batch])
    tgt = torch.stack([b[1] for b in batch])
    return src, tgt.t().contiguous()            # (T, N): the layout nn.Transformer tutorials use


def _batch_first_collate(batch):
    return torch.stack([b[0] for b in batch]), torch.stack([b[1] for b in batch])


@case("ak_seq2seq_flat_seqfirst_targets", "shapes",
      "A batch-first GRU emits logits (N, T, V) while the collate_fn returns targets seq-first (T, N); the loss "
      "flattens both with .reshape(-1) so logit row n*T+t is scored against the target of position n' in step t' "
      "(a transposed order), the same element count so nothing raises, and the tokens are paired with other "
      "sentences' labels.",
      r"(seq.?first|\(T, ?N\)|time.?major|batch.?first|transpos\w* .*(target|label)|(target|label)s? .*transpos|"
      r"\.t\(\)|order of (the )?(flatten|reshape)|"
      r"flatten\w* .*(order|layout)|(target|label)s? .*(transposed|(T, ?N))|reshape\(-1\).*(order|layout|transpos))")
def seq2seq_flat(fixed=False):
    seed(0)
    (s_tr, t_tr), (s_va, t_va) = _translit_data(1024, s=1), _translit_data(256, s=2)
    collate = _batch_first_collate if fixed else _seq_first_collate
    model = Transliterator()

    def loss_fn(model, batch):
        src, tgt = batch
        logits = model(src)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(s_tr, t_tr), 32, collate_fn=collate, drop_last=True),
                val_loader=loader(TensorDataset(s_va, t_va), 32, shuffle=False, collate_fn=collate),
                loss_fn=loss_fn, max_steps=2000)


def _translit_fwd(m, b):
    src, tgt = b
    pred = m(src).argmax(-1)
    return pred, (tgt if tgt.shape == pred.shape else tgt.t())


fix("ak_seq2seq_flat_seqfirst_targets", fixed_of(seq2seq_flat), acc_of(_translit_fwd), "val token accuracy")

# --- 2. matrix factorisation: .sum() without dim -------------------------------------------------------------------


class MF(nn.Module):
    def __init__(self, n_users, n_items, k=8, fixed=False):
        super().__init__()
        self.u, self.i = nn.Embedding(n_users, k), nn.Embedding(n_items, k)
        self.bu, self.bi = nn.Embedding(n_users, 1), nn.Embedding(n_items, 1)
        for e in (self.u, self.i):
            nn.init.normal_(e.weight, std=0.3)
        nn.init.zeros_(self.bu.weight)
        nn.init.zeros_(self.bi.weight)
        self.fixed = fixed

    def forward(self, pairs):
        u, i = pairs[:, 0], pairs[:, 1]
        dot = (self.u(u) * self.i(i)).sum(1) if self.fixed else (self.u(u) * self.i(i)).sum()
        return dot + self.bu(u).squeeze(-1) + self.bi(i).squeeze(-1)


def ratings(n_users=100, n_items=80, n=5000, rank=4, s=0):
    g = gen(s)
    a, b = torch.randn(n_users, rank, generator=g), torch.randn(n_items, rank, generator=g)
    pairs = torch.stack([torch.randint(0, n_users, (n,), generator=g), torch.randint(0, n_items, (n,), generator=g)], 1)
    r = (a[pairs[:, 0]] * b[pairs[:, 1]]).sum(1) / rank ** 0.5 + 0.1 * torch.randn(n, generator=g)
    return pairs, r


@case("ak_rec_dot_sum_without_dim", "shapes",
      "The matrix-factorisation forward computes the user-item dot product as (u * v).sum() with no dim, so the whole "
      "batch collapses to one scalar that broadcasts onto the (N,) bias terms: every rating in a batch gets the same "
      "interaction score and only the per-user / per-item biases can fit.",
      r"(\.sum\(\)|sum\(\) without|without (a )?dim|no dim\b|dim ?= ?1|sum\(1\)|sum over the (whole )?batch|"
      r"(collaps|reduc)\w* .*(whole|entire) batch|one scalar|single scalar|scalar .*(broadcast|per batch)|"
      r"same (interaction|dot|score|prediction) for every)")
def rec_dot(fixed=False):
    seed(0)
    pairs, r = ratings()
    model = MF(100, 80, fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.03),
                train_loader=loader(TensorDataset(pairs[:4000], r[:4000]), 128),
                val_loader=loader(TensorDataset(pairs[4000:], r[4000:]), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1000)


fix("ak_rec_dot_sum_without_dim", fixed_of(rec_dot), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE",
    higher=False)

# --- 3. bidirectional GRU: h_n.view(batch, -1) ---------------------------------------------------------------------


class BiGRUClassifier(nn.Module):
    def __init__(self, vocab=30, dim=32, classes=4, fixed=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * dim, classes)
        self.fixed = fixed

    def forward(self, tokens):
        _, h_n = self.gru(self.emb(tokens))     # (2, N, H)
        if self.fixed:
            feats = torch.cat([h_n[0], h_n[1]], dim=1)
        else:
            feats = h_n.view(tokens.size(0), -1)  # mixes samples: rows 2i, 2i+1 of one direction
        return self.head(feats)


def first_token_data(n, T=10, vocab=30, s=0):
    x = torch.randint(1, vocab, (n, T), generator=gen(s))
    return x, x[:, 0] % 4


@case("ak_bigru_hn_view_batch", "shapes",
      "The bidirectional GRU's final state h_n has shape (num_directions, N, H) and the classifier flattens it with "
      "h_n.view(batch_size, -1); the view runs over the direction axis first, so row i holds the forward states of "
      "samples 2i and 2i+1 (or two backward states), never sample i's own pair: each label is scored against other "
      "sentences' features.",
      r"(h_n|hidden|h_?n)\b.*(view|reshape)|view\(batch|(num_directions|direction).*(first|axis|dim|batch)|"
      r"torch\.cat\(\[?h_?n\[0\]|h_?n\[-?[12]\]|transpose\(0, ?1\)|permute\(1, ?0|"
      r"(mix|interleav|scrambl)\w* .*(sample|batch|direction)")
def bigru(fixed=False):
    seed(0)
    x, y = first_token_data(1500, s=3)
    model = BiGRUClassifier(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("ak_bigru_hn_view_batch", fixed_of(bigru), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")

# --- 4. segmentation: logits.view(-1, C) on NCHW ---------------------------------------------------------------------


class TinyFCN(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                 nn.ReLU(), nn.Conv2d(16, classes, 1))

    def forward(self, x):
        return self.net(x)


def blob_images(n, size=16, s=0):
    g = gen(s)
    x = F.avg_pool2d(torch.randn(n, 1, size + 4, size + 4, generator=g), 5, stride=1) * 2.5
    mask = (x > -0.4).long()[:, 0] + (x > 0.4).long()[:, 0]      # 3 classes by smoothed intensity
    return x + 0.1 * torch.randn(x.shape, generator=g), mask


@case("ak_seg_view_nchw_as_nhwc", "shapes",
      "The segmentation loss flattens NCHW logits with logits.view(-1, num_classes) against mask.view(-1); view on a "
      "channels-first tensor does not move the class axis last, so each 'pixel row' is num_classes neighbouring "
      "values of one channel and the rows are paired with the wrong pixels.",
      r"(view\(-1, ?(num_classes|C|n_classes|classes)|permute\(0, ?2, ?3, ?1\)|channels?.?first|NCHW|NHWC|"
      r"class (axis|dim)\w* .*(last|move)|movedim|(N, ?C, ?H, ?W)|pass (the )?(N, ?C, ?H, ?W|4-?D) logits|"
      r"view .*(not|instead of) .*permute)")
def seg_view(fixed=False):
    seed(0)
    x, m = blob_images(800, s=4)
    model = TinyFCN()

    def loss_fn(model, batch):
        img, mask = batch
        logits = model(img)
        if fixed:
            flat = logits.permute(0, 2, 3, 1).reshape(-1, logits.size(1))
        else:
            flat = logits.view(-1, logits.size(1))
        return F.cross_entropy(flat, mask.view(-1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:640], m[:640]), 32),
                val_loader=loader(TensorDataset(x[640:], m[640:]), 160, shuffle=False),
                loss_fn=loss_fn, max_steps=800)


fix("ak_seg_view_nchw_as_nhwc", fixed_of(seg_view), acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])),
    "val pixel accuracy")

# --- 5. hand-written multi-head attention: heads split with view, no transpose --------------------------------------


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, fixed):
        super().__init__()
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.h, self.fixed = heads, fixed

    def forward(self, x):
        B, S, E = x.shape
        d = E // self.h
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.fixed:
            q, k, v = (t.reshape(B, S, self.h, d).transpose(1, 2) for t in (q, k, v))
        else:
            q, k, v = (t.reshape(B, self.h, S, d) for t in (q, k, v))   # no transpose: positions mixed into heads
        att = torch.softmax(q @ k.transpose(-2, -1) / d ** 0.5, dim=-1) @ v
        out = att.transpose(1, 2).reshape(B, S, E) if self.fixed else att.reshape(B, S, E)
        return self.proj(out)


class PrevTokenTagger(nn.Module):
    def __init__(self, vocab=12, dim=32, heads=4, S=10, fixed=False):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, dim), nn.Parameter(0.5 * torch.randn(S, dim))
        self.att, self.norm = SelfAttention(dim, heads, fixed), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, vocab))

    def forward(self, tokens):
        h = self.emb(tokens) + self.pos[: tokens.size(1)]
        return self.mlp(self.norm(self.att(h)))


@case("ak_mha_heads_view_no_transpose", "shapes",
      "A hand-written multi-head attention splits q, k, v into heads with .reshape(B, heads, S, head_dim) straight from "
      "(B, S, E) instead of .reshape(B, S, heads, head_dim).transpose(1, 2); the element count matches, so each 'head' "
      "row is built from slices of several different tokens and attention no longer relates positions.",
      r"(transpose\(1, ?2\)|view\(B, ?(self\.)?(h|heads|num_heads|n_heads)|(split|reshap)\w* .*heads?|"
      r"heads? .*(split|view|reshape|transpose)|head_dim .*(order|transpose)|(B, ?S, ?(H|heads), ?(d|head_dim))|"
      r"positions? .*(mixed|scrambled|interleaved)|tokens? .*(mixed|scrambled) .*heads?)")
def mha_view(fixed=False):
    seed(0)
    x = torch.randint(0, 12, (1600, 10), generator=gen(5))
    y = torch.cat([torch.full((1600, 5), -100), x[:, :-5] % 6], 1)     # tag: the class of the token 5 places back
    model = PrevTokenTagger(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1300], y[:1300]), 32),
                val_loader=loader(TensorDataset(x[1300:], y[1300:]), 300, shuffle=False),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0]).reshape(-1, 12), b[1].reshape(-1)), max_steps=1500)


fix("ak_mha_heads_view_no_transpose", fixed_of(mha_view), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val tag accuracy")
