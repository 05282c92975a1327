"""Set o, family mechanics: the loss, the schedule or the layers compute something other than intended."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_o.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
    teacher_regression,
    tensors,
)

# --------------------------------------------------------------------------------------------------------------
# Credit-limit regressor with a LambdaLR whose lambda returns the learning rate itself, not a factor.
# Source: https://runebook.dev/en/docs/pytorch/generated/torch.optim.lr_scheduler.lambdalr


@case("mech_lambdalr_returns_lr_not_factor", "mechanics",
      "The decay is written LambdaLR(optimizer, lr_lambda=lambda step: 1e-3 * 0.999 ** step), returning the learning "
      "rate the user wants; LambdaLR multiplies the optimizer's base lr (1e-3) by what the lambda returns, so the "
      "actual learning rate is 1e-6 and decaying from the first step, and the regressor barely moves.",
      r"LambdaLR|lr_lambda|multiplicative factor|multiplie[sd] (by )?the (base|initial) (lr|learning rate)|base_lr ?\*"
      r"|factor,? not (an? |the )?(absolute )?(lr|learning rate)|1e-3 ?\* ?1e-3")
def build_credit(fixed: bool = False) -> dict:
    seed(0)
    x, y = teacher_regression(2000, 12, s=19)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if fixed:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda step: 0.999 ** step)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda step: 1e-3 * 0.999 ** step)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(tensors(x[:1600], y[:1600]), 32),
                val_loader=loader(tensors(x[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("mech_lambdalr_returns_lr_not_factor", fixed_of(build_credit), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False)


# --------------------------------------------------------------------------------------------------------------
# Star-rating regressor whose loss compares torch.round(prediction) with the integer ratings.
# Source: https://discuss.pytorch.org/t/torch-round-gradient/28628/4


def ratings(n: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    w = torch.randn(10, generator=g) / 10 ** 0.5
    stars = (3 + 1.3 * torch.tanh(x @ w) * 1.5 + 0.3 * torch.randn(n, generator=g)).round().clamp(1, 5)
    return x, stars


def rating_loss(fixed: bool):
    def loss_fn(model, batch):
        x, stars = batch
        pred = model(x)
        if fixed:
            return F.mse_loss(pred, stars)
        return F.mse_loss(torch.round(pred), stars)            # "ratings are whole stars"
    return loss_fn


@case("mech_round_inside_loss", "mechanics",
      "The rating loss is F.mse_loss(torch.round(pred), stars): round() is a step function whose gradient is zero "
      "everywhere, so the loss has a grad_fn but every weight gets a zero gradient and the rating model never moves "
      "from its initial predictions.",
      r"\bround\b|torch\.round|step function|non-?differentiable|straight[- ]through|piecewise constant"
      r"|no (useful )?gradient through")
def build_ratings(fixed: bool = False) -> dict:
    seed(0)
    x, stars = ratings(2000, 20)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(x[:1600], stars[:1600]), 32),
                val_loader=loader(tensors(x[1600:], stars[1600:]), 200, shuffle=False),
                loss_fn=rating_loss(fixed), max_steps=300)


fix("mech_round_inside_loss", fixed_of(build_ratings), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE (stars)",
    higher=False)


# --------------------------------------------------------------------------------------------------------------
# Click-through-rate model using functional dropout, F.dropout(x, 0.5) without training=self.training.
# Source: https://github.com/rixwew/pytorch-fm/issues/21

FIELDS = (40, 60, 25)


def impressions(n: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(s)
    cols = torch.stack([torch.randint(0, k, (n,), generator=g) for k in FIELDS], 1)
    tables = [torch.randn(k, 3, generator=gen(21 + j)) for j, k in enumerate(FIELDS)]
    e = [t[cols[:, j]] for j, t in enumerate(tables)]
    logit = e[0][:, 0] + e[1][:, 0] + e[2][:, 0] + 0.5 * (e[0][:, 1:] * e[1][:, 1:]).sum(-1) \
        + 0.3 * torch.randn(n, generator=g)
    return cols, (logit > 0).float()


class CTRNet(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.ModuleList(nn.Embedding(k, 8) for k in FIELDS)
        self.fc1, self.fc2 = nn.Linear(24, 64), nn.Linear(64, 1)

    def drop(self, h):
        return F.dropout(h, 0.5, training=self.training) if self.fixed else F.dropout(h, 0.5)

    def forward(self, cols):
        h = torch.cat([emb(cols[:, j]) for j, emb in enumerate(self.emb)], -1)
        h = self.drop(F.relu(self.fc1(self.drop(h))))
        return self.fc2(h).squeeze(-1)


def ctr_loss(model, batch):
    cols, y = batch
    return F.binary_cross_entropy_with_logits(model(cols), y)


@case("mech_functional_dropout_active_in_eval", "mechanics",
      "The CTR network calls F.dropout(h, 0.5) in forward without training=self.training; the functional form "
      "defaults to training=True and does not follow model.eval(), so half the embeddings and hidden units are "
      "still dropped at validation and serving time and the predictions are noisy.",
      r"F\.dropout|functional dropout|training ?= ?self\.training|dropout (is |stays |remains )?(still )?(active|on|"
      r"enabled) (in|during|at) (eval|inference|validation|test)|nn\.Dropout (module|layer)|does not follow "
      r"(model\.)?eval")
def build_ctr(fixed: bool = False) -> dict:
    seed(0)
    cols, y = impressions(12000, 22)
    model = CTRNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(tensors(cols[:10000], y[:10000]), 128),
                val_loader=loader(tensors(cols[10000:], y[10000:]), 500, shuffle=False),
                loss_fn=ctr_loss, max_steps=400)


@torch.no_grad()
def ctr_logloss(model, kw) -> float:
    def fn(m, b):
        return F.binary_cross_entropy_with_logits(m(b[0]), b[1], reduction="sum").item(), b[1].numel()
    return mean_over(model, kw["val_loader"], fn)


fix("mech_functional_dropout_active_in_eval", fixed_of(build_ctr), ctr_logloss, "val log loss", steps=400,
    higher=False)


# --------------------------------------------------------------------------------------------------------------
# VAE on sensor snapshots with the KL term added with the wrong sign.
# Source: https://github.com/pytorch/examples/issues/824, https://github.com/keras-team/keras/issues/4967


def manifold(n: int, s: int) -> torch.Tensor:
    g = gen(s)
    z = torch.rand(n, 2, generator=g) * 2 - 1
    a, b = torch.randn(2, 16, generator=gen(23)), torch.randn(16, 20, generator=gen(24)) / 4
    return torch.tanh(z @ a) @ b + 0.02 * torch.randn(n, 20, generator=g)


class SnapshotVAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
        self.dec = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 20))

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, -1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp() if self.training else mu
        return self.dec(z), mu, logvar


def vae_loss(fixed: bool):
    def loss_fn(model, batch):
        x = batch[0]
        recon, mu, logvar = model(x)
        rec = F.mse_loss(recon, x, reduction="sum") / x.size(0)
        kld = 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / x.size(0)
        return rec - kld if fixed else rec + kld
    return loss_fn


@torch.no_grad()
def recon_rmse(model, kw) -> float:
    def fn(m, b):
        recon, _, _ = m(b[0])
        return ((recon - b[0]) ** 2).sum().item(), b[0].numel()
    return mean_over(model, kw["val_loader"], fn) ** 0.5


@case("mech_vae_kl_added_with_wrong_sign", "mechanics",
      "The VAE loss is recon + kld with kld = 0.5 * sum(1 + logvar - mu^2 - exp(logvar)), which is minus the KL "
      "divergence: minimising it maximises the KL, pushing mu and logvar apart without bound, the loss goes negative "
      "and the reconstructions degrade instead of the posterior being pulled to N(0, I).",
      r"\bKL\b|Kullback|\bkld\b|\bsign\b|ELBO|-0\.5 ?\*|maximi[sz]\w* the (KL|divergence)")
def build_vae(fixed: bool = False) -> dict:
    seed(0)
    x = manifold(2400, 25)
    model = SnapshotVAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(tensors(x[:2000]), 64),
                val_loader=loader(tensors(x[2000:]), 200, shuffle=False),
                loss_fn=vae_loss(fixed), max_steps=300)


fix("mech_vae_kl_added_with_wrong_sign", fixed_of(build_vae), recon_rmse, "val reconstruction RMSE", higher=False)


# --------------------------------------------------------------------------------------------------------------
# News-topic classifier whose raw logits go straight into nn.NLLLoss (no log_softmax).
# Source: https://codestudyblog.com/8ten8/80409021901.html


def topic_docs(n: int, s: int, length: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids 0-39 are topic words (10 per topic), 40-299 shared vocabulary; 4 topic words per document."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    docs = torch.randint(40, 300, (n, length), generator=g)
    topic_words = y.unsqueeze(1) * 10 + torch.randint(0, 10, (n, 4), generator=g)
    docs[:, :4] = topic_words
    return docs, y


class BagClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(300, 32, mode="mean")
        self.out = nn.Linear(32, 4)

    def forward(self, docs):
        return self.out(self.bag(docs))


@case("mech_nll_loss_on_raw_logits", "mechanics",
      "The topic classifier returns raw logits from its last nn.Linear and is trained with nn.NLLLoss, which expects "
      "log-probabilities (log_softmax): NLLLoss just takes -logit[target], which can be lowered without bound by "
      "inflating the target logit, so the loss runs negative and the classes are never normalised against each other.",
      r"log_?softmax|LogSoftmax|log[- ]probabilit|CrossEntropyLoss|raw (logits|scores)|unnormali[sz]ed|NLLLoss "
      r"(expects|needs|requires)")
def build_topics(fixed: bool = False) -> dict:
    seed(0)
    docs, y = topic_docs(2400, 26)
    model = BagClassifier()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(docs[:2000], y[:2000]), 32),
                val_loader=loader(tensors(docs[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss() if fixed else nn.NLLLoss(), max_steps=300)


fix("mech_nll_loss_on_raw_logits", fixed_of(build_topics), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")
