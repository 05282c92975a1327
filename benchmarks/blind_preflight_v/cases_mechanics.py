"""Mechanics: five hand-written loop settings (schedule, precision, accumulation, clipping) that stop learning."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset
from transformers import get_linear_schedule_with_warmup

from benchmarks.blind_preflight_v.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed


# --------------------------------------------------------------------------- M1: HF linear schedule sized in epochs
class IntentBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(120, 32, mode="mean")
        self.out = nn.Linear(32, 6)

    def forward(self, ids):
        return self.out(self.bag(ids))


def _utterances(n, g):
    y = torch.randint(0, 6, (n,), generator=g)
    ids = torch.randint(30, 120, (n, 10), generator=g)
    k = torch.randint(0, 5, (n, 3), generator=g)
    ids[:, :3] = 5 * y[:, None] + k                       # three intent keywords, the rest filler
    ids = torch.gather(ids, 1, torch.argsort(torch.rand(n, 10, generator=g), 1))
    return ids, y


EPOCHS = 3


@case("hf_linear_schedule_sized_in_epochs", "mechanics",
      bug="get_linear_schedule_with_warmup is given num_training_steps=EPOCHS (3) instead of "
          "EPOCHS * len(train_loader) (300 optimizer steps), and is stepped every batch, so the learning rate "
          "decays to 0 after the third step and the other 297 steps update nothing.",
      cause_pattern=r"num_training_steps|get_linear_schedule|(learning rate|\blr\b)\w*.{0,60}(reach\w*|hits?|decays? to|"
                    r"drops? to|becomes?|is|at) (0|zero)\b|epochs? ?\* ?len\(|steps? per epoch|(schedule|scheduler)\w*"
                    r".{0,80}(sized|counted|measured|length|horizon|total).{0,40}(epochs?|3 steps)")
def linear_epochs(fixed: bool = False):
    seed(0)
    ids, y = _utterances(3600, gen(31))
    train = loader(TensorDataset(ids[:3200], y[:3200]), 32)
    model = IntentBag()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    total = EPOCHS * len(train) if fixed else EPOCHS
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=int(0.1 * total),
                                                num_training_steps=total)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=train,
                val_loader=loader(TensorDataset(ids[3200:], y[3200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=EPOCHS * len(train))


fix("hf_linear_schedule_sized_in_epochs", fixed_of(linear_epochs), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------- M2: pure bf16 weights
class QualityRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 1)

    def forward(self, x):
        x = x.to(self.fc1.weight.dtype)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x))))).squeeze(-1).float()


def _mos_scores(n, g):
    x = torch.randn(n, 16, generator=g)
    w1 = torch.randn(16, 4, generator=g) / 4
    y = torch.tanh(x @ w1).sum(1) + 0.05 * torch.randn(n, generator=g)
    return x, y


@case("model_cast_to_bfloat16_weights", "mechanics",
      bug="The model is cast with model.to(torch.bfloat16) to run in bf16, so the weights and the AdamW states are "
          "stored in bfloat16 (8-bit mantissa) and each update of about lr=2e-4 is below half the spacing between "
          "representable weights: it rounds away and the weights barely move. bf16 autocast keeps fp32 master "
          "weights.",
      cause_pattern=r"(bfloat16|bf16) (weights|parameters|params|model weights|master)|(weights|parameters|params) "
                    r"(are |were )?(stored |kept |cast )?(in|to|as) (torch\.)?(bfloat16|bf16)|master (weights|copy)"
                    r"|pure[- ]bf16|round\w* (away|off|to zero)|(updates?|steps?).{0,60}(smaller than|below|lost|vanish|"
                    r"rounded)|mantissa|\.to\(torch\.bfloat16\)|model\.bfloat16\(\)")
def bf16_weights(fixed: bool = False):
    seed(0)
    x, y = _mos_scores(2000, gen(32))
    model = QualityRegressor()
    if not fixed:
        model = model.to(torch.bfloat16)                  # "bf16 training" to halve memory
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.0),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), precision="bf16", max_steps=300)


fix("model_cast_to_bfloat16_weights", fixed_of(bf16_weights), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE",
    higher=False)


# --------------------------------------------------------------------------- M3: Noam lambda on top of a small lr
class TagCounter(nn.Module):
    def __init__(self, d_model=64):
        super().__init__()
        self.emb = nn.Embedding(30, d_model)
        self.pos = nn.Parameter(torch.randn(12, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, 4, 128, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(d_model, 3)

    def forward(self, ids):
        return self.out(self.enc(self.emb(ids) + self.pos).mean(1))


def _majority_tokens(n, g):
    kind = torch.randint(0, 3, (n, 12), generator=g)
    y = torch.mode(kind, 1).values
    ids = kind * 10 + torch.randint(0, 10, (n, 12), generator=g)
    return ids, y


def noam(d_model=64, warmup=400):
    return lambda step: d_model ** -0.5 * min((step + 1) ** -0.5, (step + 1) * warmup ** -1.5)


def noam_small_lr(fixed: bool = False):
    seed(0)
    ids, y = _majority_tokens(1700, gen(33))
    model = TagCounter()
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0 if fixed else 5e-4, betas=(0.9, 0.98), eps=1e-9)
    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, noam()),
                train_loader=loader(TensorDataset(ids[:1400], y[:1400]), 32),
                val_loader=loader(TensorDataset(ids[1400:], y[1400:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("noam_lambda_times_small_base_lr", "mechanics",
     bug="The Noam schedule is written as a LambdaLR whose lambda already returns the absolute learning rate "
         "d_model**-0.5 * min(step**-0.5, step * warmup**-1.5), but LambdaLR multiplies it by the optimizer's "
         "lr=5e-4, so the real learning rate never exceeds ~2e-6; with this lambda the base lr must be 1.0.",
     cause_pattern=r"LambdaLR.{0,120}(multipl|times|scal|factor|absolute)|(multipl\w*|times|scal\w*) .{0,40}(by )?(the )?"
                   r"(base|initial|optimi[sz]er'?s?) (lr|learning rate)|noam|d_model ?\*\* ?-0?\.5|base (lr|learning "
                   r"rate).{0,40}(1(\.0)?\b|one)|lr ?= ?1(\.0)?\b|(effective|actual|real|peak) (lr|learning rate).{0,60}"
                   r"(tiny|too (small|low)|never exceeds|\d(\.\d+)?e-0?[5-9])")(noam_small_lr)
fix("noam_lambda_times_small_base_lr", fixed_of(noam_small_lr), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------- M4: BatchNorm with micro-batches of one
class VibrationCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(1, 8, 5, padding=2), nn.BatchNorm1d(8), nn.ReLU(),
                                 nn.Conv1d(8, 8, 5, padding=2), nn.BatchNorm1d(8), nn.ReLU(),
                                 nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(8, 3))

    def forward(self, x):
        return self.net(x)


def _vibration(n, g):
    y = torch.randint(0, 3, (n,), generator=g)
    amp = torch.tensor([0.5, 1.0, 2.0])[y] * (0.9 + 0.2 * torch.rand(n, generator=g))
    t = torch.arange(64, dtype=torch.float32)
    f = 0.05 + 0.2 * torch.rand(n, 1, generator=g)
    sig = torch.sin(6.283 * f * t + 6.283 * torch.rand(n, 1, generator=g)) + 0.1 * torch.randn(n, 64, generator=g)
    return (amp[:, None] * sig)[:, None], y


@case("batchnorm_micro_batch_of_one", "mechanics",
      bug="The BatchNorm1d layers see micro-batches of a single clip (batch_size=1 with accumulation_steps=16 to "
          "'simulate' a batch of 16), so in training every clip is normalised by its own mean and variance, erasing "
          "the vibration level the classes differ by, and the running statistics used in eval match nothing "
          "that was trained.",
      cause_pattern=r"batch_?norm\w*.{0,120}(micro[- ]?batch|batch(_size)? ?(=|of|size) ?(1|one)\b|single (sample|clip|"
                    r"example)|per[- ]sample|accumulat\w*)|(micro[- ]?batch\w*|batch_size ?= ?1\b|single (sample|clip)|"
                    r"accumulat\w*).{0,120}batch_?norm|group_?norm|layer_?norm|instance[- ]norm")
def bn_micro(fixed: bool = False):
    seed(0)
    x, y = _vibration(1300, gen(34))
    model = VibrationCNN()
    bs, accum = (16, 1) if fixed else (1, 16)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1000], y[:1000]), bs),
                val_loader=loader(TensorDataset(x[1000:], y[1000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), accumulation_steps=accum, max_steps=120)


fix("batchnorm_micro_batch_of_one", fixed_of(bn_micro), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=120)


# --------------------------------------------------------------------------- M5: clip_grad_norm=0.0 meant as "off"
class LateFusion(nn.Module):
    def __init__(self):
        super().__init__()
        self.audio = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.video = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        return self.head(torch.cat([self.audio(x[:, :16]), self.video(x[:, 16:])], -1)).squeeze(-1)


CONFIG = {"lr": 3e-3, "grad_clip": 0.0}     # 0.0 = no clipping, as in the team's other trainer


@case("clip_grad_norm_zero_meant_off", "mechanics",
      bug="clip_grad_norm=0.0 is passed because the config uses grad_clip: 0.0 to mean 'no clipping', but "
          "clip_grad_norm_(params, max_norm=0.0) scales every gradient to norm zero, so no optimizer step changes a "
          "weight.",
      cause_pattern=r"clip_grad_norm\w*.{0,40}(=|of|to|at|is) ?(?<![\d.])0(\.0+)?(?![\d.])|clip_grad_norm\w*.{0,40}\bzero\b"
                    r"|max_norm ?= ?0(\.0+)?(?![\d.])|(clip|clipping)\w*.{0,60}(to|of|at) ((?<![\d.])0(\.0+)?(?![\d.])|"
                    r"zero\b)|(0|zero) (disables?|means? (off|no))|grad_clip|gradients? .{0,40}(scaled|clipped|multiplied|"
                    r"rescaled) (to|by) ((?<![\d.])0(?![\d.])|zero\b)")
def clip_zero(fixed: bool = False):
    seed(0)
    x, y = teacher_pairs(1800, gen(35))
    model = LateFusion()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=CONFIG["lr"]),
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), clip_grad_norm=None if fixed else CONFIG["grad_clip"], max_steps=300)


def teacher_pairs(n, g):
    a, v = torch.randn(n, 16, generator=g), torch.randn(n, 16, generator=g)
    wa, wv = torch.randn(16, generator=g) / 4, torch.randn(16, generator=g) / 4
    y = torch.tanh(a @ wa) * 2 + (v @ wv) * torch.sign(a[:, 0]) + 3.0 + 0.1 * torch.randn(n, generator=g)
    return torch.cat([a, v], 1), y


fix("clip_grad_norm_zero_meant_off", fixed_of(clip_zero), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE",
    higher=False)
