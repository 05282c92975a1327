"""Set g, family `mechanics`: optimizer / scheduler / loss-scaling / normalisation-state / RNG loop mechanics."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_g.registry import case, fix, loader, seed, teacher_classes, val_acc

# --------------------------------------------------------------------------- 1: SGD dampening set like momentum


def building_energy(n=4000, d=12, s=0):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, d, generator=g)
    y = torch.tanh(x @ torch.randn(d, generator=g) / 3) * 2 + 0.5 * x[:, 0] * x[:, 1] + 0.1 * torch.randn(n, generator=g)
    return x, (y - y.mean()) / y.std()


class EnergyMLP(nn.Module):
    def __init__(self, d=12):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@torch.no_grad()
def neg_val_mse(model, kw):
    x, y = kw["val_loader"].dataset.tensors
    return -F.mse_loss(model(x), y).item()


def _energy(fix=False):
    seed(0)
    x, y = building_energy(s=31)
    model = EnergyMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, dampening=0.0 if fix else 0.9)
    return dict(model=model, optimizer=opt,
                train_loader=loader(TensorDataset(x[:3400], y[:3400]), 64),
                val_loader=loader(TensorDataset(x[3400:], y[3400:]), 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=2000)


@case("building_energy_sgd_dampening_set_to_momentum", "mechanics",
      bug="the optimizer is SGD(lr=0.02, momentum=0.9, dampening=0.9), dampening set to the momentum value as if it "
          "were the decay of the momentum buffer: PyTorch then adds only (1 - dampening) = 0.1 of each gradient to "
          "the buffer, so every step is 10x smaller than the tuned SGD with momentum and the regressor is far from "
          "converged when the run ends (dampening=0)",
      cause_pattern=r"dampening|(effective|actual) (lr|learning.?rate|step( size)?|update)s?[^.]*(smaller|reduced|"
                    r"10 ?x|tenth|lower|divided)|momentum (buffer|term)[^.]*(0\.1|tenth|scaled|damp)")
def building_energy_sgd_dampening_set_to_momentum():
    return _energy()


def _fact_energy():
    p = nn.Parameter(torch.zeros(1))
    for damp in (0.0, 0.9):
        p.data.zero_()
        opt = torch.optim.SGD([p], lr=1.0, momentum=0.9, dampening=damp)
        for _ in range(50):
            p.grad = torch.ones(1)
            opt.step()
        print(f"  50 steps of a unit gradient with dampening={damp}: moved {-p.item():.1f}")


fix("building_energy_sgd_dampening_set_to_momentum", lambda: _energy(True), neg_val_mse, "-val MSE", _fact_energy)

# --------------------------------------------------------------------------- 2: warmup scheduler built, never stepped


def _gpt2(vocab=24, n_embd=48):
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=32, n_embd=n_embd, n_layer=2, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0))


class LMBatches(torch.utils.data.Dataset):
    def __init__(self, seqs):
        self.seqs = seqs

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return {"input_ids": self.seqs[i], "labels": self.seqs[i]}


def lm_val_loss(model, kw):
    model.eval()
    with torch.no_grad():
        losses = [model(**b).loss.item() for b in kw["val_loader"]]
    model.train()
    return -sum(losses) / len(losses)


def progressions(n=1600, length=16, vocab=24, s=0):
    g = torch.Generator().manual_seed(s)
    start = torch.randint(0, vocab - 3, (n, 1), generator=g)
    step = torch.randint(1, 5, (n, 1), generator=g)
    return (start + step * torch.arange(length)) % (vocab - 3) + 3


def _lm_schedules(fix=False, steps=2000):
    seed(0)
    seq = progressions(s=32)
    model = _gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=100)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps - 100)
    scheduler = torch.optim.lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[100]) if fix else cosine
    return dict(model=model, optimizer=opt, scheduler=scheduler,
                train_loader=loader(LMBatches(seq[:1280]), 32),
                val_loader=loader(LMBatches(seq[1280:]), 64, shuffle=False), loss_fn=None, max_steps=steps)


def _lm_fixed():
    kw = _lm_schedules(True, steps=300)
    return kw


@case("gpt2_warmup_scheduler_created_but_only_cosine_stepped", "mechanics",
      bug="a LinearLR warmup (start_factor=0.01, 100 steps) and a CosineAnnealingLR are both constructed on the "
          "AdamW optimizer, but only the cosine scheduler is stepped (SequentialLR was never used): the warmup's "
          "constructor already multiplied the LR by 0.01 and nothing ever undoes it, so the whole run trains at 1% of "
          "the intended 1e-3 (at most 1e-5), decaying from there (SequentialLR([warmup, cosine], milestones=[100]))",
      cause_pattern=r"LinearLR|start_factor|SequentialLR|warm.?up( scheduler| schedule)?[^.]*(never|not|orphan|unused|"
                    r"constructed|created|built)|(two|second|both|multiple|another) (lr )?schedulers?|(\blr\b|learning"
                    r".?rate)[^.]*(1 ?%|0\.01 ?(x|×|times)|100 ?(x|×|times) (smaller|lower|below)|stuck|never (rises|i"
                    r"ncreases|reaches|ramps))")
def gpt2_warmup_scheduler_created_but_only_cosine_stepped():
    return _lm_schedules()


def _fact_lm():
    kw = _lm_schedules()
    lrs = []
    for _ in range(300):
        kw["optimizer"].step()
        kw["scheduler"].step()
        lrs.append(kw["optimizer"].param_groups[0]["lr"])
    print(f"  LR at steps 0/100/299 with only the cosine stepped: {lrs[0]:.2e} / {lrs[100]:.2e} / {lrs[299]:.2e}")


def _lm_broken_300():
    return _lm_schedules(False, steps=300)


fix("gpt2_warmup_scheduler_created_but_only_cosine_stepped", lambda: _lm_schedules(True), lm_val_loss,
    "-val LM loss", _fact_lm)

# --------------------------------------------------------------------------- 3: loss clamped against spikes


def land_cover(n=5000, d=10, classes=16, s=0):
    x, y = teacher_classes(n, d, classes, s=s)
    return x, y


def clamped_ce(logits, y):
    return F.cross_entropy(logits, y).clamp(max=2.0)        # guard against loss spikes from bad tiles


class ClampedCE(nn.Module):
    def __init__(self, clamp=True):
        super().__init__()
        self.clamp = clamp

    def forward(self, logits, y):
        return clamped_ce(logits, y) if self.clamp else F.cross_entropy(logits, y)


def _land(fix=False):
    seed(0)
    x, y = land_cover(s=33)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 16))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:4200], y[:4200]), 64),
                val_loader=loader(TensorDataset(x[4200:], y[4200:]), 200, shuffle=False),
                loss_fn=ClampedCE(clamp=not fix), max_steps=2000)


@case("land_cover_loss_clamped_against_spikes", "mechanics",
      bug="the loss module returns F.cross_entropy(...).clamp(max=2.0) 'to guard against spikes': a 16-class "
          "classifier starts at ln 16 = 2.77 > 2, and clamp has zero gradient above its bound, so every batch's loss "
          "is the constant 2.0 with no gradient and the network never moves (remove the clamp; clip gradients "
          "instead)",
      cause_pattern=r"clamp|clip\w* (the )?loss|loss[^.]*(clamp|clipp|capped|\bcap\b|ceiling|saturat)|"
                    r"(zero|no) grad\w*[^.]*(above|exceed|over|beyond)|(above|exceed\w*|over) (the )?(cap|ceiling|bound)")
def land_cover_loss_clamped_against_spikes():
    return _land()


def _fact_land():
    kw = _land()
    x, y = next(iter(kw["train_loader"]))
    loss = kw["loss_fn"](kw["model"](x), y)
    loss.backward()
    print(f"  first batch loss {loss.item():.2f}; total grad norm "
          f"{sum(p.grad.norm() ** 2 for p in kw['model'].parameters()) ** 0.5:.2e}")


fix("land_cover_loss_clamped_against_spikes", lambda: _land(True), val_acc, "val acc", _fact_land)

# --------------------------------------------------------------------------- 4: per-group lambdas bound late


def heartbeats(n=3000, t=64, s=0):
    """ECG-like beats: 4 rhythm classes by the position and width of a spike, noise on top."""
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, 4, (n,), generator=g)
    centre = torch.tensor([12.0, 26.0, 40.0, 52.0])[y] + torch.randn(n, generator=g) * 2
    tt = torch.arange(t, dtype=torch.float32)
    x = torch.exp(-(tt - centre[:, None]) ** 2 / 8) * 2 + 0.4 * torch.randn(n, t, generator=g)
    return x[:, None], y


class BeatNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv1d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool1d(4),
                                      nn.Conv1d(16, 16, 5, padding=2), nn.ReLU(), nn.Flatten())
        self.head = nn.Linear(16 * 16, 4)

    def forward(self, x):
        return self.head(self.backbone(x))


def _beats(fix=False):
    seed(0)
    x, y = heartbeats(s=34)
    model = BeatNet()
    opt = torch.optim.Adam([{"params": model.head.parameters()},
                            {"params": model.backbone.parameters()}], lr=2e-3)
    freeze_until = (0, 1000)          # head trains at once; the backbone waits 1000 steps
    if fix:
        lambdas = [lambda step, f=f: float(step >= f) for f in freeze_until]
    else:
        lambdas = [lambda step: float(step >= f) for f in freeze_until]
    return dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambdas),
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 32),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


@case("ecg_per_group_lr_lambdas_bound_late", "mechanics",
      bug="the per-group LambdaLR factors are built as [lambda step: float(step >= f) for f in (0, 1000)] to train "
          "the head at once and keep the backbone still for 1000 steps: Python closures bind f late, so both lambdas "
          "use f = 1000 and the head's learning rate is 0 too; nothing trains for the first 1000 steps "
          "(bind it: lambda step, f=f: ...)",
      cause_pattern=r"late.?binding|closure|lambda[^.]*(loop|same|last|captur|bound|default arg)|(all|every|both) "
                    r"(param(eter)? )?groups?[^.]*(same|identical) (lr|learning.?rate|factor|schedule|lambda)|"
                    r"(head|group 0|first group|every group|all groups|both groups)[^.]*(lr|learning.?rate)[^.]*(zero|"
                    r"\b0(\.0)?\b)|(lr|learning.?rate)[^.]*(zero|\b0(\.0)?\b)[^.]*(head|every group|all groups|both "
                    r"groups|group 0|first group)")
def ecg_per_group_lr_lambdas_bound_late():
    return _beats()


def _fact_beats():
    kw = _beats()
    print(f"  LRs of (head, backbone) at step 0: {[g['lr'] for g in kw['optimizer'].param_groups]}")


fix("ecg_per_group_lr_lambdas_bound_late", lambda: _beats(True), val_acc, "val acc", _fact_beats)

# --------------------------------------------------------------------------- 5: BatchNorm statistics frozen at init


def pump_vibration(n=3000, d=20, s=0):
    """Raw-scale vibration features (offsets and scales differ a lot per column)."""
    g = torch.Generator().manual_seed(s)
    z = torch.randn(n, d, generator=g)
    y = (z @ torch.randn(d, 3, generator=g)).argmax(1)
    scale = torch.logspace(-1, 2, d)
    offset = torch.randn(d, generator=g) * 50
    return z * scale + offset, y


class VibrationNet(nn.Module):
    def __init__(self, d=20):
        super().__init__()
        self.net = nn.Sequential(nn.BatchNorm1d(d), nn.Linear(d, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, x):
        return self.net(x)


def freeze_bn_statistics(model):
    """Batches of 8 are too small for good statistics: freeze them (FrozenBatchNorm-style)."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.momentum = 0.0


