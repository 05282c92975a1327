"""Set ai, healthy cases: 5 corrected twins of broken cases (the same builder with its one-line fix) and 5 unusual but
correct setups of real-world shape. None may raise a warning or an error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.blind_preflight_ai.cases_data import FlipSeg, sampler_class_weights
from benchmarks.blind_preflight_ai.cases_mechanics import linear_schedule_epochs
from benchmarks.blind_preflight_ai.cases_shapes import bilstm_hn_view, blob_masks, hwc_reshape_to_chw, seg_net
from benchmarks.blind_preflight_ai.cases_targets import sensor_series
from benchmarks.blind_preflight_ai.cases_trained import nonlinear_classes, param_groups_miss_module
from benchmarks.blind_preflight_ai.registry import gen, healthy, loader, seed, twin

# --- corrected twins -------------------------------------------------------------------------------------------

healthy("ai_h_hwc_permute", "Twin of ai_hwc_reshape_to_chw: HWC uint8 images turned into CHW with permute(2, 0, 1) "
        "for a small global-pool CNN.")(twin(hwc_reshape_to_chw))
healthy("ai_h_bilstm_cat_directions", "Twin of ai_bilstm_hn_view: the BiLSTM text classifier concatenates h_n[0] "
        "and h_n[1] along the feature axis.")(twin(bilstm_hn_view))
healthy("ai_h_param_groups_complete", "Twin of ai_param_groups_miss_module: the two-tower recommender's hand-built "
        "parameter groups cover user and item embeddings, the user MLP and the bias.")(twin(param_groups_miss_module))
healthy("ai_h_linear_schedule_steps", "Twin of ai_linear_schedule_epochs: get_linear_schedule_with_warmup sized in "
        "optimizer steps (num_training_steps = max_steps).")(twin(linear_schedule_epochs))
healthy("ai_h_sampler_sample_weights", "Twin of ai_sampler_class_weights: WeightedRandomSampler with one weight per "
        "training row (1 / count of its class).")(twin(sampler_class_weights))

# --- unusual but correct ---------------------------------------------------------------------------------------


class BorderIgnored(Dataset):
    """Paired flips (one draw for image and mask), then the 1-pixel border marked 255 (annotation unsure)."""

    def __init__(self, x, m):
        self.inner = FlipSeg(x, m, fixed=True)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        img, mask = self.inner[i]
        mask = mask.clone()
        mask[0, :] = mask[-1, :] = 255
        mask[:, 0] = mask[:, -1] = 255
        return img, mask


@healthy("ai_h_seg_ignore_border", "Segmentation FCN with CrossEntropyLoss(weight=inverse class frequency, "
         "ignore_index=255) on masks whose 1-pixel border is 255, flips drawn once per image/mask pair, "
         "Adam with a cosine schedule.")
def seg_ignore_border():
    seed(0)
    x, m = blob_masks(500, 51)
    freq = torch.bincount(m[:400].reshape(-1).long(), minlength=3).float()
    weight = (freq.sum() / freq) / (freq.sum() / freq).mean()
    model = seg_net()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(BorderIgnored(x[:400], m[:400]), 16),
                val_loader=loader(BorderIgnored(x[400:], m[400:]), 50, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(weight=weight, ignore_index=255),
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=600), max_steps=600)


class TwoHeads(nn.Module):
    """Shared trunk, a 4-class head and a regression head, with learned task weights (Kendall et al.)."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.LayerNorm(64), nn.Linear(64, 64), nn.ReLU())
        self.cls = nn.Linear(64, 4)
        self.reg = nn.Linear(64, 1)
        self.log_vars = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        h = self.trunk(x)
        return self.cls(h), self.reg(h).squeeze(-1)


def uncertainty_weighted(model, batch):
    x, y_cls, y_reg = batch
    logits, value = model(x)
    losses = torch.stack([F.cross_entropy(logits, y_cls), F.mse_loss(value, y_reg)])
    return (torch.exp(-model.log_vars) * losses + model.log_vars).sum()


@healthy("ai_h_multitask_uncertainty", "Small multi-task tabular model (4-class head + regression head) whose loss "
         "weights are learned log-variances (an nn.Parameter in the optimizer), AdamW, (x, class, value) batches "
         "and a loss_fn(model, batch).")
def multitask_uncertainty():
    seed(0)
    x, y = nonlinear_classes(1500, 52)
    value = torch.tanh(x[:, :4].sum(1) / 2) + 0.05 * torch.randn(1500, generator=gen(53))
    model = TwoHeads()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4),
                train_loader=loader(TensorDataset(x[:1200], y[:1200], value[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:], value[1200:]), 300, shuffle=False),
                loss_fn=uncertainty_weighted, max_steps=800)


class ConvForecaster(nn.Module):
    """(B, T, C) sensor windows -> transpose to (B, C, T) for Conv1d -> next 4 values of channel 0."""

    def __init__(self, channels=2, horizon=4):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(channels, 16, 5, padding=2), nn.GELU(), nn.Conv1d(16, 16, 5, padding=2),
                                  nn.GELU())
        self.out = nn.Linear(16 * 24, horizon)

    def forward(self, x):
        h = self.conv(x.transpose(1, 2))
        return self.out(h.flatten(1))


@healthy("ai_h_conv1d_onecycle", "Multi-step forecaster: two-channel (B, T, C) windows transposed for Conv1d, "
         "4-step horizon, OneCycleLR stepped per batch with total_steps = max_steps, AdamW and clip_grad_norm=1.0.")
