"""Set q, family "mechanics": the optimizer, schedule, clipping or loss reduction make the updates wrong."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_q.registry import broken, loader, rng, seed, teacher_classes

# ---------------------------------------------------------------------------------------------------------------
# 1. Crop type from soil measurements: a warm-up LambdaLR whose lambda returns the learning rate itself.

BASE_LR, WARMUP = 3e-3, 50


def soil_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))


@broken("warmup_lambda_returns_lr", "mechanics",
        "The warm-up LambdaLR's lambda returns the learning rate itself (3e-3 * min(1, (step + 1) / 50)) instead of a "
        "multiplicative factor, so LambdaLR multiplies it by the base lr again and the run trains at 3e-3 * 3e-3 = "
        "9e-6.",
        "lr_lambda=lambda step: min(1.0, (step + 1) / 50)",
        "https://runebook.dev/en/docs/pytorch/generated/torch.optim.lr_scheduler.lambdalr",
        r"lambdalr|lr_lambda|multiplicative factor|(returns?|returning|gives) (the |an )?(absolute )?(learning "
        r"rate|lr)\b|(factor|multiplier) .{0,40}(not|instead of) (the |an )?(absolute )?(lr|learning rate)|(lr|learning "
        r"rate) (is )?(multiplied|scaled|applied) twice|9e-0?6|(base[_ ]lr|initial lr) ?(\*|times|multiplied by) "
        r".{0,30}(lr|learning rate)")
def warmup_lambda_returns_lr(fixed: bool = False):
    seed(30)
    x, y = teacher_classes(2400, 12, 5, s=161)
    model = soil_mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=BASE_LR)
    if fixed:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP))
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: BASE_LR * min(1.0, (step + 1) / WARMUP))
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(x[:1800], y[:1800]), 64),
                val_loader=loader(TensorDataset(x[1800:], y[1800:]), 300, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 2. Product-review sentiment with a tiny BERT: num_training_steps divided by the batch size twice.

GOOD, BAD = (5, 6, 7, 8), (9, 10, 11, 12)


class ReviewDataset(Dataset):
    """Token reviews [CLS]=2 + 8..24 word ids (5..59), right-padded with 0; label 1 when good words outnumber bad."""

    def __init__(self, n: int, s: int, max_len: int = 26):
        g = rng(s)
        self.ids = np.zeros((n, max_len), np.int64)
        self.mask = np.zeros((n, max_len), np.int64)
        self.labels = np.zeros(n, np.int64)
        i = 0
        while i < n:
            length = g.integers(8, 25)
            toks = g.integers(5, 60, size=length)
            good, bad = np.isin(toks, GOOD).sum(), np.isin(toks, BAD).sum()
            if good == bad:
                continue
            self.ids[i, 0], self.ids[i, 1:length + 1] = 2, toks
            self.mask[i, :length + 1] = 1
            self.labels[i] = int(good > bad)
            i += 1

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": torch.from_numpy(self.ids[i]), "attention_mask": torch.from_numpy(self.mask[i]),
                "labels": torch.tensor(self.labels[i])}


def tiny_bert_classifier():
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, pad_token_id=0)
    return BertForSequenceClassification(config)


@broken("bert_schedule_total_steps_divided_twice", "mechanics",
        "num_training_steps for get_linear_schedule_with_warmup is computed as epochs * len(train_loader) // "
        "batch_size, dividing by the batch size twice: the linear schedule is 10 steps long, so the learning rate "
        "reaches 0 at step 10 of the 320 the run takes.",
        "num_training_steps = epochs * len(train_loader)",
        "https://github.com/gaoyixu/CAIL2020-Argument-Mining/issues/1",
        r"num_training_steps|len\(train_loader\) ?// ?batch_size|divid\w* (by (the )?batch[_ ]size )?twice|"
        r"(schedule|scheduler|decay)\w* .{0,80}(is |was )?(\d+ steps long|shorter than|ends (at|after|before)|"
        r"finishes (at|after|before)|total (of )?\d+ steps).{0,80}(max_steps|run|training|\d+ (optimizer )?steps)|"
        r"(total|training) steps .{0,60}(too small|shorter than|less than|fewer than|smaller than) .{0,40}(max_steps|"
        r"the run|actual|real)")
def bert_schedule_total_steps_divided_twice(fixed: bool = False):
    from transformers import get_linear_schedule_with_warmup

    seed(31)
    batch_size, epochs = 32, 10
    train_loader = loader(ReviewDataset(1024, 171), batch_size)
    model = tiny_bert_classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    if fixed:
        num_training_steps = epochs * len(train_loader)
    else:
        num_training_steps = epochs * len(train_loader) // batch_size
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=int(0.06 * num_training_steps),
                                                num_training_steps=num_training_steps)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=train_loader,
                val_loader=loader(ReviewDataset(384, 172), 128, shuffle=False), loss_fn=None,
                max_steps=epochs * len(train_loader), clip_grad_norm=1.0)


# ---------------------------------------------------------------------------------------------------------------
# 3. Sleep staging from EEG band powers: Adam with eps=0.1 (TensorFlow's 'Inception' advice).


def eeg_band_powers(n: int, s: int):
    """Relative power in 16 EEG bands per 30 s epoch -> 5 sleep stages (a nonlinear teacher)."""
    g = rng(s)
    x = g.normal(size=(n, 16))
    w1, w2 = g.normal(size=(16, 24)) / 4.0, g.normal(size=(24, 5))
    y = (np.tanh(x @ w1) @ w2).argmax(1)
    return torch.tensor(x, dtype=torch.float32), torch.from_numpy(y)


@broken("adam_eps_tf_inception", "mechanics",
        "Adam is built with eps=0.1 (copied from TensorFlow's 'a good choice is 1.0 or 0.1' note for Inception) "
        "while this model's gradients are around 1e-3 to 1e-2: sqrt(v) + eps is dominated by eps, so each update is "
        "about lr * m / 0.1 and Adam degenerates into a slow, tiny-step SGD.",
        "torch.optim.Adam(model.parameters(), lr=1e-3)  # default eps=1e-8",
        "https://github.com/mlpnlp/mlpnlp-nmt/pull/4",
        r"\beps(ilon)?\b ?(=|of|is|set to)? ?(1(\.0)?|0\.1|1e-0?1|1e0)\b|\b(eps|epsilon)\b.{0,60}(too )?(large|big|"
        r"high|dominat)|denominator .{0,60}\b(eps|epsilon)\b")
def adam_eps_tf_inception(fixed: bool = False):
    seed(32)
    x, y = eeg_band_powers(2400, 181)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3) if fixed else \
        torch.optim.Adam(model.parameters(), lr=1e-3, eps=0.1)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:1800], y[:1800]), 64),
                val_loader=loader(TensorDataset(x[1800:], y[1800:]), 300, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 4. Crop yield from multispectral statistics: clip_grad_norm=0.1 copied from DETR onto an SGD regression.


def yield_plots(n: int, s: int):
    """10 standardized band statistics per field -> yield in t/ha (mean about 6, raw units)."""
    g = rng(s)
    x = g.normal(size=(n, 10))
    w = g.normal(size=10) / np.sqrt(10)
    y = 6.0 + 2.0 * np.tanh(x @ w) + 0.6 * x[:, 0] + 0.15 * g.normal(size=n)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y[:, None], dtype=torch.float32)


@broken("yield_clip_norm_from_detr", "mechanics",
        "clip_grad_norm=0.1 (DETR's value) is applied to an SGD regression whose gradient norm is in the tens: every "
        "step is clipped, so the parameters move 100x less than the learning rate implies and the model is still "
        "far from the targets at the end of the run.",
        "clip_grad_norm=None  # or a threshold above the usual gradient norm",
        "https://github.com/facebookresearch/detr/issues/198",
        r"clip\w*.{0,80}(every|each|all|100 ?%|most) (of the )?(steps|updates|batches|iterations)|(every|each|all) "
        r"(optimi[sz]er )?(step|update|batch|iteration)s? .{0,40}(is |are |was |were )?clipped|max_norm .{0,60}"
        r"(far )?(below|smaller|lower|less) than|clip_grad_norm ?= ?0\.1\b|(gradient|grad) norm .{0,60}(\d+ ?x|"
        r"times|orders? of magnitude) (larger|above|over|bigger)|(clip|clipping) (threshold|max_norm|value|norm) "
        r"(of \S+ )?(is )?(too (small|low|tight)|far too)")
def yield_clip_norm_from_detr(fixed: bool = False):
    seed(33)
    x, y = yield_plots(2400, 191)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                train_loader=loader(TensorDataset(x[:1800], y[:1800]), 64),
                val_loader=loader(TensorDataset(x[1800:], y[1800:]), 300, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300, clip_grad_norm=None if fixed else 0.1)


# ---------------------------------------------------------------------------------------------------------------
# 5. Microscopy denoising autoencoder: MSELoss(reduction='sum') with an SGD learning rate tuned for the mean.


def micro_patches(n: int, s: int, size: int = 16):
    """Clean (n, 1, 16, 16) patches of a few soft cells in [0, 1], and noisy copies (sigma 0.2)."""
    g = rng(s)
    yy, xx = np.mgrid[:size, :size]
    clean = np.zeros((n, 1, size, size), np.float32)
    for i in range(n):
        for _ in range(g.integers(1, 4)):
            cy, cx, r = g.uniform(0, size), g.uniform(0, size), g.uniform(1.5, 4)
            clean[i, 0] += 0.8 * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r ** 2))
    clean = np.clip(clean, 0, 1)
    noisy = np.clip(clean + g.normal(0, 0.2, size=clean.shape), 0, 1).astype(np.float32)
    return torch.from_numpy(noisy), torch.from_numpy(clean)


def denoiser() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 1, 3, padding=1), nn.Sigmoid())


@broken("denoiser_sum_reduction_sgd", "mechanics",
        "The denoiser is trained with nn.MSELoss(reduction='sum') over 32 x 256 pixels while the SGD learning rate "
        "was tuned for the mean: the gradient is about 8000x larger, the first updates overshoot, the sigmoid output "
        "saturates and the network stops learning.",
        "loss_fn=nn.MSELoss()  # reduction='mean'",
        "https://github.com/Alibaba-MIIL/ASL/issues/56",
        r"reduction ?= ?['\"]?sum|sum(med)? (over|across) (all )?(the )?(pixels|elements|batch|samples)|(sum|summed) "
        r"(reduction|loss)|loss (is )?summed|(sum|summed) instead of (the )?(mean|average)|scales? with (the )?(batch "
        r"size|number of (pixels|elements|samples))")
def denoiser_sum_reduction_sgd(fixed: bool = False):
    seed(34)
    noisy, clean = micro_patches(1200, 201)
    model = denoiser()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
                train_loader=loader(TensorDataset(noisy[:960], clean[:960]), 32),
                val_loader=loader(TensorDataset(noisy[960:], clean[960:]), 120, shuffle=False),
                loss_fn=nn.MSELoss() if fixed else nn.MSELoss(reduction="sum"), max_steps=300)