def _vibration(fix=False):
    seed(0)
    x, y = pump_vibration(s=35)
    model = VibrationNet()
    if not fix:
        freeze_bn_statistics(model)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 8),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


@case("pump_vibration_batchnorm_statistics_frozen_at_init", "mechanics",
      bug="because the batches are small (8), every BatchNorm1d gets momentum=0.0 to 'freeze its statistics' "
          "(FrozenBatchNorm style), but the model is trained from scratch and nothing ever loaded statistics: the "
          "running mean/var stay at their init values 0 / 1, so training normalises with batch statistics while "
          "eval mode passes the raw-scale inputs (offsets ~50, scales up to 100) through unnormalised and the "
          "predictions break (keep the default momentum, or load pretrained statistics before freezing)",
      cause_pattern=r"(batch.?norm\w*|BN|running)[^.]*momentum|momentum ?= ?0(\.0)?\b|running (statistics|stats|mean|v"
                    r"ar)|(statistics|stats)[^.]*(frozen|never (updated|change)|at (their )?init\w*|0 ?/ ?1)|FrozenBat"
                    r"chNorm")
def pump_vibration_batchnorm_statistics_frozen_at_init():
    return _vibration()


def _fact_vibration():
    kw = _vibration()
    for x, _ in list(kw["train_loader"])[:20]:
        kw["model"](x)
    bn = kw["model"].net[0]
    print(f"  after 20 training batches: running_mean[:3] {bn.running_mean[:3].tolist()}, "
          f"batch feature means {x.mean(0)[:3].tolist()}")


