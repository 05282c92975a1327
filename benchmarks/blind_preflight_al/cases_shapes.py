"""Set al, family shapes: tensors laid out in one convention and read in another (no crash, wrong pairing)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_al.registry import acc_of, adam, case, ds, fix, fixed_of, gen, loader, seed


# 1 ------------------------------------------------------------------ HWC images reshaped, not permuted
def colour_tiles(n, s):
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    hwc = 0.8 * torch.randn(n, 8, 8, 3, generator=g)          # channels-last, as PIL/numpy give it
    hwc[torch.arange(n), :, :, y] += 0.5                        # the class is the dominant colour
    return hwc, y


class TileCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))


@case("al_hwc_reshape_not_permute", "shapes",
      "Channels-last (N, H, W, C) image tiles are turned into (N, C, H, W) with .reshape(N, 3, 8, 8) instead of "
      ".permute(0, 3, 1, 2), so the colour channels are interleaved with pixels and the colour cue is scrambled.",
      r"(reshape|view).{0,80}(permute|transpose|channels?[- ]?(last|first)|NHWC|HWC)|(permute|transpose).{0,80}"
      r"(instead of|not|rather than).{0,20}(reshape|view)|(channels?[- ]?last|NHWC|HWC).{0,80}(reshap|view|scrambl|interleav)"
      r"|(pixels?|colou?r).{0,40}(scrambl|interleav|mix)")
def al_hwc_reshape_not_permute(fixed=False):
    seed(0)
    hwc, y = colour_tiles(1200, 1)
    to_chw = (lambda t: t.permute(0, 3, 1, 2).contiguous()) if fixed else (lambda t: t.reshape(len(t), 3, 8, 8))
    x = to_chw(hwc)
    vx, vy = colour_tiles(400, 2)
    model = TileCNN()
    return dict(model=model, optimizer=adam(model), train_loader=loader(ds(x[:1000], y[:1000])),
                val_loader=loader(ds(to_chw(vx), vy), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss(), max_steps=600)


# 2 ------------------------------------------------------------------ h_n.view(B, -1) of a 2-layer LSTM
def sensor_windows(n, s):
    g = gen(s)
    x = torch.randn(n, 20, 4, generator=g)
    y = (x[:, :, 0].sum(1) > x[:, :, 1].sum(1)).long()
    return x, y


class WindowLSTM(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.lstm = nn.LSTM(4, 24, num_layers=2, batch_first=True)
        self.fc = nn.Linear(48, 2)

    def forward(self, x):
        _, (h, _) = self.lstm(x)                       # h: (num_layers, B, H) even with batch_first=True
        if self.fixed:
            h = h.permute(1, 0, 2).reshape(x.shape[0], -1)
        else:
            h = h.view(x.shape[0], -1)                  # mixes rows of different samples
        return self.fc(h)


@case("al_hn_view_mixes_batch", "shapes",
      "The final hidden state h_n of a 2-layer LSTM has shape (num_layers, batch, hidden) even with batch_first=True; "
      "h_n.view(batch, -1) concatenates states of different samples, so each row's features belong to other samples.",
      r"\bh_?n\b|hidden state.{0,80}(num_layers|layers?).{0,40}(batch|first)|(num_layers|layers?) ?[,x×] ?batch"
      r"|view\(.{0,20}batch.{0,40}(mix|other samples|different samples)|permute\(1, ?0")
def al_hn_view_mixes_batch(fixed=False):
    seed(0)
    x, y = sensor_windows(1400, 3)
    model = WindowLSTM(fixed)
    return dict(model=model, optimizer=adam(model, 1e-2), train_loader=loader(ds(x[:1100], y[:1100])),
                val_loader=loader(ds(x[1100:], y[1100:]), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss())


# 3 ------------------------------------------------------------------ cosine_similarity default dim=1
def noisy_pairs(n, s):
    g = gen(s)
    base = torch.randn(n, 4, generator=g) @ torch.randn(4, 24, generator=gen(99))
    return base + 0.6 * torch.randn(n, 24, generator=g), base + 0.6 * torch.randn(n, 24, generator=g)


def info_nce(fixed, temperature=0.1):
    def loss_fn(model, batch):
        z1, z2 = model(batch[0]), model(batch[1])
        if fixed:
            sim = F.cosine_similarity(z1[:, None, :], z2[None, :, :], dim=-1)
        else:
            sim = F.cosine_similarity(z1[:, None, :], z2[None, :, :])   # default dim=1: over the batch axis
        labels = torch.arange(sim.shape[0], device=sim.device)
        return F.cross_entropy(sim / temperature, labels)
    return loss_fn


@torch.no_grad()
def retrieval_top1(model, kw):
    was = model.training
    model.eval()
    a, b = noisy_pairs(300, 77)
    d = next(model.parameters()).device
    za, zb = F.normalize(model(a.to(d)), dim=-1), F.normalize(model(b.to(d)), dim=-1)
    model.train(was)
    return ((za @ zb.T).argmax(1) == torch.arange(300, device=d)).float().mean().item()


@case("al_cosine_sim_default_dim", "shapes",
      "The InfoNCE similarity matrix is built with F.cosine_similarity(z1[:, None], z2[None]) without dim=-1: the "
      "default dim=1 takes the cosine over the batch axis of the broadcast (B, B, D) tensor, giving (B, D) logits "
      "that are not pairwise similarities.",
      r"cosine_?similarity|CosineSimilarity|cosine.{0,60}(dim|axis)|(dim|axis)\s*=\s*(1|-1).{0,80}(cosine|similarit)"
      r"|similarity matrix.{0,80}(shape|dim|axis|batch)")
def al_cosine_sim_default_dim(fixed=False):
    seed(0)
    v1, v2 = noisy_pairs(2000, 5)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 64))
    return dict(model=model, optimizer=adam(model), train_loader=loader(ds(v1, v2), 32, drop_last=True),
                loss_fn=info_nce(fixed))


# 4 ------------------------------------------------------------------ TransformerEncoder without batch_first
def bag_sequences(n, s, vocab=30, length=12):
    g = gen(s)
    tok = torch.randint(2, vocab, (n, length), generator=g)
    score = ((tok < 12).sum(1) - (tok >= 20).sum(1))
    y = (score > 0).long()
    tok[:, 0] = 1                                                      # [CLS]
    return tok, y


class ClsEncoder(nn.Module):
    def __init__(self, fixed, vocab=30, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, 12, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=fixed)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.fc = nn.Linear(d, 2)

    def forward(self, tok):
        return self.fc(self.enc(self.emb(tok) + self.pos)[:, 0])


@case("al_transformer_not_batch_first", "shapes",
      "nn.TransformerEncoderLayer is built without batch_first=True (default False expects (seq, batch, feature)) but "
      "is fed (batch, seq, feature): attention runs across the samples of the batch instead of across each "
      "sequence's tokens, and the [CLS] output never sees its own sentence.",
      r"(Transformer\w*|MultiheadAttention|attention|encoder).{0,80}batch_first|batch_first.{0,80}(Transformer|attention|"
      r"encoder)|attention.{0,60}across.{0,30}(batch|samples)|expects? \(seq(uence)?[_ ]?(len)?, ?batch")
def al_transformer_not_batch_first(fixed=False):
    seed(0)
    tok, y = bag_sequences(1600, 7)
    model = ClsEncoder(fixed)
    return dict(model=model, optimizer=adam(model, 2e-3), train_loader=loader(ds(tok[:1300], y[:1300])),
                val_loader=loader(ds(tok[1300:], y[1300:]), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss())


# 5 ------------------------------------------------------------------ (T, B, C) logits flattened against (B, T) tags
def tag_sequences(n, s, vocab=12, length=10):
    g = gen(s)
    tok = torch.randint(0, vocab, (n, length), generator=g)
    prev = torch.cat([torch.zeros(n, 1, dtype=torch.long), tok[:, :-1]], 1)
    return tok, (tok + prev) % 3


class GRUTagger(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(12, 16)
        self.gru = nn.GRU(16, 32)                        # seq-first, as in the tutorial it came from
        self.fc = nn.Linear(32, 3)

    def forward(self, tok):
        out, _ = self.gru(self.emb(tok.t()))           # (T, B, H)
        logits = self.fc(out)                           # (T, B, C)
        return logits.transpose(0, 1) if self.fixed else logits


def flat_ce(model, batch):
    logits = model(batch[0])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[1].reshape(-1))


@case("al_seq_first_logits_flatten", "shapes",
      "A seq-first GRU tagger returns logits of shape (T, B, C); they are flattened with reshape(-1, C) against tags "
      "of shape (B, T) flattened with reshape(-1), so every token's logits are scored against another token's tag.",
      r"\(T, ?B, ?C\)|(time|seq)[- ]?(major|first).{0,80}(logits|flatten|reshape|tags?|labels?|targets?)|(logits|outputs?)"
      r".{0,80}(flatten|reshape|view).{0,80}(tags?|labels?|targets?).{0,80}(order|transpose|misalign|mismatch|\(B, ?T\))"
      r"|transpose\(0, ?1\).{0,40}(before|then) (flatten|reshap)|(logits|outputs?).{0,60}(tags?|labels?|targets?).{0,40}"
      r"(misalign|mismatch|different order)")
def al_seq_first_logits_flatten(fixed=False):
    seed(0)
    tok, tags = tag_sequences(1500, 9)
    model = GRUTagger(fixed)
    return dict(model=model, optimizer=adam(model, 1e-2), train_loader=loader(ds(tok[:1200], tags[:1200])),
                val_loader=loader(ds(tok[1200:], tags[1200:]), 100, shuffle=False), loss_fn=flat_ce)


def _argmax_fwd(m, b):
    return m(b[0]).argmax(-1), b[-1]


def _tag_fwd(m, b):
    return m(b[0]).argmax(-1).reshape(-1), b[1].reshape(-1)


fix("al_hwc_reshape_not_permute", fixed_of(al_hwc_reshape_not_permute), acc_of(_argmax_fwd), "val accuracy", steps=250)
fix("al_hn_view_mixes_batch", fixed_of(al_hn_view_mixes_batch), acc_of(_argmax_fwd), "val accuracy", steps=250)
fix("al_cosine_sim_default_dim", fixed_of(al_cosine_sim_default_dim), retrieval_top1, "top-1 retrieval", steps=250)
fix("al_transformer_not_batch_first", fixed_of(al_transformer_not_batch_first), acc_of(_argmax_fwd), "val accuracy",
    steps=300)
fix("al_seq_first_logits_flatten", fixed_of(al_seq_first_logits_flatten), acc_of(_tag_fwd), "val token accuracy",
    steps=250)
