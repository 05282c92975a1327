"""Set s, family "what_is_trained": the parameters that must learn are not the ones the optimizer updates.

Each builder returns the keyword arguments a user would pass to ``run_preflight``; ``fixed=True`` applies the one-line
fix (``verify.py`` trains both).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_s.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------------
# 1. Tone classifier fine-tuned from a "pretrained" filter bank: backbone frozen, optimizer built, then the head
#    replaced for the new task -- the optimizer still holds the old head.

WAVE = 128


def tone_clips(n: int, s: int, n_classes: int = 5):
    """A tone of 3, 6, 9, 12 or 15 cycles per clip, random phase and gain, in noise."""
    g = gen(s)
    y = torch.randint(0, n_classes, (n,), generator=g)
    t = torch.arange(WAVE, dtype=torch.float32)
    phase = 2 * math.pi * torch.rand(n, 1, generator=g)
    gain = 0.5 + torch.rand(n, 1, generator=g)
    x = gain * torch.sin(2 * math.pi * (3 * (y[:, None] + 1)) * t / WAVE + phase)
    return (x + 0.5 * torch.randn(n, WAVE, generator=g)).unsqueeze(1), y


class FilterBankNet(nn.Module):
    """A 24-filter cosine filter bank (the 'pretrained' front end), rectified and averaged, then a linear head."""

    def __init__(self, n_classes: int = 12, n_filters: int = 24, width: int = 33):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv1d(1, n_filters, width, padding=width // 2), nn.ReLU(),
                                      nn.AdaptiveAvgPool1d(1), nn.Flatten())
        t = torch.arange(width, dtype=torch.float32) - width // 2
        cycles = torch.linspace(1.5, 17.0, n_filters)[:, None]
        bank = torch.cos(2 * math.pi * cycles * t / WAVE) * torch.hann_window(width, periodic=False)
        with torch.no_grad():
            self.backbone[0].weight.copy_(bank.unsqueeze(1) / 4)
            self.backbone[0].bias.zero_()
        self.head = nn.Linear(n_filters, n_classes)

    def forward(self, wave):
        return self.head(self.backbone(wave))


@case("tone_head_replaced_after_optimizer", "what_is_trained",
      "the optimizer is built from model.parameters() before model.head is replaced by a new 5-class nn.Linear: it "
      "holds the old head's tensors, the new head never gets an optimizer step, and with the backbone frozen nothing "
      "that reaches the loss is ever updated",
      r"(not|never|isn.t|aren.t|missing)\W+(\w+\W+){0,4}(in|among|registered (with|in)|known to|passed to|seen by|part of)\W+(\w+\W+){0,3}(the )?optimi[sz]er|"
      r"optimi[sz]er\W+(\w+\W+){0,10}(before|old|stale|previous|replaced|re-?creat|rebuil|outdated)|"
      r"(re-?create|rebuild|construct|build|create)\w*\W+(\w+\W+){0,6}optimi[sz]er\W+(\w+\W+){0,6}after|"
      r"param\w*\W+(\w+\W+){0,8}(not|never) (updated|stepped|in the optimi[sz]er)|"
      r"optimi[sz]er\W+(\w+\W+){0,8}(none|no|0|zero)\W+(\w+\W+){0,4}(of the )?(trainable|model.s|requires_grad)")
def tone_head_replaced_after_optimizer(fixed: bool = False):
    seed(0)
    x, y = tone_clips(1600, 21)
    xv, yv = tone_clips(512, 22)
    model = FilterBankNet(n_classes=12)           # as loaded from the 12-keyword checkpoint
    for p in model.backbone.parameters():
        p.requires_grad = False
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.head = nn.Linear(24, 5)                 # the new task has 5 classes
    if fixed:
        optimizer = torch.optim.Adam(model.head.parameters(), lr=1e-2)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)


fix("tone_head_replaced_after_optimizer", fixed_of(tone_head_replaced_after_optimizer),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# 2. Matrix factorisation whose user and item factors are plain tensors with requires_grad=True, not nn.Parameter.

N_USERS, N_ITEMS = 200, 150


def star_ratings(n: int, s: int):
    """Ratings from rank-4 user/item tastes plus small biases, clipped to 1..5."""
    tg = gen(5)
    u_f, i_f = torch.randn(N_USERS, 4, generator=tg), torch.randn(N_ITEMS, 4, generator=tg)
    u_b, i_b = 0.3 * torch.randn(N_USERS, generator=tg), 0.3 * torch.randn(N_ITEMS, generator=tg)
    g = gen(s)
    u = torch.randint(0, N_USERS, (n,), generator=g)
    i = torch.randint(0, N_ITEMS, (n,), generator=g)
    r = 3.2 + u_b[u] + i_b[i] + 0.6 * (u_f[u] * i_f[i]).sum(1) + 0.2 * torch.randn(n, generator=g)
    return torch.stack([u, i], 1), r.clamp(1, 5)


class MatrixFactorization(nn.Module):
    def __init__(self, k: int = 8, fixed: bool = False):
        super().__init__()
        self.user_bias = nn.Embedding(N_USERS, 1)
        self.item_bias = nn.Embedding(N_ITEMS, 1)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)
        P, Q = 0.1 * torch.randn(N_USERS, k), 0.1 * torch.randn(N_ITEMS, k)
        if fixed:
            self.P, self.Q = nn.Parameter(P), nn.Parameter(Q)
        else:
            self.P, self.Q = P.requires_grad_(), Q.requires_grad_()   # "trainable" numpy-style factors

    def forward(self, pairs):
        u, i = pairs[:, 0], pairs[:, 1]
        P, Q = self.P.to(pairs.device), self.Q.to(pairs.device)       # added after a device-mismatch error
        dot = (P[u] * Q[i]).sum(1)
        return 3.2 + self.user_bias(u).squeeze(-1) + self.item_bias(i).squeeze(-1) + dot


@case("ratings_mf_factors_plain_tensors", "what_is_trained",
      "the user and item factor matrices are plain tensors with requires_grad=True assigned as attributes, not "
      "nn.Parameter: they are not in model.parameters(), so the optimizer never updates them (nor does .to() move "
      "them), and only the two bias tables learn",
      r"nn\.Parameter|register_parameter|not (a |an )?(registered|nn\.?Parameter|parameter)\b|"
      r"(plain|raw|bare|ordinary|unregistered) (tensor|attribute)|"
      r"(not|never|isn.t|aren.t|missing)\W+(\w+\W+){0,4}(in|from|among|part of|returned by) (model\.)?(named_)?parameters|"
      r"requires_grad\s*=\s*true\W+(\w+\W+){0,10}(not|never)\W+(\w+\W+){0,4}(registered|nn\.Parameter|parameters\(\))|"
      r"(tensor|attribute)\w*\W+(\w+\W+){0,8}(not|never) (registered|seen by the optimi[sz]er)")
def ratings_mf_factors_plain_tensors(fixed: bool = False):
    seed(0)
    x, y = star_ratings(8000, 23)
    xv, yv = star_ratings(2000, 24)
    model = MatrixFactorization(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1000)


fix("ratings_mf_factors_plain_tensors", fixed_of(ratings_mf_factors_plain_tensors),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE (stars)", steps=400, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# 3. Review sentiment on a tiny BERT whose forward runs the encoder under torch.no_grad() (feature-extraction code).

CLS = 2


def polar_reviews(n: int, s: int, length: int = 12, vocab: int = 80):
    """[CLS], fillers 25..79 and one sentiment word: positive 5..14, negative 15..24."""
    g = gen(s)
    tokens = torch.randint(25, vocab, (n, length), generator=g)
    tokens[:, 0] = CLS
    word = torch.randint(5, 25, (n,), generator=g)
    tokens[torch.arange(n), torch.randint(1, length, (n,), generator=g)] = word
    return tokens, (word < 15).long()


class ReviewClassifier(nn.Module):
    def __init__(self, fixed: bool = False):
        super().__init__()
        from transformers import BertConfig, BertModel

        self.fixed = fixed
        cfg = BertConfig(vocab_size=80, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
        self.encoder = BertModel(cfg, add_pooling_layer=False)
        self.head = nn.Linear(32, 2)

    def forward(self, input_ids):
        if self.fixed:
            h = self.encoder(input_ids=input_ids).last_hidden_state
        else:
            with torch.no_grad():                  # copied from the embedding-extraction notebook
                h = self.encoder(input_ids=input_ids).last_hidden_state
        return self.head(h[:, 0])


@case("review_bert_encoder_under_no_grad", "what_is_trained",
      "the model's forward runs the BERT encoder inside torch.no_grad() (copied from feature-extraction code): no "
      "graph is recorded through it, so the encoder's weights never get a gradient and only the 2-way linear head on "
      "the frozen random [CLS] features learns",
      r"no_grad\b|torch\.no_grad|no[- ]grad(\(\)| context| block| mode)|inference_mode|set_grad_enabled|"
      r"(encoder|bert|backbone|body)\w*\W+(\w+\W+){0,8}(no|zero|none|never|without)\W+(\w+\W+){0,3}(grad|gradient|update)|"
      r"(grad|gradient)\w*\W+(\w+\W+){0,8}(never|not|no)\W+(\w+\W+){0,4}(reach|flow|recorded|computed)\W+(\w+\W+){0,6}(encoder|bert|backbone|layers?)|"
      r"(graph|autograd)\W+(\w+\W+){0,6}(not recorded|disabled|cut|detached)")
def review_bert_encoder_under_no_grad(fixed: bool = False):
    seed(0)
    x, y = polar_reviews(2400, 25)
    xv, yv = polar_reviews(512, 26)
    model = ReviewClassifier(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("review_bert_encoder_under_no_grad", fixed_of(review_bert_encoder_under_no_grad),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# 4. Sensor-waveform classifier whose conv encoder runs through torch.utils.checkpoint(use_reentrant=True) on the raw
#    input, which does not require grad: the checkpointed encoder gets no gradients.


def waveform_shapes(n: int, s: int, length: int = 64):
    """0 rising sawtooth, 1 falling sawtooth, 2 triangle, 3 square; random period and phase, noisy."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    period = torch.randint(10, 22, (n, 1), generator=g).float()
    phase = torch.rand(n, 1, generator=g)
    u = (torch.arange(length, dtype=torch.float32) / period + phase) % 1.0
    saw = 2 * u - 1
    wave = torch.stack([saw, -saw, 2 * (2 * u - 1).abs() - 1, torch.sign(saw)], 1)[torch.arange(n), y]
    return (wave + 0.3 * torch.randn(n, length, generator=g)).unsqueeze(1), y


