"""Set bb, family mechanics: masks, sampled losses, logit scales and the LR schedule."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bb.registry import acc_of, case, fix, fixed_of, nll_of, seed
from benchmarks.blind_preflight_bb.synth import log_spec, markov_sessions, tensors, tone_clips

# ---------------------------------------------------------------- 1. SASRec without a causal mask


class SASRec(nn.Module):
    """Self-attention next-item model: a prediction at every position (batch_first)."""

    def __init__(self, n_items, causal, d=64, length=12):
        super().__init__()
        self.causal = causal
        self.emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.pos = nn.Embedding(length, d)
        layer = nn.TransformerEncoderLayer(d, 4, 128, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(d, n_items + 1)

    def forward(self, seq):
        t = seq.shape[1]
        h = self.emb(seq) + self.pos(torch.arange(t, device=seq.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=seq.device) if self.causal else None
        return self.out(self.enc(h, mask=mask, is_causal=self.causal))


def shifted_loss(model, batch):
    seq, target = batch
    logits = model(seq)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def every_prefix(m, b):
    """Next-item accuracy as it is served: each prefix of the session alone, read at its last position."""
    seq, target = b
    preds, ys = [], []
    for t in range(2, seq.shape[1] + 1):
        preds.append(m(seq[:, :t])[:, -1].argmax(-1))
        ys.append(target[:, t - 1])
    return torch.cat(preds), torch.cat(ys)


@case("sasrec_no_causal_mask", "mechanics",
      "The self-attention next-item model trains on every position (targets = seq[:, 1:]) without a causal mask, so "
      "position t attends to item t+1, which is its own target: training loss falls by copying, and served on a session "
      "prefix, where no future item exists, the model has learned nothing except at the one full-length position.",
      r"causal|subsequent|look[- ]?ahead|future (items?|positions?|tokens?|steps?)|attn_mask|is_causal|"
      r"triangular|triu|tril|attend(s|ing)? to (the )?(next|future|later)|leak")
def sasrec_no_causal_mask(fixed=False):
    seed(0)
    full = markov_sessions(2400, 40, 13, 31, order=2)
    model = SASRec(40, causal=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-3),
                train_loader=tensors(full[:2000, :-1], full[:2000, 1:]), loss_fn=shifted_loss,
                val_loader=tensors(full[2000:, :-1], full[2000:, 1:], shuffle=False), max_steps=300)


fix("sasrec_no_causal_mask", fixed_of(sasrec_no_causal_mask), acc_of(every_prefix), "val next-item accuracy over all prefixes")

# ---------------------------------------------------------------- 2. key_padding_mask with True on the real items


class PaddedSASRec(nn.Module):
    def __init__(self, n_items, mask_is_padding, d=64, length=10):
        super().__init__()
        self.mask_is_padding = mask_is_padding
        self.emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.pos = nn.Embedding(length, d)
        layer = nn.TransformerEncoderLayer(d, 4, 128, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(d, n_items + 1)

    def forward(self, seq):  # left-padded (B, T): the last position is always a real item
        h = self.emb(seq) + self.pos(torch.arange(seq.shape[1], device=seq.device))
        mask = seq == 0 if self.mask_is_padding else seq != 0   # "attention mask: 1 for real items"
        return self.out(self.enc(h, src_key_padding_mask=mask)[:, -1])


def left_padded(n, n_items, s, lo=3, hi=9, length=10):
    full = markov_sessions(n, n_items, hi + 1, s, order=2)
    lengths = torch.randint(lo, hi + 1, (n,), generator=torch.Generator().manual_seed(s + 3))
    seq = torch.zeros(n, length, dtype=torch.long)
    for i in range(n):
        seq[i, length - lengths[i]:] = full[i, : lengths[i]]
    return seq, full[torch.arange(n), lengths]


@case("sasrec_key_padding_mask_inverted", "mechanics",
      "src_key_padding_mask is built as seq != 0 (True on real items, like a Hugging Face attention_mask), but PyTorch "
      "ignores the keys where it is True: attention sees only padding, and the last item reaches the readout only "
      "through the residual, so the two-item rule cannot be learned.",
      r"key_padding_mask|padding mask.{0,60}(invert|revers|flip|wrong|opposite|True)|(invert|revers|flip|negat)"
      r".{0,40}mask|mask.{0,60}True.{0,60}(ignor|masked|excluded|not attend)|attend(s|ing)? (only )?to "
      r"(the )?pad|seq ?!= ?0|~mask|logical_not|attention_mask")
def sasrec_key_padding_mask_inverted(fixed=False):
    seed(0)
    seq, target = left_padded(3000, 30, 32)
    model = PaddedSASRec(30, mask_is_padding=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-3),
                train_loader=tensors(seq[:2400], target[:2400]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(seq[2400:], target[2400:], shuffle=False), max_steps=300)


fix("sasrec_key_padding_mask_inverted", fixed_of(sasrec_key_padding_mask_inverted),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val next-item accuracy")

# ---------------------------------------------------------------- 3. popularity-sampled negatives without logQ


class DotRec(nn.Module):
    def __init__(self, n_items, d=32):
        super().__init__()
        self.emb = nn.Embedding(n_items + 1, d)
        self.user_mlp = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.items = nn.Embedding(n_items + 1, d)
        self.bias = nn.Embedding(n_items + 1, 1)

    def user(self, seq):
        return self.user_mlp(self.emb(seq[:, -1]))

    def forward(self, seq):
        return self.user(seq) @ self.items.weight.T + self.bias.weight.T

    def score(self, u, ids):
        return (u[:, None] * self.items(ids)).sum(-1) + self.bias(ids)[..., 0]


def zipf_q(n_items):
    w = 1.0 / torch.arange(1, n_items + 1).float()
    return torch.cat([torch.zeros(1), w / w.sum()])    # index 0 unused


def popularity_sampled_softmax(q, logq_correction, k=32):
    def loss(model, batch):
        seq, pos = batch
        qd = q.to(seq.device)
        neg = torch.multinomial(qd, seq.shape[0] * k, replacement=True).view(-1, k)
        u = model.user(seq)
        ids = torch.cat([pos[:, None], neg], 1)
        logits = model.score(u, ids)
        if logq_correction:
            logits = logits - torch.log(qd[ids] * k)
        return F.cross_entropy(logits, torch.zeros(len(pos), dtype=torch.long, device=seq.device))
    return loss


def popular_next(n, n_items, s, p_rule=0.3):
    """Next item: with p_rule the context's rule item, otherwise a popularity (Zipf) draw."""
    g = torch.Generator().manual_seed(s)
    q = zipf_q(n_items)
    last = torch.multinomial(q, n, replacement=True, generator=g)
    perm = torch.randperm(n_items, generator=g) + 1
    rule = perm[last - 1]
    pop = torch.multinomial(q, n, replacement=True, generator=g)
    nxt = torch.where(torch.rand(n, generator=g) < p_rule, rule, pop)
    return last[:, None], nxt, q


