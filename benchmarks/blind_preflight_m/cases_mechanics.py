"""Set m, family mechanics: the optimisation machinery (schedule, regularisation, loss scaling) works against the run."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_m.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
    teacher_classes,
    teacher_regression,
)

# --------------------------------------------------------------------------------------------------------------
# 1. Tiny BERT (from a config) for review sentiment; the linear schedule's num_training_steps is the number of
#    epochs. Source: https://github.com/cdqa-suite/cdQA/issues/262


def review_tokens(n, s, length=24, vocab=200):
    g = gen(s)
    y = torch.randint(0, 2, (n,), generator=g)
    ids = torch.randint(10, vocab, (n, length), generator=g)
    ids[:, 0] = 2                                                     # [CLS]
    pos_words, neg_words = torch.tensor([3, 4, 5]), torch.tensor([6, 7, 8])
    for i in range(n):
        k = int(torch.randint(1, 3, (1,), generator=g))
        where = 1 + torch.randperm(length - 1, generator=g)[:k]
        words = pos_words if y[i] else neg_words
        ids[i, where] = words[torch.randint(0, 3, (k,), generator=g)]
    return ids, y


class DictText(Dataset):
    def __init__(self, ids, y):
        self.ids, self.y = ids, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.y[i]}


def tiny_bert_classifier(labels=2):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=32, num_labels=labels)
    return BertForSequenceClassification(cfg)


@case("mech_schedule_total_is_epochs", "mechanics",
      "get_linear_schedule_with_warmup gets num_training_steps=3 (the number of epochs) instead of the number of "
      "optimizer steps, so the learning rate decays to zero after three steps and stays there.",
      r"num_training_steps|t_total|(number of |num_?)epochs.{0,60}(instead of|rather than|not).{0,30}steps|(learning rate"
      r"|lr|LR)\b.{0,40}(reaches|decays? to|drops? to|hits|is|falls to|becomes|to|at|=) (zero|0(\.0+)?(?![.\d]))"
      r"|schedule\w*.{0,60}(too short|ends|finishes|runs out)")
def mech_schedule_total_is_epochs(fixed=False):
    from transformers import get_linear_schedule_with_warmup
    seed(0)
    ids, y = review_tokens(1500, 31)
    model = tiny_bert_classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    epochs, max_steps = 3, 300
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0,
                                                num_training_steps=max_steps if fixed else epochs)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(DictText(ids[:1200], y[:1200]), 32),
                val_loader=loader(DictText(ids[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=None, max_steps=max_steps, clip_grad_norm=1.0)


fix("mech_schedule_total_is_epochs", fixed_of(mech_schedule_total_is_epochs),
    acc_of(lambda m, b: (m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1),
                         b["labels"])), "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 2. Wafer-defect CNN with a LambdaLR whose lambda returns the learning rate itself instead of a factor.
#    Source: https://github.com/lhoyer/MIC/issues/60


def wafer_maps(n, s, size=16):
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    x = 0.3 * torch.randn(n, 1, size, size, generator=g)
    for i in range(n):
        r, c = torch.randint(2, size - 2, (2,), generator=g).tolist()
        if y[i] == 1:                                   # scratch: a line
            x[i, 0, r, 2:size - 2] += 1.0
        elif y[i] == 2:                                 # spot
            x[i, 0, r - 1:r + 2, c - 1:c + 2] += 1.0
    return x, y


@case("mech_lambdalr_returns_lr", "mechanics",
      "The LambdaLR lambda returns 3e-3 * 0.999**step, an absolute learning rate, but LambdaLR multiplies the "
      "optimizer's lr by it, so the effective learning rate is about 9e-6.",
      r"LambdaLR.{0,80}(factor|multipl)|(multiplicative )?factor.{0,60}(not|instead of|rather than).{0,20}"
      r"(learning rate|lr)|(lambda|lr_lambda).{0,60}(returns?|gives?).{0,30}(absolute|learning rate|lr\b)"
      r"|(lr|learning rate) (is )?(applied |multiplied )?twice|9(\.0)?e-0?6|base[_ ]lr ?\*")
def mech_lambdalr_returns_lr(fixed=False):
    seed(0)
    x, y = wafer_maps(1500, 32)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(32, 3))
    base_lr = 3e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=base_lr)
    if fixed:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.999 ** step)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: base_lr * 0.999 ** step)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("mech_lambdalr_returns_lr", fixed_of(mech_lambdalr_returns_lr), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 3. Credit-scoring MLP ported from TF1, where dropout took keep_prob=0.9; in PyTorch nn.Dropout(p) is the drop
#    probability. Source: https://github.com/hassony2/kinetics_i3d_pytorch/issues/6

KEEP_PROB = 0.9


@case("mech_dropout_keep_prob", "mechanics",
      "The TF1 keep_prob=0.9 was passed as nn.Dropout(0.9), but PyTorch's p is the probability of zeroing, so 90% "
      "of the hidden units are dropped in every layer at every training step.",
      r"keep_?prob|(probability|fraction) (of )?(zeroing|dropping|being (zeroed|dropped))|(drop\w*|zero\w*) 90 ?%|"
      r"90 ?% of (the )?(hidden )?(units|activations|neurons)|Dropout\(0?\.9\)|p ?= ?0?\.9\b|1 ?- ?keep")
def mech_dropout_keep_prob(fixed=False):
    seed(0)
    x, y = teacher_classes(2400, 20, 3, s=33)
    p = 1 - KEEP_PROB if fixed else KEEP_PROB
    model = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Dropout(p), nn.Linear(128, 128), nn.ReLU(), nn.Dropout(p),
                          nn.Linear(128, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("mech_dropout_keep_prob", fixed_of(mech_dropout_keep_prob), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 4. Store-sales regression with accumulation_steps=8 handed to the loop, and a loss function that still divides
#    by the accumulation steps as in the manual loop it came from. Source: https://github.com/llm-random/llm-random/pull/529

ACCUM = 8


def sales_loss_prescaled(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y) / ACCUM            # "normalise for gradient accumulation"


def sales_loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


@case("mech_accumulation_scaled_twice", "mechanics",
      "The loss function already divides by the 8 accumulation steps and accumulation_steps=8 is also passed, so the "
      "loss is scaled by 1/64 and plain SGD takes steps 8 times smaller than intended.",
      r"(divid|scal|normali[sz])\w*.{0,40}twice|(twice|double)\w*.{0,20}(divid|scal|normali[sz])|1/64|/ ?64\b"
      r"|64 ?(times|x)|(loss|loss_fn|loss function).{0,60}already (divided|scaled|normali[sz]ed|averaged)"
      r"|accumulation.{0,60}(already|again|both)")
def mech_accumulation_scaled_twice(fixed=False):
    seed(0)
    x, y = teacher_regression(2400, 16, s=34)
    y = (y * 2).unsqueeze(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=sales_loss if fixed else sales_loss_prescaled, accumulation_steps=ACCUM, max_steps=400)


fix("mech_accumulation_scaled_twice", fixed_of(mech_accumulation_scaled_twice), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False, steps=150)


# --------------------------------------------------------------------------------------------------------------
# 5. VAE on absorption spectra: KL summed over batch and latents (from the PyTorch example, whose reconstruction
#    term is summed too) next to a per-element mean MSE. Source: https://github.com/zdebruine/MMVAE/pull/19


def spectra(n, s, d=64):
    g = gen(s)
    grid = torch.linspace(0, 1, d)
    centres = torch.rand(n, 3, 1, generator=g)
    heights = 0.3 + 0.7 * torch.rand(n, 3, 1, generator=g)
    x = (heights * torch.exp(-((grid - centres) ** 2) / 0.004)).sum(1)
    return (x + 0.02 * torch.randn(n, d, generator=g)).clamp(0, 1.5)


class SpectraVAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(64, 128), nn.ReLU())
        self.mu, self.logvar = nn.Linear(128, 8), nn.Linear(128, 8)
        self.dec = nn.Sequential(nn.Linear(8, 128), nn.ReLU(), nn.Linear(128, 64))

    def encode(self, x):
        h = self.enc(x)
        return self.mu(h), self.logvar(h)

    def forward(self, x):
        mu, logvar = self.encode(x)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(z), mu, logvar


def vae_loss_mean_recon(model, batch):
    (x,) = batch
    recon, mu, logvar = model(x)
    rec = F.mse_loss(recon, x)                                            # mean over every element
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())         # summed over batch and latents
    return rec + kld


def vae_loss_sum_recon(model, batch):
    (x,) = batch
    recon, mu, logvar = model(x)
    rec = F.mse_loss(recon, x, reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return rec + kld


@case("mech_vae_kl_sum_vs_mean_recon", "mechanics",
      "The VAE's KL term is summed over the batch and the latents while the reconstruction MSE is a per-element mean, "
      "so the KL outweighs it by orders of magnitude and the posterior collapses to the prior (the decoder outputs "
      "the mean spectrum).",
      r"posterior collapse|(KL|KLD|kl_?div\w*).{0,80}(dominat|outweigh|overwhelm|swamp|orders? of magnitude|much "
      r"larger|scale)|(sum|summed)\w*.{0,60}(mean|averaged)\w*.{0,40}(KL|reconstruction|MSE)|(reconstruction|MSE|mse_loss)"
      r".{0,60}(mean|averaged).{0,60}(KL|KLD).{0,30}sum|reduction\s*=\s*.sum.|(KL|reconstruction) (term )?(weight|scal)")
def mech_vae_kl_sum_vs_mean_recon(fixed=False):
    seed(0)
    x = spectra(2400, 35)
    model = SpectraVAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:]), 100, shuffle=False),
                loss_fn=vae_loss_sum_recon if fixed else vae_loss_mean_recon, max_steps=2000)


def recon_rmse(model, kw):
    def fn(m, b):
        mu, _ = m.encode(b[0])
        return ((m.dec(mu) - b[0]) ** 2).sum().item(), b[0].numel()
    return math.sqrt(mean_over(model, kw["val_loader"], fn))


fix("mech_vae_kl_sum_vs_mean_recon", fixed_of(mech_vae_kl_sum_vs_mean_recon), recon_rmse,
    "val reconstruction RMSE (decoding the posterior mean)", higher=False)