def conv1d_onecycle():
    seed(0)
    a, b = sensor_series(1700, 54), sensor_series(1700, 55)
    series = torch.stack([a, b], dim=1)                          # (T, 2)
    idx = range(0, 1700 - 24 - 4)
    x = torch.stack([series[i:i + 24] for i in idx])
    y = torch.stack([series[i + 24:i + 28, 0] for i in idx])
    model = ConvForecaster()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    max_steps = 600
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x[:1300], y[:1300]), 32),
                val_loader=loader(TensorDataset(x[1300:], y[1300:]), 200, shuffle=False),
                scheduler=torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=max_steps),
                loss_fn=nn.SmoothL1Loss(), clip_grad_norm=1.0, max_steps=max_steps)


class ChurnNet(nn.Module):
    """Numeric columns through BatchNorm1d, two categorical columns through embeddings."""

    def __init__(self):
        super().__init__()
        self.region = nn.Embedding(7, 4)
        self.plan = nn.Embedding(5, 3)
        self.bn = nn.BatchNorm1d(6)
        self.mlp = nn.Sequential(nn.Linear(6 + 4 + 3, 48), nn.ReLU(), nn.Linear(48, 2))

    def forward(self, num, cat):
        return self.mlp(torch.cat([self.bn(num), self.region(cat[:, 0]), self.plan(cat[:, 1])], dim=1))


def churn_ce(model, batch):
    num, cat, y = batch
    return F.cross_entropy(model(num, cat), y)


@healthy("ai_h_bf16_accum_groups", "Churn classifier with BatchNorm1d on numeric columns and two embeddings, AdamW "
         "with weight decay on matrices only (biases, norms and embeddings in a no-decay group; every parameter in "
         "one group), precision='bf16', accumulation_steps=4, clip_grad_norm=1.0.")
def bf16_accum_groups():
    seed(0)
    g = gen(56)
    n = 2000
    num = torch.randn(n, 6, generator=g) * torch.tensor([1.0, 10.0, 0.1, 3.0, 1.0, 50.0]) + 5
    cat = torch.stack([torch.randint(0, 7, (n,), generator=g), torch.randint(0, 5, (n,), generator=g)], dim=1)
    region_effect = torch.randn(7, generator=g)
    logit = (num[:, 1] - 5) / 10 - (num[:, 5] - 5) / 50 + region_effect[cat[:, 0]] + 0.8 * (cat[:, 1] == 2).float()
    y = (torch.rand(n, generator=g) < torch.sigmoid(2 * logit)).long()
    model = ChurnNet()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() == 2 and "region" not in name and "plan" not in name else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(num[:1600], cat[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(num[1600:], cat[1600:], y[1600:]), 400, shuffle=False),
                loss_fn=churn_ce, precision="bf16", accumulation_steps=4, clip_grad_norm=1.0, max_steps=300)


class Interactions(Dataset):
    """Observed (user, item) pairs only; negatives are sampled in the collate function."""

    def __init__(self, pairs):
        self.pairs = pairs

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        return self.pairs[i]


class NegativeSampler:
    """collate_fn: each positive pair plus 2 random items for the same user labelled 0."""

    def __init__(self, n_items, k=2, s=0):
        self.n_items, self.k, self.g = n_items, k, gen(s)

    def __call__(self, batch):
        pairs = torch.stack(batch)
        users = pairs[:, 0].repeat_interleave(1 + self.k)
        items = pairs[:, 1].repeat_interleave(1 + self.k).clone()
        neg = torch.ones_like(items, dtype=torch.bool)
        neg[:: 1 + self.k] = False
        items[neg] = torch.randint(0, self.n_items, (int(neg.sum()),), generator=self.g)
        return users, items, (~neg).float()


class DotModel(nn.Module):
    def __init__(self, n_users, n_items, k=16):
        super().__init__()
        self.u = nn.Embedding(n_users, k)
        self.i = nn.Embedding(n_items, k)
        self.ib = nn.Embedding(n_items, 1)
        nn.init.normal_(self.u.weight, std=0.1)
        nn.init.normal_(self.i.weight, std=0.1)
        nn.init.zeros_(self.ib.weight)

    def forward(self, users, items):
        return (self.u(users) * self.i(items)).sum(1) + self.ib(items).squeeze(-1)


@healthy("ai_h_implicit_negatives", "Implicit-feedback recommender: a Dataset of observed (user, item) pairs, a "
         "collate_fn that adds 2 sampled negatives per positive, binary_cross_entropy_with_logits(pos_weight=2) "
         "inside a loss_fn(model, batch), Adam.")
def implicit_negatives():
    seed(0)
    g = gen(57)
    n_users, n_items = 60, 120
    uf, itf = torch.randn(n_users, 4, generator=g), torch.randn(n_items, 4, generator=g)
    scores = uf @ itf.T
    top = scores.topk(15, dim=1).indices                      # each user interacted with 15 items they like
    pairs = torch.stack([torch.arange(n_users).repeat_interleave(15), top.reshape(-1)], dim=1)
    pairs = pairs[torch.randperm(len(pairs), generator=g)]
    def implicit_loss(model, batch):
        users, items, labels = batch
        logits = model(users, items)
        return F.binary_cross_entropy_with_logits(logits, labels,
                                                  pos_weight=torch.tensor(2.0, device=logits.device))

    model = DotModel(n_users, n_items)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=DataLoader(Interactions(pairs[:800]), batch_size=32, shuffle=True,
                                        generator=gen(58), collate_fn=NegativeSampler(n_items, s=59)),
                val_loader=DataLoader(Interactions(pairs[800:]), batch_size=100,
                                      collate_fn=NegativeSampler(n_items, s=60)),
                loss_fn=implicit_loss, max_steps=800)