@case("sampled_softmax_no_logq_correction", "mechanics",
      "Negatives for the sampled softmax are drawn in proportion to item popularity, but the logits are not corrected "
      "by subtracting log Q(item): the model learns p(item | session) / Q(item), so popular items are scored far too "
      "low and the full-catalogue probabilities are badly wrong.",
      r"log[- ]?q|logq|sampling (bias|probabilit|distribution)|(correct|adjust|subtract).{0,60}(sampling|proposal|"
      r"popularity|log ?q|frequency)|popularity.{0,60}(bias|correct|sampl|negativ)|(negative|sampled) softmax.{0,80}"
      r"(bias|correct|uncorrect)|importance (weight|sampl)|(unigram|frequency)[- ]sampled|proposal distribution")
def sampled_softmax_no_logq_correction(fixed=False):
    seed(0)
    last, nxt, q = popular_next(6000, 200, 33)
    model = DotRec(200)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(last[:5000], nxt[:5000], batch_size=128),
                loss_fn=popularity_sampled_softmax(q, fixed),
                val_loader=tensors(last[5000:], nxt[5000:], shuffle=False), max_steps=300)


fix("sampled_softmax_no_logq_correction", fixed_of(sampled_softmax_no_logq_correction),
    nll_of(lambda m, b: (m(b[0])[:, 1:], b[1] - 1)), "val full-catalogue NLL", higher=False)

