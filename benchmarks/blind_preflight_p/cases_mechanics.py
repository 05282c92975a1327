"""Mechanics family: five real user bugs in how the optimisation runs (schedules, state, precision, checkpointing),
with a correct model, data and loss (no crash)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_p.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed, split

# --------------------------------------------------------------------------------------------------------------------
# 1. Review sentiment with a tiny BERT: get_linear_schedule_with_warmup given the number of epochs as its total.

EPOCHS, REVIEW_LEN = 10, 20


class ReviewDataset(Dataset):
    """Token ids (CLS=1, words 3..39); positive when word 5 ("great") outnumbers word 6 ("awful")."""

    def __init__(self, n: int, s: int):
        g = gen(s)
        rows, labels = [], []
        while len(rows) < n:
            words = torch.randint(3, 40, (REVIEW_LEN - 1,), generator=g)
            c5, c6 = (words == 5).sum().item(), (words == 6).sum().item()
            if c5 == c6:
                continue
            rows.append(torch.cat([torch.tensor([1]), words]))
            labels.append(int(c5 > c6))
        self.ids, self.labels = torch.stack(rows), torch.tensor(labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(REVIEW_LEN, dtype=torch.long),
                "labels": self.labels[i]}


def tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification
    config = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


@case("mechanics_reviews_schedule_total_is_epochs", "mechanics",
      bug="get_linear_schedule_with_warmup is given num_training_steps=EPOCHS (10) but stepped after every batch, as "
          "the Hugging Face loop does, so the learning rate warms up for 1 step, decays to 0 by step 10 and stays at 0 "
          "for the remaining ~310 optimizer steps.",
      fix_line="Count the schedule in optimizer steps: num_training_steps = EPOCHS * len(train_loader).",
      source="https://github.com/huggingface/transformers/issues/324",
      cause_pattern=r"num_training_steps|t_total|total (training |optimi[sz]er )?steps.{0,100}(epoch|too (small|short|"
                    r"few)|10\b)|(learning rate|\blr\b).{0,80}(reaches|decays? to|drops? to|falls to|hits|goes to|is|"
                    r"stays( at)?) (0|zero)\b|schedul\w*.{0,100}epochs?.{0,80}(per[- ](batch|step)|every (batch|step|"
                    r"optimi[sz]er step))|(stepped|called) (per|every|after each) (batch|step).{0,100}epoch",
      paraphrases=("The linear schedule's num_training_steps is 10 (the number of epochs) but scheduler.step() runs "
                   "per batch: the learning rate hits zero after 10 steps.",
                   "The LR decays to 0 within the first epoch because the total steps were counted in epochs instead "
                   "of optimizer steps."))
def reviews_schedule_total_is_epochs(fixed: bool = False) -> dict:
    from transformers import get_linear_schedule_with_warmup
    seed(0)
    model = tiny_bert()
    train_loader = loader(ReviewDataset(2000, 12), 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    num_training_steps = EPOCHS * len(train_loader) if fixed else EPOCHS
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=int(0.1 * num_training_steps),
                                                num_training_steps=num_training_steps)
    return dict(model=model, optimizer=optimizer, train_loader=train_loader,
                val_loader=loader(ReviewDataset(400, 13), 100, False), scheduler=scheduler,
                max_steps=EPOCHS * len(train_loader), clip_grad_norm=1.0)


fix("mechanics_reviews_schedule_total_is_epochs", fixed_of(reviews_schedule_total_is_epochs),
    acc_of(lambda m, b: (m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1),
                         b["labels"])), "val accuracy", steps=300)

# --------------------------------------------------------------------------------------------------------------------
# 2. ECG beat classification: a LambdaLR warm-up whose lambda returns a learning rate instead of a factor.

BEAT_LEN = 96


def _beats(n: int, s: int):
    """Single-lead beats: normal / premature ventricular (wide QRS) / atrial premature (early, narrow)."""
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    t = torch.arange(BEAT_LEN, dtype=torch.float32)
    center = torch.where(y == 2, 36.0, 48.0) + 4 * torch.randn(n, generator=g)
    width = torch.where(y == 1, 7.0, 2.5)
    x = torch.exp(-((t[None] - center[:, None]) / width[:, None]) ** 2) * (1 + 0.2 * torch.randn(n, 1, generator=g))
    x = x + 0.25 * torch.exp(-((t[None] - center[:, None] - 25) / 6.0) ** 2)          # T wave
    x = x + 0.08 * torch.randn(n, BEAT_LEN, generator=g)
    return x.unsqueeze(1), y


def beat_cnn():
    return nn.Sequential(nn.Conv1d(1, 16, 7, padding=3), nn.ReLU(), nn.MaxPool1d(2), nn.Conv1d(16, 32, 5, padding=2),
                         nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten(), nn.Linear(32, 3))


PEAK_LR, WARMUP = 1e-3, 50


@case("mechanics_ecg_lambdalr_returns_lr", "mechanics",
      bug="The LambdaLR warm-up lambda returns the learning rate itself (PEAK_LR * min(1, step / 50)), but LambdaLR "
          "multiplies the optimizer's lr=1e-3 by whatever the lambda returns, so the effective peak learning rate is "
          "1e-3 * 1e-3 = 1e-6.",
      fix_line="Return a factor, not a rate: lr_lambda=lambda step: min(1.0, (step + 1) / WARMUP).",
      source="https://runebook.dev/en/docs/pytorch/generated/torch.optim.lr_scheduler.lambdalr",
      cause_pattern=r"LambdaLR.{0,200}(multipl|factor|scal|times the (base|initial)|base_lr|initial (lr|learning "
                    r"rate))|lr_lambda.{0,160}(multipl|factor|absolute|scal|rate itself)|(multipl|factor).{0,100}"
                    r"(not|rather than|instead of).{0,40}(absolute|an? (lr|learning rate)|the rate)|"
                    r"(1e-3|0\.001)\s*[x×*]\s*(1e-3|0\.001)",
      paraphrases=("LambdaLR multiplies the base lr by the lambda's value; the lambda already returns 1e-3, so the "
                   "learning rate becomes 1e-3 x 1e-3 = 1e-6.",
                   "lr_lambda should return a multiplicative factor, not an absolute learning rate: the warm-up "
                   "scales the initial lr by 0.001."))
def ecg_lambdalr_returns_lr(fixed: bool = False) -> dict:
    seed(0)
    x, y = _beats(2000, 14)
    (xt, yt), (xv, yv) = split(x, y, 1700)
    model = beat_cnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=PEAK_LR)
    if fixed:
        lr_lambda = lambda step: min(1.0, (step + 1) / WARMUP)              # noqa: E731
    else:
        lr_lambda = lambda step: PEAK_LR * min(1.0, (step + 1) / WARMUP)    # noqa: E731
    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda),
                train_loader=loader(TensorDataset(xt, yt), 32), val_loader=loader(TensorDataset(xv, yv), 150, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("mechanics_ecg_lambdalr_returns_lr", fixed_of(ecg_lambdalr_returns_lr),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# 3. Store demand fine-tune: optimizer.load_state_dict() of the finished run restores its end-of-schedule lr.


def _demand(n: int, s: int, store: int):
    g = gen(80 + store)
    w = torch.randn(20, generator=g) / 20 ** 0.5
    v = torch.randn(20, generator=g) / 20 ** 0.5
    g = gen(s)
    x = torch.randn(n, 20, generator=g)
    y = 1.5 * torch.tanh(x @ w) + (x @ v) ** 2 * (0.3 + 0.4 * store) - 0.5 + 0.1 * torch.randn(n, generator=g)
    return x, y.view(-1, 1)


def demand_mlp():
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def _store_a_checkpoint() -> dict:
    """The finished run on store A: 60 steps under a cosine schedule that ends at eta_min=1e-7."""
    seed(1)
    model = demand_mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=60, eta_min=1e-7)
    x, y = _demand(60 * 32, 15, store=0)
    for i in range(60):
        opt.zero_grad()
        F.mse_loss(model(x[i * 32:(i + 1) * 32]), y[i * 32:(i + 1) * 32]).backward()
        opt.step()
        sched.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 60}


@case("mechanics_demand_optimizer_state_restores_lr", "mechanics",
      bug="Fine-tuning for store B builds Adam with lr=1e-3 and then calls optimizer.load_state_dict(ckpt['optimizer']) "
          "from the finished store-A run, which restores that run's param_groups, including its end-of-cosine "
          "lr=1e-7, so the new run trains at 1e-7.",
      fix_line="Start the fine-tune with a fresh optimizer: drop optimizer.load_state_dict(ckpt['optimizer']) (or reset "
               "each param_group['lr'] = 1e-3 after loading).",
      source="https://github.com/pytorch/examples/issues/816",
      cause_pattern=r"load_state_dict.{0,200}(\blr\b|learning rate)|(\blr\b|learning rate).{0,160}(restored|overwritten|"
                    r"overridden|replaced|loaded|comes|taken|reset) (from|by|with) (the )?(checkpoint|saved|previous|"
                    r"old|optimi[sz]er state)|param_groups\[.{0,60}\blr\b|(checkpoint|previous run|old run).{0,100}"
                    r"(\blr\b|learning rate).{0,60}(1e-0?7|end of|final|finished)",
      paraphrases=("optimizer.load_state_dict() brings back the checkpoint's param_groups, so the lr=1e-3 you passed "
                   "is overwritten by the saved lr of 1e-7.",
                   "The learning rate is restored from the checkpoint: the old run ended its cosine schedule at 1e-7 "
                   "and loading its optimizer state keeps that value."))
def demand_optimizer_state_restores_lr(fixed: bool = False) -> dict:
    ckpt = _store_a_checkpoint()
    seed(0)
    model = demand_mlp()
    model.load_state_dict(ckpt["model"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if not fixed:
        optimizer.load_state_dict(ckpt["optimizer"])    # "resume everything from the checkpoint"
    x, y = _demand(3000, 16, store=1)
    (xt, yt), (xv, yv) = split(x, y, 2500)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 250, False),
                loss_fn=nn.MSELoss(), max_steps=2000)


fix("mechanics_demand_optimizer_state_restores_lr", fixed_of(demand_optimizer_state_restores_lr),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE (store B demand)", steps=300, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# 4. Activity recognition: the whole model cast to bfloat16, so Adam's small updates round away in bf16 weights.


def _activity(n: int, s: int):
    g = gen(90)
    centers = torch.randn(6, 36, generator=g) * 0.7
    g = gen(s)
    y = torch.randint(0, 6, (n,), generator=g)
    return centers[y] + torch.randn(n, 36, generator=g), y


class ActivityMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(36, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 6))

    def forward(self, x):
        return self.net(x.to(self.net[0].weight.dtype))


@case("mechanics_activity_bf16_weights", "mechanics",
      bug="The model is cast with model.to(torch.bfloat16), so the weights themselves are bf16 (8 bits of mantissa) "
          "and there is no fp32 master copy: Adam's updates of ~1e-4 are smaller than half the bf16 spacing of most "
          "weights and are rounded away, so most weights never move.",
      fix_line="Keep the weights in float32 and run bf16 through autocast (precision='bf16'): drop model.to(torch.bfloat16).",
      source="https://github.com/workofart/ml-by-hand/pull/85",
      cause_pattern=r"(weights|parameters|params)\b.{0,60}\b(are|stored|kept|held|cast|converted)\b (in |to )?"
                    r"(bf16|bfloat16|torch\.bfloat16)|(bf16|bfloat16) (weights|parameters|params)\b|\.to\(\s*(dtype\s*=\s*)?torch\.bfloat16\s*\)|\.bfloat16\(\)|"
                    r"(fp32|float32) master|master (weights|copy)|updates?.{0,80}(rounded|lost|swallowed|vanish|"
                    r"below|smaller than|too small).{0,80}(bf16|bfloat16|precision|spacing|resolution|ulp)",
      paraphrases=("All parameters are stored in bfloat16 (model.to(torch.bfloat16)); with no fp32 master weights, "
                   "updates of 1e-4 are rounded away.",
                   "The optimizer updates are smaller than the bf16 spacing of the weights, so they vanish; keep float32 "
                   "weights and use autocast."))
def activity_bf16_weights(fixed: bool = False) -> dict:
    seed(0)
    x, y = _activity(3000, 17)
    (xt, yt), (xv, yv) = split(x, y, 2500)
    model = ActivityMLP()
    if not fixed:
        model = model.to(torch.bfloat16)              # "bf16 training: half the memory"
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-4),
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 250, False),
                loss_fn=nn.CrossEntropyLoss(), precision="bf16", max_steps=3000)


fix("mechanics_activity_bf16_weights", fixed_of(activity_bf16_weights),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)

# --------------------------------------------------------------------------------------------------------------------
# 5. Promoter detection: every conv block wrapped in checkpoint(use_reentrant=True) on inputs that need no grad.

DNA_LEN = 100
MOTIF = torch.tensor([3, 0, 3, 0, 0, 3])              # TATAAT


def _promoters(n: int, s: int):
    g = gen(s)
    seq = torch.randint(0, 4, (n, DNA_LEN), generator=g)
    y = (torch.rand(n, generator=g) < 0.5).long()
    pos = torch.randint(0, DNA_LEN - 6, (n,), generator=g)
    for i in range(n):
        if y[i]:
            seq[i, pos[i]:pos[i] + 6] = MOTIF
    return F.one_hot(seq, 4).float().transpose(1, 2), y      # (n, 4, 100) one-hot A C G T


class PromoterCNN(nn.Module):
    def __init__(self, reentrant: bool):
        super().__init__()
        self.reentrant = reentrant
        self.blocks = nn.ModuleList([nn.Sequential(nn.Conv1d(4, 32, 7, padding=3), nn.ReLU()),
                                     nn.Sequential(nn.Conv1d(32, 32, 5, padding=2), nn.ReLU())])
        self.head = nn.Linear(32, 2)

    def forward(self, onehot):
        h = onehot
        for block in self.blocks:                     # activation checkpointing to fit 10 kb windows later
            h = checkpoint(block, h, use_reentrant=self.reentrant)
        return self.head(h.amax(-1))


@case("mechanics_promoter_checkpoint_reentrant", "mechanics",
      bug="Each conv block runs under torch.utils.checkpoint.checkpoint(block, h, use_reentrant=True) and the one-hot "
          "DNA input does not require grad, so the reentrant checkpoint returns an output without a graph: the conv "
          "blocks get no gradient and only the linear head is trained.",
      fix_line="Use the non-reentrant checkpoint: checkpoint(block, h, use_reentrant=False).",
      source="https://github.com/huggingface/transformers/issues/21381",
      cause_pattern=r"use_reentrant|reentrant|checkpoint\w*.{0,200}(requires_grad|no grad|gradients? (will be|are|is) "
                    r"None|not (receive|get)|inputs? (do(es)? not|don't) require)|enable_input_require_grads",
      paraphrases=("With use_reentrant=True, torch.utils.checkpoint needs an input that requires grad; the one-hot "
                   "input does not, so the checkpointed conv blocks receive no gradients.",
                   "Activation checkpointing (reentrant variant) on a no-grad input: the blocks' gradients are None. "
                   "Pass use_reentrant=False."))
def promoter_checkpoint_reentrant(fixed: bool = False) -> dict:
    seed(0)
    x, y = _promoters(2000, 18)
    (xt, yt), (xv, yv) = split(x, y, 1700)
    model = PromoterCNN(reentrant=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 32), val_loader=loader(TensorDataset(xv, yv), 150, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("mechanics_promoter_checkpoint_reentrant", fixed_of(promoter_checkpoint_reentrant),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)