fix("pump_vibration_batchnorm_statistics_frozen_at_init", lambda: _vibration(True), val_acc, "val acc (eval mode)",
    _fact_vibration)

# --------------------------------------------------------------------------- 6: param groups keyed 'learning_rate'


def weather_sequences(n=3000, t=16, s=0):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, t, 4, generator=g).cumsum(1) * 0.3
    y = torch.tanh(x[:, -1, 0] - x[:, -6, 1]) + 0.05 * torch.randn(n, generator=g)
    return x, y


class RainGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 48, batch_first=True)
        self.head = nn.Linear(48, 1)

    def forward(self, x):
        return self.head(self.gru(x)[1][-1]).squeeze(-1)


def _weather(fix=False):
    seed(0)
    x, y = weather_sequences(s=36)
    model = RainGRU()
    key = "lr" if fix else "learning_rate"
    opt = torch.optim.SGD([{"params": model.gru.parameters(), key: 0.05},
                           {"params": model.head.parameters(), key: 0.1}], lr=1e-4, momentum=0.9)
    return dict(model=model, optimizer=opt,
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 32),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=3000)


@case("weather_gru_param_groups_keyed_learning_rate", "mechanics",
      bug="the two parameter groups set their rates under the key 'learning_rate' (the Keras / TrainingArguments "
          "name); torch.optim only reads 'lr' and silently keeps unknown keys, so both groups run at the optimizer's "
          "fallback lr=1e-4 instead of 0.05 and 0.1, and the GRU barely trains ({'params': ..., 'lr': 0.05})",
      cause_pattern=r"['\"]learning_rate['\"]|learning_rate['\"]? key|key ['\"]?learning_rate|(unknown|unrecogni[sz]ed|"
                    r"unused|ignored|extra|misspelt|misspelled) (param(eter)?.?group )?(keys?|options?|entr\w+)|"
                    r"(keys?|options?)[^.]*(ignored|not recogni[sz]ed|misspel|typo)|['\"]lr['\"]")
