"""Set t, healthy cases: five corrected twins of broken cases (the same builder with its one-line fix) and five
unusual but correct setups. None of them should raise a warning or an error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_t.cases_data import eye_keypoints_flip_without_left_right_swap
from benchmarks.blind_preflight_t.cases_mechanics import sr_pairs, vae_kl_summed_recon_averaged
from benchmarks.blind_preflight_t.cases_shapes import rect_scenes, tile_seg_logits_view_not_permute
from benchmarks.blind_preflight_t.cases_targets import gcn_unlabelled_nodes_trained_as_class0, gratings
from benchmarks.blind_preflight_t.cases_trained import glyphs, vit_backbone_forward_under_no_grad
from benchmarks.blind_preflight_t.registry import gen, healthy, loader, seed, twin

# --- corrected twins -------------------------------------------------------------------------------------------------

healthy("tile_seg_logits_permuted_fixed",
        "Twin of tile_seg_logits_view_not_permute: logits.permute(0, 2, 3, 1).reshape(-1, C) before the pixel "
        "cross-entropy.")(twin(tile_seg_logits_view_not_permute))

healthy("gcn_unlabelled_nodes_ignored_fixed",
        "Twin of gcn_unlabelled_nodes_trained_as_class0: unlabelled nodes carry -100 (ignore_index), so only the 90 "
        "labelled nodes of the full-graph batch are scored.")(twin(gcn_unlabelled_nodes_trained_as_class0))

healthy("vit_backbone_fine_tuned_fixed",
        "Twin of vit_backbone_forward_under_no_grad: the tiny ViT built from a config runs with gradients and is "
        "fine-tuned with its head.")(twin(vit_backbone_forward_under_no_grad))

healthy("vae_kl_scaled_like_recon_fixed",
        "Twin of vae_kl_summed_recon_averaged: the summed KL is divided by x.numel(), the same reduction as the mean "
        "reconstruction term.")(twin(vae_kl_summed_recon_averaged))

healthy("eye_keypoints_flip_with_swap_fixed",
        "Twin of eye_keypoints_flip_without_left_right_swap: the flip mirrors x and swaps the left and right eye "
        "targets.")(twin(eye_keypoints_flip_without_left_right_swap))

# --- unusual but correct ----------------------------------------------------------------------------------------------


class TinyUNet(nn.Module):
    def __init__(self, n_out: int = 4):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU())
        self.mid = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(32, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, n_out, 1))

    def forward(self, x):
        skip = self.enc(x)
        return self.dec(torch.cat([self.up(self.mid(skip)), skip], 1))


@healthy("unet_ignore_boundary_255_class_weights_bf16",
         "A small U-Net (skip connection, transposed-conv upsampling) on 4-class tiles whose object boundaries are "
         "labelled 255 and ignored (CrossEntropyLoss(ignore_index=255)), with inverse-frequency class weights, "
         "under bf16 autocast.")
def unet_ignore_boundary_255_class_weights_bf16() -> dict:
    seed(0)
    x, y = rect_scenes(900, 16, gen(51))
    edge = F.max_pool2d(y[:, None].float(), 3, 1, 1)[:, 0] != -F.max_pool2d(-y[:, None].float(), 3, 1, 1)[:, 0]
    y = y.masked_fill(edge, 255)
    counts = torch.bincount(y[y != 255], minlength=4).float()
    weight = counts.sum() / (4 * counts)
    model = TinyUNet()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4),
                train_loader=loader(TensorDataset(x[:750], y[:750]), 16),
                val_loader=loader(TensorDataset(x[750:], y[750:]), 75, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(weight=weight, ignore_index=255), precision="bf16", max_steps=200)


def glyph_embedder() -> nn.Module:
    return nn.Sequential(nn.Linear(144, 128), nn.ReLU(), nn.Linear(128, 32))


@healthy("glyph_triplet_batch_hard_cosine",
         "Metric learning with batch-hard triplet mining on L2-normalised embeddings (cosine distance, margin 0.2), "
         "Nesterov SGD and a cosine LR schedule over max_steps; the labels are only used to mine triplets.")
def glyph_triplet_batch_hard_cosine() -> dict:
    seed(0)
    noisy, _, y = glyphs(1500, gen(52))

    def batch_hard_triplet(model, batch):
        x, label = batch
        z = F.normalize(model(x), dim=1)
        dist = 1 - z @ z.T
        same = label[:, None] == label[None, :]
        eye = torch.eye(len(label), dtype=torch.bool, device=label.device)
        hardest_pos = dist.masked_fill(~same | eye, -1.0).amax(1)
        hardest_neg = dist.masked_fill(same, 3.0).amin(1)
        return F.relu(hardest_pos - hardest_neg + 0.2).mean()

    model = glyph_embedder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=200),
                train_loader=loader(TensorDataset(noisy[:1200], y[:1200]), 64),
                val_loader=loader(TensorDataset(noisy[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=batch_hard_triplet, max_steps=200)


class RandomGraphs(Dataset):
    """Small Erdos-Renyi graphs of 8-20 nodes, sparse (class 0) or dense (class 1); node features: a constant and
    noise."""

    def __init__(self, n: int, g: torch.Generator):
        self.items = []
        for _ in range(n):
            k = int(torch.randint(8, 21, (1,), generator=g))
            label = int(torch.randint(0, 2, (1,), generator=g))
            p = 0.15 if label == 0 else 0.35
            a = torch.triu((torch.rand(k, k, generator=g) < p).float(), 1)
            feats = torch.cat([torch.ones(k, 1), 0.5 * torch.randn(k, 3, generator=g)], 1)
            self.items.append((feats, a + a.T, label))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def pad_graphs(batch):
    n_max = max(f.shape[0] for f, _, _ in batch)
    x = torch.zeros(len(batch), n_max, 4)
    adj = torch.zeros(len(batch), n_max, n_max)
    mask = torch.zeros(len(batch), n_max)
    for i, (f, a, _) in enumerate(batch):
        k = f.shape[0]
        x[i, :k], adj[i, :k, :k], mask[i, :k] = f, a, 1.0
    return x, adj, mask, torch.tensor([label for _, _, label in batch])


class PaddedGCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1, self.lin2, self.head = nn.Linear(4, 32), nn.Linear(32, 32), nn.Linear(32, 2)

    def forward(self, x, adj, mask):
        a = adj + torch.diag_embed(mask)
        deg = a.sum(-1).clamp(min=1).rsqrt() * mask
        a = deg[:, :, None] * a * deg[:, None, :]
        h = torch.relu(a @ self.lin1(x))
        h = torch.relu(a @ self.lin2(h))
        pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return self.head(pooled)


@healthy("padded_graph_batches_masked_mean_pool",
         "Graph classification on variable-size graphs padded into dense batches by a custom collate_fn: "
         "symmetric-normalised adjacency with self-loops on real nodes only, mask-weighted mean pooling, 2-step "
         "gradient accumulation and clipping at 1.0.")
def padded_graph_batches_masked_mean_pool() -> dict:
    seed(0)
    g = gen(53)
    train, val = RandomGraphs(800, g), RandomGraphs(200, g)

    def graph_loss(model, batch):
        x, adj, mask, label = batch
        return F.cross_entropy(model(x, adj, mask), label)

    model = PaddedGCN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 16, collate_fn=pad_graphs),
                val_loader=loader(val, 50, shuffle=False, collate_fn=pad_graphs),
                loss_fn=graph_loss, accumulation_steps=2, clip_grad_norm=1.0, max_steps=200)


class ConvDenoiser(nn.Module):
    """Predicts the noise of a DDPM forward process (linear betas, 100 steps) from x_t and a learned step embedding."""

    def __init__(self, steps: int = 100):
        super().__init__()
        betas = torch.linspace(1e-4, 0.05, steps)
        self.register_buffer("alpha_bar", torch.cumprod(1 - betas, 0))
        self.step_embedding = nn.Embedding(steps, 16)
        self.inp = nn.Conv2d(1, 16, 3, padding=1)
        self.body = nn.Sequential(nn.SiLU(), nn.Conv2d(16, 16, 3, padding=1), nn.SiLU(), nn.Conv2d(16, 1, 3, padding=1))

    def forward(self, x_t, t):
        return self.body(self.inp(x_t) + self.step_embedding(t)[:, :, None, None])


@healthy("ddpm_conv_denoiser_capped_warmup",
         "A DDPM-style denoiser (linear beta schedule, 100 discrete steps, learned step embedding) trained to predict "
         "Gaussian noise with randn_like, AdamW, a linear warm-up capped at 1 and gradient clipping.")
def ddpm_conv_denoiser_capped_warmup() -> dict:
    seed(0)
    x0 = gratings(1500, gen(54)).reshape(1500, 1, 8, 8)

    def ddpm_loss(model, batch):
        x = batch[0]
        t = torch.randint(0, 100, (x.shape[0],), device=x.device)
        noise = torch.randn_like(x)
        ab = model.alpha_bar[t][:, None, None, None]
        return F.mse_loss(model(ab.sqrt() * x + (1 - ab).sqrt() * noise, t), noise)

    model = ConvDenoiser()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    return dict(model=model, optimizer=optimizer, scheduler=warmup,
                train_loader=loader(TensorDataset(x0[:1300]), 64),
                val_loader=loader(TensorDataset(x0[1300:]), 100, shuffle=False),
                loss_fn=ddpm_loss, clip_grad_norm=1.0, max_steps=200)


class ResidualSR(nn.Module):
    """x2 super-resolution: a bicubic upsample plus a PixelShuffle residual branch."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 4, 3, padding=1),
                                  nn.PixelShuffle(2))

    def forward(self, lr_img):
        base = F.interpolate(lr_img, scale_factor=2, mode="bicubic", align_corners=False)
        return base + self.body(lr_img)


@healthy("superres_residual_l1_onecycle",
         "x2 super-resolution predicting a PixelShuffle residual over the bicubic upsample, trained with L1 loss, "
         "Adam and OneCycleLR whose total_steps equals max_steps.")
def superres_residual_l1_onecycle() -> dict:
    seed(0)
    lr_img, hr = sr_pairs(1200, gen(55))
    model = ResidualSR()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=200)
    return dict(model=model, optimizer=optimizer, scheduler=schedule,
                train_loader=loader(TensorDataset(lr_img[:1000], hr[:1000]), 16),
                val_loader=loader(TensorDataset(lr_img[1000:], hr[1000:]), 100, shuffle=False),
                loss_fn=nn.L1Loss(), max_steps=200)


