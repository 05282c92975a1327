"""Targets: the loss compares the output with the wrong thing (a wrong positive, a wrong label, a wrong
reference, a term of the wrong scale)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_w.cases_shapes import GCN, FullGraph, first, node_pred
from benchmarks.blind_preflight_w.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    knn_acc_of,
    loader,
    sbm_graph,
    seed,
    val_mean,
    view_data,
    wasserstein_1d,
)

# ---------------------------------------------------------------------------------------------------------------
# 1. SimCLR on user-session vectors: the NT-Xent logits are the full (2N, 2N) similarity matrix with the diagonal
#    left in, and the labels are torch.arange(2N) - each view's "positive" is itself, not its other view.


class SessionEncoder(nn.Module):
    def __init__(self, d_in=32):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(d_in, 64), nn.ReLU(), nn.Linear(64, 32))
        self.projector = nn.Sequential(nn.ReLU(), nn.Linear(32, 32))

    def forward(self, x):
        return self.projector(self.backbone(x))


def nuisance_jitter(x, q, n_content, std):
    """Augmentation: add noise to the nuisance coordinates only (content coordinates untouched)."""
    q = q.to(device=x.device, dtype=x.dtype)
    coords = x @ q.T
    coords = torch.cat([coords[:, :n_content], coords[:, n_content:] + std * torch.randn_like(coords[:, n_content:])], 1)
    return coords @ q


def nt_xent_self_labels(q, fixed):
    def loss_fn(model, batch):
        x = batch[0]
        v1, v2 = nuisance_jitter(x, q, 8, 2.0), nuisance_jitter(x, q, 8, 2.0)
        z = F.normalize(model(torch.cat([v1, v2])), dim=1)
        logits = z @ z.T / 0.2
        n = x.size(0)
        if fixed:
            logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=x.device), float("-inf"))
            labels = (torch.arange(2 * n, device=x.device) + n) % (2 * n)
        else:
            labels = torch.arange(2 * n, device=x.device)
        return F.cross_entropy(logits, labels)
    return loss_fn


def build_simclr_self_labels(fixed: bool = False) -> dict:
    seed(0)
    x, y, q = view_data(2400, 6, 8, 24, 2.0, s=61)
    model = SessionEncoder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1800]), batch_size=128, drop_last=True),
                val_loader=DataLoader(TensorDataset(x[1800:], y[1800:]), batch_size=300),
                loss_fn=nt_xent_self_labels(q, fixed))


case("simclr_positive_is_self", "targets",
     "The NT-Xent loss takes the full (2N, 2N) similarity matrix with its diagonal and labels = torch.arange(2N), "
     "so each view's positive is itself (similarity 1 / temperature, no gradient) instead of its other view at "
     "(i + N) % 2N: the loss only pushes all pairs apart and never pulls the two views together.",
     r"arange\(2 ?\*? ?n\)|(\+ ?n\) ?% ?\(?2 ?\*? ?n|i ?\+ ?n)|(positive|label|target).{0,80}(itself|self[- ]"
     r"similarity|the diagonal|same view|own (view|embedding))|(diagonal|self[- ]similarit).{0,80}(mask|exclud|"
     r"remov)|(mask|exclud|remov).{0,60}(diagonal|self[- ]similarit)|other (augmented )?view")(build_simclr_self_labels)
fix("simclr_positive_is_self", fixed_of(build_simclr_self_labels),
    knn_acc_of(lambda m, x: m.backbone(x)), "val 5-NN accuracy", steps=250)


# ---------------------------------------------------------------------------------------------------------------
# 2. A VAE on 100-bit sensor maps, loss written the Keras way: binary_cross_entropy with its default reduction
#    (the mean over all 100 pixels of the batch) next to a KL summed over the latent units - the KL weighs 100x.


def sensor_maps(n: int, s: int):
    g = gen(s)
    basis = (torch.rand(6, 100, generator=g) < 0.3).float()
    w = (torch.rand(n, 6, generator=g) < 0.4).float()
    clean = ((w @ basis) > 0).float()
    flips = (torch.rand(n, 100, generator=g) < 0.03).float()
    return (clean - flips).abs()


class MapVAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(100, 128), nn.ReLU(), nn.Linear(128, 2 * 10))
        self.decoder = nn.Sequential(nn.Linear(10, 128), nn.ReLU(), nn.Linear(128, 100), nn.Sigmoid())

    def encode(self, x):
        return self.encoder(x).chunk(2, dim=-1)

    def forward(self, x):
        mu, logvar = self.encode(x)
        z = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
        return self.decoder(z), mu, logvar


def map_vae_loss(fixed):
    def loss_fn(model, batch):
        x = batch[0]
        recon, mu, logvar = model(x)
        if fixed:
            bce = F.binary_cross_entropy(recon.float(), x, reduction="sum") / x.size(0)
        else:
            bce = F.binary_cross_entropy(recon.float(), x)
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / x.size(0)
        return bce + kld
    return loss_fn


def map_recon_mse(model, batch):
    x = batch[0]
    mu, _ = model.encode(x)
    return ((model.decoder(mu) - x) ** 2).sum().item(), x.numel()


def build_bce_mean_kl_sum(fixed: bool = False) -> dict:
    seed(0)
    data = sensor_maps(2400, 71)
    model = MapVAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(data[:2000]), batch_size=64),
                val_loader=DataLoader(TensorDataset(data[2000:]), batch_size=200),
                loss_fn=map_vae_loss(fixed))


case("vae_bce_mean_kl_sum", "targets",
     "The VAE reconstruction term is F.binary_cross_entropy with its default reduction='mean' (averaged over the "
     "100 pixels) while the KL is summed over the latent units, so the KL weighs 100 times too much: the encoder "
     "collapses to the prior and every input decodes to the same average map.",
     r"reduction ?= ?['\"]?(mean|sum)|(recon\w*|bce|binary_cross_entropy).{0,100}(mean|averag).{0,100}(kl|"
     r"kullback)|(kl|kullback).{0,100}(sum|summed).{0,100}(recon\w*|bce|pixel)|posterior collapse|"
     r"(same|identical|average) (output|reconstruction|map) for (every|all|each) input")(build_bce_mean_kl_sum)
fix("vae_bce_mean_kl_sum", fixed_of(build_bce_mean_kl_sum), val_mean(map_recon_mse), "val recon MSE",
    steps=300, higher=False)


# ---------------------------------------------------------------------------------------------------------------
# 3. A denoising autoencoder for vibration traces: the corrupted trace goes in, and the loss compares the output
#    with that same corrupted trace instead of the clean one - it learns the identity, noise included.


def traces(n: int, s: int):
    g = gen(s)
    tgrid = torch.linspace(0, 1, 48)
    f = 2 + 4 * torch.rand(n, 1, generator=g)
    ph = 6.28 * torch.rand(n, 1, generator=g)
    a = 0.5 + torch.rand(n, 1, generator=g)
    return a * torch.sin(6.28 * f * tgrid + ph)


class TraceDAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(48, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 48))

    def forward(self, x):
        return self.net(x)


def dae_loss(fixed):
    def loss_fn(model, batch):
        clean = batch[0]
        noisy = clean + 0.5 * torch.randn_like(clean)
        out = model(noisy)
        return F.mse_loss(out, clean if fixed else noisy)
    return loss_fn


def denoise_mse(model, batch):
    clean = batch[0]
    noise = torch.randn(clean.shape, generator=gen(3)).to(clean.device)
    return ((model(clean + 0.5 * noise) - clean) ** 2).sum().item(), clean.numel()


def build_dae_noisy_target(fixed: bool = False) -> dict:
    seed(0)
    data = traces(2400, 81)
    model = TraceDAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(data[:2000]), batch_size=64),
                val_loader=DataLoader(TensorDataset(data[2000:]), batch_size=200),
                loss_fn=dae_loss(fixed))


case("dae_reconstructs_noisy_input", "targets",
     "The denoising autoencoder's loss compares the reconstruction with the corrupted input it was fed instead of "
     "the clean signal, so the best the network can do is copy its input, noise included, and it never learns to "
     "denoise.",
     r"(target|compar|loss).{0,80}(noisy|corrupted) (input|trace|signal|version)|(noisy|corrupted) "
     r"(input|trace|signal).{0,80}(as|is) the (target|label|reference)|clean (signal|input|trace|target)|"
     r"(learns?|copy|copies) (the )?identity")(build_dae_noisy_target)
fix("dae_reconstructs_noisy_input", fixed_of(build_dae_noisy_target), val_mean(denoise_mse), "val MSE to clean",
    steps=300, higher=False)


# ---------------------------------------------------------------------------------------------------------------
# 4. A 1-D GAN for transaction amounts, G and D in one module and one Adam: D is frozen for the generator term
#    (CycleGAN's set_requires_grad), but the generator term is scored against the fake labels copied from the D loss.


class AmountGAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G = nn.Sequential(nn.Linear(4, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32), nn.LeakyReLU(0.2),
                               nn.Linear(32, 1))
        self.D = nn.Sequential(nn.Linear(1, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32), nn.LeakyReLU(0.2),
                               nn.Linear(32, 1))

    def forward(self, z):
        return self.G(z)


def set_requires_grad(net, flag):
    for p in net.parameters():
        p.requires_grad_(flag)


def gan_loss(g_target_real: bool):
    def loss_fn(model, batch):
        real = batch[0]
        z = torch.randn(real.size(0), 4, device=real.device)
        fake = model.G(z)
        ones, zeros = torch.ones_like(real), torch.zeros_like(real)
        d_loss = (F.binary_cross_entropy_with_logits(model.D(real), ones)
                  + F.binary_cross_entropy_with_logits(model.D(fake.detach()), zeros))
        set_requires_grad(model.D, False)
        g_logits = model.D(fake)
        set_requires_grad(model.D, True)
        g_loss = F.binary_cross_entropy_with_logits(g_logits, ones if g_target_real else zeros)
        return d_loss + g_loss
    return loss_fn


def gan_w1(model, kw):
    real = torch.cat([b[0] for b in kw["val_loader"]])
    z = torch.randn(real.size(0), 4, generator=gen(5))
    dev = next(model.parameters()).device
    with torch.no_grad():
        fake = model.G(z.to(dev)).float().cpu()
    return wasserstein_1d(fake, real)


def amounts(n: int, s: int):
    g = np.random.default_rng(s)
    return torch.from_numpy(np.log1p(g.lognormal(3.0, 0.4, size=(n, 1))).astype(np.float32))


def build_gan_fake_labels(fixed: bool = False) -> dict:
    seed(0)
    data = amounts(3000, 91)
    model = AmountGAN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.5, 0.999)),
                train_loader=loader(TensorDataset(data[:2000]), batch_size=128),
                val_loader=DataLoader(TensorDataset(data[2000:]), batch_size=500),
                loss_fn=gan_loss(fixed))


case("gan_generator_fake_labels", "targets",
     "The generator term is binary_cross_entropy_with_logits(D(G(z)), zeros) - the fake label copied from the "
     "discriminator loss - instead of ones, so the generator is trained to make its samples look fake and runs "
     "away from the data.",
     r"generator.{0,120}(real|ones|1\b|label)|(fake|zero|0) (labels?|targets?).{0,80}generator|"
     r"(label|target)s? (should be|of) (real|ones|1)|non-saturating|make (its )?samples? look fake")(
    build_gan_fake_labels)
fix("gan_generator_fake_labels", fixed_of(build_gan_fake_labels), gan_w1, "W1 to real", steps=300, higher=False)


# ---------------------------------------------------------------------------------------------------------------
# 5. Semi-supervised node classification: labels exist for a few nodes; the others were filled with 0 in the
#    numpy label array and the loss is the cross-entropy over all nodes, no train mask.


def build_unlabeled_as_zero(fixed: bool = False) -> dict:
    seed(0)
    g = sbm_graph(n=800, classes=4, dim=16, homophily=0.8, degree=6, signal=0.6, noise=1.0, s=101)
    labelled = np.zeros(800, dtype=bool)
    labelled[np.random.default_rng(3).permutation(800)[:100]] = True
    labelled &= ~g["val_mask"].numpy()
    y_np = np.zeros(800, dtype=np.int64)  # unknown labels stay 0
    y_np[labelled] = g["y"].numpy()[labelled]
    y_train = torch.from_numpy(y_np)
    mask = torch.from_numpy(labelled) if fixed else torch.ones(800, dtype=torch.bool)
    edge_index = g["edges"].t().contiguous()
    model = GCN(16, 32, 4)

    def loss_fn(model, batch):
        x, ei, y, m = batch
        out = model(x, ei)
        return F.cross_entropy(out[m], y[m])

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4),
                train_loader=DataLoader(FullGraph(g["x"], edge_index, y_train, mask), batch_size=1, collate_fn=first),
                val_loader=DataLoader(FullGraph(g["x"], edge_index, g["y"], g["val_mask"]), batch_size=1,
                                      collate_fn=first),
                loss_fn=loss_fn, max_steps=200)


case("gcn_unlabelled_nodes_as_class0", "targets",
     "Only about 100 nodes are labelled, but the label array was created with np.zeros and the cross-entropy runs "
     "over every node without the train mask, so the unlabelled majority are trained as class 0 and predictions "
     "collapse towards class 0.",
     r"train_?mask|(unlabell?ed|unknown|missing)[- ](nodes?|labels?).{0,80}(class 0|label 0|zero|loss)|"
     r"(class|label) 0.{0,80}(unlabell?ed|unknown|placeholder|fill)|np\.zeros|(loss|cross.entropy).{0,60}"
     r"(all|every) nodes?|ignore_index.{0,40}(unlabell?ed|unknown)")(build_unlabeled_as_zero)
fix("gcn_unlabelled_nodes_as_class0", fixed_of(build_unlabeled_as_zero), acc_of(node_pred), "val node accuracy",
    steps=200)
