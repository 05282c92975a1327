"""Set am, healthy cases: 5 corrected twins of broken cases and 5 unusual but correct setups."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from benchmarks.blind_preflight_am import cases_data, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_am.registry import gen, healthy, loader, seed, twin

healthy("am_ok_horizon_transposed", "Twin of am_horizon_target_extra_dim: the (batch, 1, 6) output transposed to "
        "(batch, 6, 1), the targets' layout.")(twin(cases_shapes.horizon_target_extra_dim))
healthy("am_ok_mf_dot_sum_dim1", "Twin of am_mf_dot_sum_no_dim: the user-item interaction summed over dim=1.")(
    twin(cases_shapes.mf_dot_sum_no_dim))
healthy("am_ok_window_next_step", "Twin of am_window_label_is_last_input: the label is the value right after the "
        "window.")(twin(cases_targets.window_label_is_last_input))
healthy("am_ok_dense_embeddings_adam", "Twin of am_sparse_adam_only_embeddings: dense embeddings and Adam over all "
        "parameters.")(twin(cases_trained.sparse_adam_only_embeddings))
healthy("am_ok_windows_then_shuffle", "Twin of am_shuffle_before_windowing: windows cut from the ordered series, "
        "the DataLoader shuffles the windows.")(twin(cases_data.shuffle_before_windowing))

# ---------------------------------------------------------------------------------------------------------------

QUANTILES = (0.1, 0.5, 0.9)


def pinball_three(model, batch):
    x, y = batch
    out = model(x)                                        # (batch, 3)
    q = torch.tensor(QUANTILES, device=out.device, dtype=out.dtype)
    err = y.unsqueeze(1) - out                            # (batch, 1) - (batch, 3): broadcast on purpose
    return torch.maximum(q * err, (q - 1) * err).mean()


@healthy("am_ok_quantile_three_heads", "Three quantile heads (P10/P50/P90) trained with one pinball loss whose "
         "(batch, 1) targets broadcast against the (batch, 3) outputs on purpose; a (3,) quantile tensor made on the "
         "outputs' device.")
def quantile_three_heads():
    seed(0)
    x, y = cases_targets.hetero(3000, 51)
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 128),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 500, shuffle=False),
                loss_fn=pinball_three, max_steps=400)

# ---------------------------------------------------------------------------------------------------------------


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.user_tower = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 32))
        self.item_tower = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, users, items):
        q = nn.functional.normalize(self.user_tower(users), dim=-1)
        d = nn.functional.normalize(self.item_tower(items), dim=-1)
        return q, d


def in_batch_softmax(model, batch):
    users, items = batch
    q, d = model(users, items)
    logits = q @ d.T / 0.1                                # every other item in the batch is a negative
    labels = torch.arange(logits.shape[0], device=logits.device)
    return nn.functional.cross_entropy(logits, labels)


@healthy("am_ok_two_tower_in_batch", "A two-tower retrieval model trained with in-batch negatives: (batch, batch) "
         "logits, labels = torch.arange(batch) made inside the loss on the logits' device, no label tensor in the "
         "batch, a temperature of 0.1.")
def two_tower_in_batch():
    seed(0)
    g = gen(52)
    latent = torch.randn(4000, 8, generator=g)
    users = latent @ torch.randn(8, 12, generator=g) + 0.1 * torch.randn(4000, 12, generator=g)
    items = latent @ torch.randn(8, 10, generator=g) + 0.1 * torch.randn(4000, 10, generator=g)
    model = TwoTower()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(users, items), 128, drop_last=True),
                loss_fn=in_batch_softmax, max_steps=400)

# ---------------------------------------------------------------------------------------------------------------


@healthy("am_ok_cox_descending", "A DeepSurv Cox model with the partial likelihood done right (sorted by time "
         "descending, logcumsumexp), heavy censoring, event times rounded to whole months (ties) and no val_loader.")
def cox_descending():
    seed(0)
    x, time, event = cases_targets.survival(2000, 53)
    time = torch.ceil(time * 12)                          # months: many ties
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, time, event), 256),
                loss_fn=cases_targets.cox_loss(descending=True), max_steps=300)

# ---------------------------------------------------------------------------------------------------------------


class SessionBag(nn.Module):
    def __init__(self, n_items):
        super().__init__()
        self.emb = nn.Embedding(n_items + 1, 16, padding_idx=0)   # 0 is the padding, ids are shifted by one
        self.head = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, ids):
        mask = (ids != 0).unsqueeze(-1).to(self.emb.weight.dtype)
        pooled = (self.emb(ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.head(pooled)


@healthy("am_ok_padded_sessions", "Variable-length shopping sessions right-padded with id 0, item ids shifted by "
         "one so 0 is only padding, nn.Embedding(padding_idx=0) and a masked mean; purchase prediction.")
def padded_sessions():
    seed(0)
    g = gen(54)
    n, n_items, max_len = 3000, 300, 12
    item_score = torch.randn(n_items, generator=g)
    lengths = torch.randint(2, max_len + 1, (n,), generator=g)
    items = torch.randint(0, n_items, (n, max_len), generator=g)
    valid = torch.arange(max_len)[None, :] < lengths[:, None]
    score = (item_score[items] * valid).sum(1) / lengths
    y = (score > score.median()).long()
    ids = torch.where(valid, items + 1, torch.zeros_like(items))
    model = SessionBag(n_items)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:2500], y[:2500]), 64),
                val_loader=loader(TensorDataset(ids[2500:], y[2500:]), 500, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)

# ---------------------------------------------------------------------------------------------------------------


@healthy("am_ok_weighted_sampler_bf16", "A 5%-positive default model balanced by a WeightedRandomSampler with one "
         "weight per sample (so no shuffle=True), a plain CrossEntropyLoss, bf16 precision and gradient clipping.")
def weighted_sampler_bf16():
    seed(0)
    x, y = cases_data.defaults(6000, 55, 0.05)
    counts = torch.bincount(y).float()
    sampler = WeightedRandomSampler((1.0 / counts)[y], num_samples=len(y), replacement=True,
                                    generator=torch.Generator().manual_seed(9))
    model = cases_data.Logit2()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2),
                train_loader=DataLoader(TensorDataset(x, y), batch_size=128, sampler=sampler),
                loss_fn=nn.CrossEntropyLoss(), precision="bf16", clip_grad_norm=1.0, max_steps=400)