def weather_gru_param_groups_keyed_learning_rate():
    return _weather()


def _fact_weather():
    opt = _weather()["optimizer"]
    print(f"  group lr / learning_rate: {[(g['lr'], g.get('learning_rate')) for g in opt.param_groups]}")


fix("weather_gru_param_groups_keyed_learning_rate", lambda: _weather(True), neg_val_mse, "-val MSE", _fact_weather)

# --------------------------------------------------------------------------- 7: negatives re-seeded every step

N_USERS, N_SHOP_ITEMS = 300, 500


def shop_interactions(n=8000, s=0):
    """Users and items in 8 taste clusters; a user buys items of their own cluster."""
    g = torch.Generator().manual_seed(s)
    user_c = torch.randint(0, 8, (N_USERS,), generator=g)
    item_c = torch.randint(0, 8, (N_SHOP_ITEMS,), generator=g)
    users = torch.randint(0, N_USERS, (n,), generator=g)
    items = torch.empty(n, dtype=torch.long)
    for c in range(8):
        pool = (item_c == c).nonzero().squeeze(1)
        rows = (user_c[users] == c).nonzero().squeeze(1)
        items[rows] = pool[torch.randint(0, len(pool), (len(rows),), generator=g)]
    return users, items, user_c, item_c


class MatrixFactorisation(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.users = nn.Embedding(N_USERS, dim)
        self.items = nn.Embedding(N_SHOP_ITEMS, dim)
        self.item_bias = nn.Embedding(N_SHOP_ITEMS, 1)
        nn.init.normal_(self.users.weight, std=0.1)
        nn.init.normal_(self.items.weight, std=0.1)
        nn.init.zeros_(self.item_bias.weight)

    def forward(self, users, items):
        return (self.users(users) * self.items(items)).sum(-1) + self.item_bias(items).squeeze(-1)


def bpr_reseeded(model, batch):
    users, pos = batch
    torch.manual_seed(0)                                    # reproducible negative sampling
    neg = torch.randint(0, N_SHOP_ITEMS, pos.shape)
    return -F.logsigmoid(model(users, pos) - model(users, neg)).mean()


class FreshNegatives:
    """BPR with its own generator: new negatives every call."""

    def __init__(self, s=0):
        self.g = torch.Generator().manual_seed(s)

    def __call__(self, model, batch):
        users, pos = batch
        neg = torch.randint(0, N_SHOP_ITEMS, pos.shape, generator=self.g)
        return -F.logsigmoid(model(users, pos) - model(users, neg)).mean()


@torch.no_grad()
def shop_auc(model, kw):
    users, pos = kw["val_loader"].dataset.tensors
    g = torch.Generator().manual_seed(99)
    neg = torch.randint(0, N_SHOP_ITEMS, (len(users), 20), generator=g)
    sp = model(users, pos)[:, None]
    sn = model(users[:, None].expand_as(neg), neg)
    return (sp > sn).float().mean().item()


def _shop(fix=False):
    seed(0)
    users, items, _, _ = shop_interactions(s=37)
    model = MatrixFactorisation()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-2),
                train_loader=loader(TensorDataset(users[:7000], items[:7000]), 64, drop_last=True),
                val_loader=loader(TensorDataset(users[7000:], items[7000:]), 250, shuffle=False),
                loss_fn=FreshNegatives() if fix else bpr_reseeded, max_steps=3000)


