"""Set ap, family data: what the loader (or the graph handed to the model) contains is wrong."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from .cases_targets import EpsNet
from .registry import (
    T_STEPS,
    Views,
    alpha_bar,
    case,
    eps_mse,
    fix,
    fixed_of,
    graph_loader,
    knn_of,
    loader,
    manifold,
    node_acc,
    sbm_graph,
    seed,
)


# ---------------------------------------------------------------------------------------------------------
class OneHopGCN(nn.Module):
    """Hand-written propagation: mean over the rows of the adjacency handed in, then an MLP."""

    def __init__(self, d=16, h=32, c=4):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, c))

    def forward(self, x, a_hat):
        return self.mlp(a_hat @ x)


def mean_adj(adj, self_loops=True):
    a = adj + torch.eye(len(adj)) if self_loops else adj
    return a / a.sum(1, keepdim=True).clamp(min=1)


def node_loss(model, batch):
    x, a_hat, y, mask = batch
    return F.cross_entropy(model(x, a_hat)[mask], y[mask])


@case("d_gnn_adjacency_without_self_loops", "data",
      "The normalised adjacency is built from A alone, without adding the identity (A + I), so a node's "
      "representation is the mean of its neighbours only and its own features, the strongest signal for its label, "
      "never reach the classifier.",
      r"self[- ]?loops?|A ?\+ ?I|own features|torch\.eye|add_self_loops|neighbou?rs only|renormali[sz]")
def d_gnn_adjacency_without_self_loops(fixed: bool = False):
    seed(0)
    x, adj, y, train, val = sbm_graph(s=3, same=1, rand=5, signal=1.2)
    a_hat = mean_adj(adj, self_loops=fixed)
    model = OneHopGCN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4),
                train_loader=graph_loader(x, a_hat, y, train), val_loader=graph_loader(x, a_hat, y, val),
                loss_fn=node_loss, max_steps=200)


fix("d_gnn_adjacency_without_self_loops", fixed_of(d_gnn_adjacency_without_self_loops), node_acc,
    "val node accuracy", steps=200)


# ---------------------------------------------------------------------------------------------------------
@case("d_gnn_train_mask_long_not_bool", "data",
      "The train mask is a 0/1 integer (torch.long) tensor, so out[mask] and y[mask] are integer indexing that "
      "selects nodes 0 and 1 over and over instead of boolean masking the training nodes: the model is fit on two "
      "nodes; the mask must be dtype=torch.bool.",
      r"bool|torch\.long|long tensor|int(eger)? (mask|index|tensor)|0/1 integer|dtype|nodes? 0 and 1|two nodes")
def d_gnn_train_mask_long_not_bool(fixed: bool = False):
    seed(0)
    x, adj, y, train, val = sbm_graph(s=4)
    a_hat = mean_adj(adj)
    mask = train if fixed else train.long()
    vmask = val if fixed else val.long()
    model = OneHopGCN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4),
                train_loader=graph_loader(x, a_hat, y, mask), val_loader=graph_loader(x, a_hat, y, vmask),
                loss_fn=node_loss, max_steps=200)


fix("d_gnn_train_mask_long_not_bool", fixed_of(d_gnn_train_mask_long_not_bool), node_acc, "val node accuracy",
    steps=200)


# ---------------------------------------------------------------------------------------------------------
@case("d_simclr_both_views_identical", "data",
      "The dataset's __getitem__ augments once and returns the same tensor as both views (v2 = v1), so the positive "
      "pair is identical: instance discrimination is solved from the nuisance features and nothing augmentation-"
      "invariant is learned; each view needs its own augmentation call.",
      r"same (view|tensor|augmentation)|identical|v2 ?= ?v1|both views|augment(ation)? (once|twice|separately|"
      r"independent)|two (independent )?augment|positive pair")
def d_simclr_both_views_identical(fixed: bool = False):
    seed(0)
    train, val = Views(2048, 21, same_view=not fixed), Views(512, 22)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16))

    def nt_xent(model, batch, tau=0.2):
        v1, v2, _ = batch
        z1, z2 = F.normalize(model(v1), dim=-1), F.normalize(model(v2), dim=-1)
        logits = z1 @ z2.T / tau
        labels = torch.arange(len(v1), device=v1.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 128, drop_last=True), val_loader=loader(val, 256, shuffle=False),
                loss_fn=nt_xent, max_steps=300)


fix("d_simclr_both_views_identical", fixed_of(d_simclr_both_views_identical), knn_of(), "val 1-NN accuracy")


# ---------------------------------------------------------------------------------------------------------
class PairSet(Dataset):
    """Siamese pairs: (left, right, same) with same = 1 when both come from the same class."""

    def __init__(self, views: Views, fixed: bool, s: int):
        g = torch.Generator().manual_seed(s)
        n = len(views)
        self.views = views
        partner = torch.randperm(n, generator=g)             # half random partners ...
        by_class = {int(c): (views.y == c).nonzero().flatten() for c in views.y.unique()}
        for i in range(0, n, 2):                               # ... half same-class partners
            pool = by_class[int(views.y[i])]
            partner[i] = pool[torch.randint(0, len(pool), (1,), generator=g)]
        self.partner = partner
        label_partner = partner if fixed else torch.randperm(n, generator=g)   # broken: a second shuffle
        self.same = (views.y == views.y[label_partner]).float()

    def __len__(self):
        return len(self.partner)

    def __getitem__(self, i):
        return self.views[i][0], self.views[int(self.partner[i])][1], self.same[i]


@case("d_siamese_pair_labels_from_other_shuffle", "data",
      "The pair labels are computed from a second torch.randperm, not from the partner indices the pairs were built "
      "with, so 'same' says nothing about whether left and right really share a class: the siamese net is trained "
      "on labels unrelated to its pairs.",
      r"randperm|(second|another|different|separate) (shuffle|permutation)|partner (indices|permutation)|"
      r"labels? .*(unrelated|mismatch|do not match).*pairs?|(not|n't) (the )?same (pairs|permutation)")
def d_siamese_pair_labels_from_other_shuffle(fixed: bool = False):
    seed(0)
    train, val = PairSet(Views(2048, 23), fixed, 1), Views(512, 24)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16))

    def contrastive(model, batch, margin=1.0):
        a, b, same = batch
        d = F.pairwise_distance(F.normalize(model(a), dim=-1), F.normalize(model(b), dim=-1))
        return (same * d ** 2 + (1 - same) * F.relu(margin - d) ** 2).mean()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 64), val_loader=loader(val, 256, shuffle=False),
                loss_fn=contrastive, max_steps=300)


fix("d_siamese_pair_labels_from_other_shuffle", fixed_of(d_siamese_pair_labels_from_other_shuffle), knn_of(),
    "val 1-NN accuracy")


# ---------------------------------------------------------------------------------------------------------
@case("d_diffusion_data_not_scaled", "data",
      "The training samples are raw 0-255 intensities, never scaled to [-1, 1]: against unit-variance noise the "
      "forward process barely corrupts them, x_t is dominated by a signal of scale ~100 and the noise predictor "
      "cannot pull eps out of it.",
      r"0[- ]?(-|to|\.\.)[- ]?255|\[-1, ?1\] range|scaled? to \[-1, ?1\]|/ ?127\.5|\b255\b|raw (pixel|intensit)|"
      r"unscaled|never scaled|signal .*(dominat|swamp)|noise .*(negligible|barely)|data range")
def d_diffusion_data_not_scaled(fixed: bool = False):
    seed(0)
    raw, rawv = (manifold(4096, 5) + 1) * 127.5, (manifold(1024, 6) + 1) * 127.5
    x0, xv = (raw / 127.5 - 1, rawv / 127.5 - 1) if fixed else (raw, rawv)
    model = EpsNet()

    def ddpm_loss(model, batch):
        x0 = batch[0]
        ab = alpha_bar().to(x0.device)
        t = torch.randint(0, T_STEPS, (len(x0),), device=x0.device)
        noise = torch.randn_like(x0)
        a = ab[t].view(-1, 1)
        return F.mse_loss(model(a.sqrt() * x0 + (1 - a).sqrt() * noise, t), noise)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x0), 128), val_loader=loader(TensorDataset(xv), 256, shuffle=False),
                loss_fn=ddpm_loss, max_steps=300)


fix("d_diffusion_data_not_scaled", fixed_of(d_diffusion_data_not_scaled), eps_mse, "val eps MSE", higher=False)