# ---------------------------------------------------------------- 4. cosine logits without a temperature


class CosineRec(nn.Module):
    def __init__(self, n_items, scale, d=32):
        super().__init__()
        self.scale = scale
        self.emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.items = nn.Embedding(n_items + 1, d)

    def forward(self, seq):
        u = F.normalize(self.gru(self.emb(seq))[0][:, -1], dim=-1)
        return self.scale * u @ F.normalize(self.items.weight, dim=-1).T


@case("cosine_logits_no_temperature", "mechanics",
      "The next-item logits are cosine similarities between the normalised session vector and the normalised item "
      "embeddings, fed to CrossEntropyLoss without a temperature or scale: logits stay in [-1, 1], the softmax over "
      "301 items can never put more than about 2.4% on the true item, and the gradients stay tiny.",
      r"temperature|scal(e|ing) (the )?(logits|cosine|similarit)|logit scale|(cosine|unit[- ]norm|l2[- ]normali[sz]ed).{0,80}"
      r"(\[-1, ?1\]|bounded|between -1 and 1|too small|range|temperature|scale)|logits?.{0,40}(bounded|range|in "
      r"\[-1|too small|small magnitude)|tau|/ ?0\.\d|divide.{0,30}(by )?(a )?(temperature|tau)|uniform|"
      r"(near[- ]?)?flat softmax")
def cosine_logits_no_temperature(fixed=False):
    seed(0)
    full = markov_sessions(3000, 300, 6, 34)
    seq, target = full[:, :5], full[:, 5]
    model = CosineRec(300, scale=20.0 if fixed else 1.0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(seq[:2400], target[:2400]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(seq[2400:], target[2400:], shuffle=False), max_steps=300)


fix("cosine_logits_no_temperature", fixed_of(cosine_logits_no_temperature),
    nll_of(lambda m, b: (m(b[0]), b[1])), "val NLL", higher=False)

# ---------------------------------------------------------------- 5. per-epoch decay stepped every batch


class KWSNet(nn.Module):
    def __init__(self, n_cls):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                                 nn.Linear(32, n_cls))

    def forward(self, x):
        return self.net(x)


@case("kws_exponential_lr_per_batch", "mechanics",
      "ExponentialLR(gamma=0.9), meant as a per-epoch decay, is stepped after every batch: after 60 of the 300 steps "
      "the learning rate is under 0.2% of its start and the keyword model stops learning early.",
      r"ExponentialLR|gamma|(per|every|each) (batch|step|iteration).{0,60}(epoch|decay)|(epoch|decay).{0,60}"
      r"(per|every|each) (batch|step|iteration)|(learning rate|lr).{0,60}(decay|shrink|collaps|vanish|"
      r"too (small|low)|near(ly)? zero|tiny)|scheduler.{0,60}(too (fast|often|early)|every (batch|step))")
def kws_exponential_lr_per_batch(fixed=False):
    seed(0)
    wav, y = tone_clips(1600, 12, 35, step=125.0, noise=1.5)
    x = log_spec(wav)
    x = (x - x.mean()) / x.std()
    model = KWSNet(12)
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    gamma = 0.9 ** (1 / math.ceil(1200 / 64)) if fixed else 0.9   # fixed: the per-epoch decay, spread over the steps
    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma),
                train_loader=tensors(x[:1200], y[:1200]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(x[1200:], y[1200:], shuffle=False), max_steps=300)


fix("kws_exponential_lr_per_batch", fixed_of(kws_exponential_lr_per_batch),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")