@case("shop_bpr_negatives_reseeded_every_step", "mechanics",
      bug="the BPR loss calls torch.manual_seed(0) before torch.randint(...) 'for reproducible negatives': the global "
          "RNG is reset on every call, so every step draws the very same 64 negative items; only those items are "
          "ever pushed down and the ranking against the other ~440 items is never trained (draw from one "
          "torch.Generator seeded once)",
      cause_pattern=r"manual_seed|re.?seed\w*|seed\w*[^.]*(every|each) (step|call|batch|forward|iteration)|(same|"
                    r"identical|fixed|repeated) (\d+ )?(negatives?|negative (items|samples)|random (numbers|draws|"
                    r"samples|indices)|samples? every)|(negatives?|random (numbers|draws))[^.]*(same|identical|repeat\w*)"
                    r" (every|each|on every)|(RNG|random (number )?generator)[^.]*(reset|re.?seed)")
def shop_bpr_negatives_reseeded_every_step():
    return _shop()


def _fact_shop():
    torch.manual_seed(0)
    a = torch.randint(0, N_SHOP_ITEMS, (64,))
    torch.manual_seed(0)
    b = torch.randint(0, N_SHOP_ITEMS, (64,))
    print(f"  negatives of two consecutive calls identical: {torch.equal(a, b)} ({len(set(a.tolist()))} distinct items)")


fix("shop_bpr_negatives_reseeded_every_step", lambda: _shop(True), shop_auc, "val AUC vs 20 random items",
    _fact_shop)