class CheckpointedConvNet(nn.Module):
    def __init__(self, use_reentrant: bool = True):
        super().__init__()
        self.use_reentrant = use_reentrant
        self.encoder = nn.Sequential(nn.Conv1d(1, 16, 5, padding=2), nn.ReLU(), nn.Conv1d(16, 16, 5, padding=2),
                                     nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        feats = checkpoint(self.encoder, x, use_reentrant=self.use_reentrant)   # save activation memory
        return self.head(feats)


@case("waveform_encoder_reentrant_checkpoint", "what_is_trained",
      "the conv encoder runs through torch.utils.checkpoint.checkpoint(..., use_reentrant=True) applied to the raw "
      "input batch, which does not require grad: the reentrant checkpoint's output then does not require grad, so no "
      "gradient reaches the encoder's weights and only the linear head trains",
      r"use_reentrant|reentrant|checkpoint\w*\W+(\w+\W+){0,10}(no|none|zero|never|without|not)\W+(\w+\W+){0,4}(grad|gradient)|"
      r"(none of the inputs|inputs?)\W+(\w+\W+){0,4}requires?_grad|"
      r"(encoder|conv|layers?)\w*\W+(\w+\W+){0,8}(no|none|zero|never)\W+(\w+\W+){0,3}(grad|gradient)\w*\W+(\w+\W+){0,6}checkpoint")
def waveform_encoder_reentrant_checkpoint(fixed: bool = False):
    seed(0)
    x, y = waveform_shapes(1600, 27)
    xv, yv = waveform_shapes(512, 28)
    model = CheckpointedConvNet(use_reentrant=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("waveform_encoder_reentrant_checkpoint", fixed_of(waveform_encoder_reentrant_checkpoint),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# 5. Ticket router with nn.Embedding.from_pretrained(vectors) (freeze=True by default) where the product codes that
#    decide the queue are out of the pretrained vocabulary and got zero vectors.

GENERAL, CODES = 80, 40


def routed_tickets(n: int, s: int, length: int = 10, n_queues: int = 5):
    """General words 0..79 (in the pretrained vocabulary) and one product code 80..119 that decides the queue."""
    g = gen(s)
    tokens = torch.randint(0, GENERAL, (n, length), generator=g)
    code = torch.randint(GENERAL, GENERAL + CODES, (n,), generator=g)
    tokens[torch.arange(n), torch.randint(0, length, (n,), generator=g)] = code
    return tokens, (code - GENERAL) % n_queues


def pretrained_vectors(dim: int = 32):
    vectors = torch.zeros(GENERAL + CODES, dim)
    vectors[:GENERAL] = torch.randn(GENERAL, dim, generator=gen(31))   # found in the word-vector file
    return vectors                                                     # OOV product codes stay at zero


class TicketRouter(nn.Module):
    def __init__(self, fixed: bool = False, n_queues: int = 5):
        super().__init__()
        self.emb = nn.Embedding.from_pretrained(pretrained_vectors(), freeze=not fixed)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, n_queues))

    def forward(self, tokens):
        return self.mlp(self.emb(tokens).mean(1))


@case("ticket_router_pretrained_embeddings_frozen", "what_is_trained",
      "nn.Embedding.from_pretrained(vectors) freezes the table by default (freeze=True): the 40 product codes that "
      "decide the queue are out of the word-vector vocabulary and were initialised to zero, and since the table never "
      "trains they all stay the same zero vector and cannot be told apart",
      r"from_pretrained|freeze\s*=|frozen\W+(\w+\W+){0,6}(embedding|table|vectors)|"
      r"(embedding|table|vectors?)\w*\W+(\w+\W+){0,8}(frozen|freeze|requires_grad\s*=?\s*false|not (trained|updated))|"
      r"(oov|out[- ]of[- ]vocab\w*|zero)\W+(\w+\W+){0,8}(vectors?|rows?|embeddings?)\W+(\w+\W+){0,8}(identical|same|never|frozen|indistinguishable)")
def ticket_router_pretrained_embeddings_frozen(fixed: bool = False):
    seed(0)
    x, y = routed_tickets(1600, 29)
    xv, yv = routed_tickets(512, 30)
    model = TicketRouter(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("ticket_router_pretrained_embeddings_frozen", fixed_of(ticket_router_pretrained_embeddings_frozen),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)


