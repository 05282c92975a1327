"""Set ab, family "mechanics": the optimizer, the schedule, the precision or the loss bookkeeping undo the update."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ab.cases_targets import DictRows
from benchmarks.blind_preflight_ab.cases_trained import _ticket_tokens
from benchmarks.blind_preflight_ab.registry import acc_of, case, fix, fixed_of, gen, loader, mean_over, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------
# 1. get_linear_schedule_with_warmup(num_training_steps=len(train_loader)) while training for many epochs.
# --------------------------------------------------------------------------------------------------------------

def _tiny_distilbert():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    cfg = DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=32,
                           dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=2, pad_token_id=0)
    return DistilBertForSequenceClassification(cfg)


def distilbert_schedule_one_epoch(fixed=False):
    from transformers import get_linear_schedule_with_warmup
    seed(0)
    ids, y = _ticket_tokens(1600, 17)
    mask = torch.ones_like(ids)
    model = _tiny_distilbert()
    train_loader = loader(DictRows(input_ids=ids[:1200], attention_mask=mask[:1200], labels=y[:1200]), 32)
    epochs = 8
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    total = len(train_loader) * epochs if fixed else len(train_loader)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=10, num_training_steps=total)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=train_loader,
                val_loader=loader(DictRows(input_ids=ids[1200:], attention_mask=mask[1200:], labels=y[1200:]), 100,
                                  shuffle=False),
                loss_fn=None, max_steps=len(train_loader) * epochs)


case("mechanics_schedule_total_one_epoch", "mechanics",
     "get_linear_schedule_with_warmup is given num_training_steps=len(train_loader), one epoch's batches, while the "
     "run lasts 8 epochs: the learning rate decays to 0 by the end of the first epoch and stays 0 for the other 7, "
     "so training stops early; pass len(train_loader) * epochs (the total number of optimizer steps).",
     r"num_training_steps|(lr|learning rate) (reaches|hits|decays to|drops to|is|becomes|stays at) (0|zero)|"
     r"(zero|0) (lr|learning rate)|(one|a single|first|1) epoch('s)? (of )?(batches|steps)|"
     r"len\(train_loader\) ?\* ?epochs|(schedule|scheduler)('s)? (total|length|horizon).{0,60}(short|less|fewer|than)|"
     r"(shorter|fewer steps) than (the )?(run|training|max_steps)|t_total")(
    distilbert_schedule_one_epoch)


@torch.no_grad()
def _hf_cls_acc(model, kw):
    def fn(m, b):
        logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        return (logits.argmax(-1) == b["labels"]).sum().item(), len(b["labels"])
    return mean_over(model, kw["val_loader"], fn)


fix("mechanics_schedule_total_one_epoch", fixed_of(distilbert_schedule_one_epoch), _hf_cls_acc, "val accuracy",
    steps=300)


# --------------------------------------------------------------------------------------------------------------
# 2. Hand-written accumulation: the loss_fn divides by the accumulation steps the loop already divides by.
# --------------------------------------------------------------------------------------------------------------

ACCUM = 4


def _delivery(n, s):
    g = gen(s)
    x = torch.randn(n, 14, generator=g)
    w = torch.randn(14, generator=g) / 3
    y = torch.tanh(x @ w) * 3 + 0.5 * x[:, 0] * x[:, 1] + 0.1 * torch.randn(n, generator=g)
    return x, y


def accumulation_divided_twice(fixed=False):
    seed(0)
    x, y = _delivery(2400, 18)
    model = nn.Sequential(nn.Linear(14, 64), nn.ReLU(), nn.Linear(64, 1))

    def loss_fn(model, batch):
        xb, yb = batch
        loss = F.mse_loss(model(xb)[:, 0], yb)
        return loss if fixed else loss / ACCUM          # "scale the loss for gradient accumulation"
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 16),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=loss_fn, accumulation_steps=ACCUM, max_steps=150)


case("mechanics_accumulation_divided_twice", "mechanics",
     "The loss function divides the loss by the accumulation steps (4) itself, while the training loop given "
     "accumulation_steps=4 already divides each micro-batch loss by 4: the gradient is 16x too small instead of 4x, "
     "which under plain SGD is a learning rate cut by 4; divide once (drop the division in the loss).",
     r"(divid|scal|normali[sz])\w* (twice|two times|double)|double[- ]?(count|divi|scal|normali)|"
     r"(divid|scal)\w* by (the )?(accumulation|grad\w*[_ ]accum)\w*( steps)? (twice|two times)|"
     r"(divided|scaled) by (the )?accumulation(_steps)? .{0,60}(again|already|as well|also)|"
     r"(16|sixteen)x? (too )?small|accumulation_steps\)? ?(\*\*|\^) ?2|"
     r"/ ?(accumulation_steps|accum|acc_steps|4)\b.{0,60}(already|loop|twice)|(loss|gradient)s? (is |are )?(4|four)x "
     r"(too )?small")(accumulation_divided_twice)

fix("mechanics_accumulation_divided_twice", fixed_of(accumulation_divided_twice),
    rmse_of(lambda m, b: (m(b[0])[:, 0], b[1])), "val RMSE", steps=150, higher=False)


# --------------------------------------------------------------------------------------------------------------
# 3. "bf16 training" done as model.to(torch.bfloat16): the weights themselves are bf16 and small updates round away.
# --------------------------------------------------------------------------------------------------------------

class ChurnNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return self.net(x.to(self.net[0].weight.dtype))


def pure_bf16_weights(fixed=False):
    seed(0)
    g = gen(19)
    x = torch.randn(2400, 20, generator=g)
    y = (x[:, :4] @ torch.randn(4, 4, generator=g) + x[:, 4:8]).argmax(1)
    model = ChurnNet()
    if not fixed:
        model = model.to(torch.bfloat16)                # "train in bf16"
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), precision="bf16", max_steps=300)


case("mechanics_pure_bf16_weights", "mechanics",
     "The model is cast with model.to(torch.bfloat16) so the parameters and the AdamW update are bf16: with about "
     "3 significant digits a weight of ~0.1 cannot change by lr=1e-4, the updates round to nothing and the loss "
     "barely moves; keep fp32 master weights and use torch.autocast(dtype=torch.bfloat16) for the forward.",
     r"(param\w*|weights?|master weights?) (are |is |stored |kept |held )?(in )?(bf16|bfloat16|half)|"
     r"(bf16|bfloat16|half)[- ](weights?|param\w*)|model\.to\(.{0,20}(bf16|bfloat16)|\.half\(\)|"
     r"(round|rounded|rounding) (away|off|to (zero|nothing))|(updates?|steps?) (below|smaller than|under) .{0,30}"
     r"(precision|resolution|ulp|spacing|epsilon)|fp32 master|master (weights|copy)|"
     r"(autocast|mixed precision) (instead|rather)")(pure_bf16_weights)

fix("mechanics_pure_bf16_weights", fixed_of(pure_bf16_weights), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------------------------
# 4. Adam(eps=1.0), the "good choice for Inception" value copied from the TensorFlow docs.
# --------------------------------------------------------------------------------------------------------------

def _listing(n, s):
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :3] @ torch.randn(3, 3, generator=g) + torch.relu(x[:, 3:6]) * 2).argmax(1)
    return x, y


def adam_eps_one(fixed=False):
    seed(0)
    x, y = _listing(2400, 20)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 3))
    eps = 1e-8 if fixed else 1.0
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3, eps=eps),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("mechanics_adam_eps_one", "mechanics",
     "Adam is built with eps=1.0 (the value TensorFlow's docs suggest for Inception on ImageNet): with gradients "
     "far below 1 the denominator sqrt(v) + eps is about 1, so each step is lr * m, plain SGD at lr=1e-3, and the "
     "model crawls; keep the default eps=1e-8.",
     r"eps(ilon)? ?(=|of|is) ?1(\.0)?\b|(large|big|huge) (adam )?eps(ilon)?|eps(ilon)?.{0,40}(large|too big|dominat)|"
     r"sqrt\(v\)|adam.{0,60}(plain |ordinary )?sgd|(behaves|acts|degenerat)\w* "
     r"(like|as|into) (plain |vanilla )?sgd")(adam_eps_one)

fix("mechanics_adam_eps_one", fixed_of(adam_eps_one), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------------------------
# 5. Multi-task loss weights made learnable as plain multipliers: w_churn * l_churn + w_spend * l_spend.
# --------------------------------------------------------------------------------------------------------------

class CustomerNet(nn.Module):
    def __init__(self, uncertainty: bool):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.churn = nn.Linear(64, 2)
        self.spend = nn.Linear(64, 1)
        self.uncertainty = uncertainty
        if uncertainty:
            self.log_var = nn.Parameter(torch.zeros(2))      # Kendall et al.: exp(-s) * L + s
        else:
            self.task_w = nn.Parameter(torch.ones(2))        # "let the model learn how to weigh the tasks"

    def forward(self, x):
        h = self.trunk(x)
        return self.churn(h), self.spend(h)[:, 0]

    def combine(self, l_churn, l_spend):
        if self.uncertainty:
            s = self.log_var
            return torch.exp(-s[0]) * l_churn + s[0] + torch.exp(-s[1]) * l_spend + s[1]
        return self.task_w[0] * l_churn + self.task_w[1] * l_spend


def _customers(n, s):
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    churn = ((x[:, 0] - x[:, 1] + 0.5 * x[:, 2] * x[:, 3]) > 0).long()
    spend = torch.tanh(x[:, 4] + x[:, 5]) + 0.3 * x[:, 6] + 0.1 * torch.randn(n, generator=g)
    return x, churn, spend


def learnable_task_weights(fixed=False):
    seed(0)
    x, churn, spend = _customers(2400, 22)
    model = CustomerNet(uncertainty=fixed)

    def loss_fn(model, batch):
        xb, cb, sb = batch
        logits, pred = model(xb)
        return model.combine(F.cross_entropy(logits, cb), F.mse_loss(pred, sb))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x[:2000], churn[:2000], spend[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], churn[2000:], spend[2000:]), 100, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


case("mechanics_learnable_task_weights", "mechanics",
     "The multi-task loss is task_w[0] * l_churn + task_w[1] * l_spend with task_w an nn.Parameter the optimizer "
     "also updates: the gradient on each weight is its (positive) task loss, so the weights are driven to 0 and then "
     "negative, the total loss runs off to minus infinity and the tasks are trained backwards; use the uncertainty "
     "form exp(-s) * L + s (or fixed weights).",
     r"(learn\w*|trainable|nn\.parameter|optimi[sz]ed) (loss |task )?weights?|task_w|"
     r"weights? .{0,40}(driven|go|goes|going|pushed|collaps\w*|shrink\w*) (to )?(zero|0|negative)|"
     r"negative (loss |task )?weights?|exp\(-\s*s\)|log[_ ]?var|uncertainty (weight|form)|kendall")(
    learnable_task_weights)

fix("mechanics_learnable_task_weights", fixed_of(learnable_task_weights),
    acc_of(lambda m, b: (m(b[0])[0].argmax(-1), b[1])), "val churn accuracy", steps=300)
