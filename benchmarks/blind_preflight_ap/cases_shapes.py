"""Set ap, family shapes: a tensor of the wrong shape or a reduction over the wrong axis, silently broadcast."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from .registry import (
    Views,
    accuracy,
    case,
    fix,
    fixed_of,
    gen,
    knn_of,
    loader,
    lowrank_images,
    rmse_of,
    seed,
)


# ---------------------------------------------------------------------------------------------------------
class PatchAE(nn.Module):
    """Autoencoder over 1-channel 64-pixel patches stored as (N, 1, 64)."""

    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.enc = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 6))
        self.dec = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 64), nn.Sigmoid())

    def forward(self, x):
        out = self.dec(self.enc(x))
        return out.view_as(x) if self.fixed else out      # broken: (N, 64) against targets (N, 1, 64)


@case("s_ae_recon_broadcast", "shapes",
      "The autoencoder returns (N, 64) while its inputs/targets are (N, 1, 64), so nn.MSELoss broadcasts them to "
      "(N, N, 64) and every reconstruction is compared with every image of the batch: the decoder learns the batch mean.",
      r"\(\w+, ?\w+, ?64\)|\(\w+, ?64\).*\(\w+, ?1, ?64\)|view_as|unflatten|every (image|sample) of the batch|"
      r"batch mean|mean (image|reconstruction)")
def s_ae_recon_broadcast(fixed: bool = False):
    seed(0)
    x, xv = lowrank_images(1536, 1).unsqueeze(1), lowrank_images(384, 2).unsqueeze(1)
    model = PatchAE(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x), 64), val_loader=loader(TensorDataset(xv), 128, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("s_ae_recon_broadcast", fixed_of(s_ae_recon_broadcast),
    rmse_of(lambda m, b: (m(b[0]).reshape(b[0].shape), b[0])), "val reconstruction RMSE", higher=False)


# ---------------------------------------------------------------------------------------------------------
class TinyVAE(nn.Module):
    def __init__(self, d=64, z=8):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 2 * z))
        self.dec = nn.Sequential(nn.Linear(z, 64), nn.ReLU(), nn.Linear(64, d), nn.Sigmoid())

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, dim=-1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        return self.dec(z), mu, logvar


@case("s_vae_kl_sum_over_batch", "shapes",
      "The VAE's KL term sums over dim=0 (the batch of 128) instead of dim=1 (the 8 latent units) before the mean, "
      "scaling the KL up 16-fold against the reconstruction, so the posterior collapses and reconstructions go blurry.",
      r"kl.*(dim ?= ?0|batch (dim|axis)|over the batch|16)|(dim ?= ?1|latent (dim|units)).*kl|posterior collapse|"
      r"kl .*(dominat|too (large|strong)|scal)|sum.*wrong (dim|axis)")
def s_vae_kl_sum_over_batch(fixed: bool = False):
    seed(0)
    x, xv = lowrank_images(2048, 3), lowrank_images(384, 4)
    model = TinyVAE()

    def vae_loss(model, batch):
        x = batch[0]
        recon, mu, logvar = model(x)
        rec = F.binary_cross_entropy(recon, x, reduction="none").sum(1).mean()
        kl = -0.5 * torch.sum(1 + logvar - mu ** 2 - logvar.exp(), dim=1 if fixed else 0).mean()
        return rec + kl
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x), 128), val_loader=loader(TensorDataset(xv), 128, shuffle=False),
                loss_fn=vae_loss, max_steps=300)


fix("s_vae_kl_sum_over_batch", fixed_of(s_vae_kl_sum_over_batch), rmse_of(lambda m, b: (m(b[0])[0], b[0])),
    "val reconstruction RMSE (z = mu)", higher=False)


# ---------------------------------------------------------------------------------------------------------
def embedder():
    return nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16))


@case("s_siamese_keepdim_broadcast", "shapes",
      "pairwise_distance(..., keepdim=True) gives distances of shape (N, 1) while the pair labels are (N,), so the "
      "contrastive loss y*d^2 + (1-y)*relu(m-d)^2 broadcasts to (N, N) and each distance is scored against every "
      "pair's label: no signal about which pairs match.",
      r"keepdim|distances? .*\((\w+), ?1\)|labels? .*\((\w+),\) .*distance|every pair'?s label|"
      r"contrastive loss .*broadcast")
def s_siamese_keepdim_broadcast(fixed: bool = False):
    seed(0)
    train, val = Views(2048, 1), Views(512, 2)
    model = embedder()

    def contrastive(model, batch, margin=1.0):
        a, b, y = batch
        perm = torch.randperm(len(y), device=y.device)
        same = (y == y[perm]).float()
        e1, e2 = F.normalize(model(a), dim=-1), F.normalize(model(b[perm]), dim=-1)
        d = F.pairwise_distance(e1, e2, keepdim=not fixed)
        return (same * d ** 2 + (1 - same) * F.relu(margin - d) ** 2).mean()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 64), val_loader=loader(val, 256, shuffle=False),
                loss_fn=contrastive, max_steps=300)


fix("s_siamese_keepdim_broadcast", fixed_of(s_siamese_keepdim_broadcast), knn_of(), "val 1-NN accuracy")


# ---------------------------------------------------------------------------------------------------------
@case("s_triplet_cdist_matrix", "shapes",
      "The triplet loss uses torch.cdist(anchor, positive) and torch.cdist(anchor, negative), (N, N) matrices of every "
      "anchor against every positive/negative of the batch, instead of the per-triplet (N,) distances "
      "(pairwise_distance or the cdist diagonal): anchors are pulled to all classes' positives and pushed from all.",
      r"cdist|every (anchor|positive)|all (classes'? )?positives|per-triplet|TripletMarginLoss")
def s_triplet_cdist_matrix(fixed: bool = False):
    seed(0)
    train, val = Views(2048, 3), Views(512, 4)
    model = embedder()

    def triplet(model, batch, margin=0.5):
        a, p, y = batch
        neg = torch.randperm(len(y), device=y.device)
        keep = y[neg] != y
        za, zp, zn = (F.normalize(model(v), dim=-1) for v in (a[keep], p[keep], a[neg][keep]))
        if fixed:
            dp, dn = F.pairwise_distance(za, zp), F.pairwise_distance(za, zn)
        else:
            dp, dn = torch.cdist(za, zp), torch.cdist(za, zn)
        return F.relu(dp - dn + margin).mean()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 64), val_loader=loader(val, 256, shuffle=False),
                loss_fn=triplet, max_steps=300)


fix("s_triplet_cdist_matrix", fixed_of(s_triplet_cdist_matrix), knn_of(), "val 1-NN accuracy")


# ---------------------------------------------------------------------------------------------------------
class AttnReadout(nn.Module):
    """Graph/set classifier: node encoder, attention readout, head. Batches (B, n_nodes, F)."""

    def __init__(self, fixed: bool, f=8, h=32, c=4):
        super().__init__()
        self.fixed = fixed
        self.node = nn.Sequential(nn.Linear(f, h), nn.ReLU(), nn.Linear(h, h))
        self.score = nn.Linear(h, 1)
        self.head = nn.Linear(h, c)

    def forward(self, x):
        h = self.node(x)                                                  # (B, n, h)
        w = torch.softmax(self.score(h), dim=1 if self.fixed else -1)     # broken: softmax over the size-1 dim
        return self.head((w * h).sum(1))


def flagged_sets(n, s, nodes=12, c=4):
    """Each set has one flagged node (feature 0 = 1); the label is the argmax of that node's features 1..4."""
    g = gen(s)
    x = torch.randn(n, nodes, 8, generator=g)
    x[:, :, 0] = 0
    at = torch.randint(0, nodes, (n,), generator=g)
    x[torch.arange(n), at, 0] = 1.0
    y = x[torch.arange(n), at, 1:1 + c].argmax(-1)
    return x, y


@case("s_attention_softmax_singleton_dim", "shapes",
      "The attention readout applies softmax over dim=-1 of scores shaped (B, n_nodes, 1), a dimension of size 1, "
      "so every weight is exactly 1 and the readout is a plain sum over nodes instead of attending to the flagged "
      "node; softmax must run over the node dimension (dim=1).",
      r"softmax.*(dim ?= ?-1|size[- ]?1|singleton|last dim)|(size[- ]?1|singleton) dim|"
      r"weights? (are |is |equal )?(all |exactly )?(1|one)\b|node dim")
def s_attention_softmax_singleton_dim(fixed: bool = False):
    seed(0)
    x, y = flagged_sets(3072, 1)
    xv, yv = flagged_sets(768, 2)
    model = AttnReadout(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("s_attention_softmax_singleton_dim", fixed_of(s_attention_softmax_singleton_dim),
    lambda model, kw: accuracy(model, kw["val_loader"]), "val accuracy")
