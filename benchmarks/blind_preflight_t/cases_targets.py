"""Set t, family targets: the model is trained against targets that do not say what the user means (a mask scaled
to nothing, placeholder labels, a flipped label convention, heatmaps drawn off the map, noise of the wrong law)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.blind_preflight_t.cases_shapes import rect_scenes, small_fcn
from benchmarks.blind_preflight_t.registry import (
    acc_on,
    blobs,
    case,
    dev,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_on,
    seed,
    val_batches,
)

# --------------------------------------------------------------------------------------------------------------------
# Label masks pushed through the image transform: ToTensor divides uint8 by 255, .long() then makes every pixel 0.


def to_tensor(pic: np.ndarray) -> torch.Tensor:
    """torchvision.transforms.ToTensor's conversion (HWC -> CHW; uint8 scaled to [0, 1])."""
    t = torch.from_numpy(np.ascontiguousarray(pic)).permute(2, 0, 1).contiguous()
    return t.float().div(255) if pic.dtype == np.uint8 else t.float()


class PngTiles(Dataset):
    """uint8 HxWx1 images and uint8 HxWx1 label masks (class ids 0..3), as read from PNG files."""

    def __init__(self, images: np.ndarray, masks: np.ndarray, fixed: bool):
        self.images, self.masks, self.fixed = images, masks, fixed

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = to_tensor(self.images[i])
        if self.fixed:
            mask = torch.from_numpy(self.masks[i][..., 0].astype(np.int64))
        else:
            mask = to_tensor(self.masks[i]).squeeze(0).long()  # same transform as the image
        return image, mask


def png_tiles(n: int, g: torch.Generator):
    x, y = rect_scenes(n, 16, g)
    images = (x.clamp(-0.5, 1.5).add(0.5).div(2.0).mul(255).round().to(torch.uint8)).permute(0, 2, 3, 1).numpy()
    masks = y.to(torch.uint8)[..., None].numpy()
    return images, masks


@case("png_mask_to_tensor_scaled_to_zero", "targets",
      bug="The label masks go through the image transform: ToTensor divides the uint8 class ids (0..3) by 255, and "
          ".long() then truncates every value to 0, so every pixel's target is background and the model learns to "
          "predict background only.",
      cause_pattern=r"ToTensor|to_tensor|divid\w* by 255|/ ?255|mask\w* .{0,60}(all|every|only|always) (zero|0|background)|"
                    r"(all|every|only) (the )?(mask|pixel)s? .{0,40}(background|zero|class 0)|"
                    r"mask\w* .{0,40}(scaled|float|fraction|\[0, ?1\])|torch\.from_numpy|as_tensor")
def png_mask_to_tensor_scaled_to_zero(fixed: bool = False) -> dict:
    seed(0)
    images, masks = png_tiles(1200, gen(11))
    model = small_fcn(4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(PngTiles(images[:1000], masks[:1000], fixed), 16),
                val_loader=loader(PngTiles(images[1000:], masks[1000:], fixed), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=150)


def true_mask_batches(kw):
    ds = kw["val_loader"].dataset
    x = torch.stack([to_tensor(im) for im in ds.images])
    y = torch.from_numpy(ds.masks[..., 0].astype(np.int64))
    return DataLoader(TensorDataset(x, y), batch_size=100)


def pixel_fwd(m, b):
    return m(b[0].to(dev(m))).argmax(1), b[1].to(dev(m))


fix("png_mask_to_tensor_scaled_to_zero", fixed_of(png_mask_to_tensor_scaled_to_zero),
    acc_on(true_mask_batches, pixel_fwd), "val pixel accuracy (true masks)", steps=150)

# --------------------------------------------------------------------------------------------------------------------
# Semi-supervised node classification: unlabelled nodes get the placeholder label 0 and the loss covers all nodes.


def sbm_graph(n: int, k: int, g: torch.Generator, p_in: float = 0.06, p_out: float = 0.006):
    y = torch.randint(0, k, (n,), generator=g)
    same = y[:, None] == y[None, :]
    a = (torch.rand(n, n, generator=g) < torch.where(same, p_in, p_out)).float()
    a = torch.triu(a, 1)
    a = a + a.T
    x = 0.7 * F.one_hot(y, 16).float() + torch.randn(n, 16, generator=g)
    return a, x, y


def sym_norm(a: torch.Tensor) -> torch.Tensor:
    a = a + torch.eye(a.shape[0])
    d = a.sum(1).rsqrt()
    return d[:, None] * a * d[None, :]


class DenseGCN(nn.Module):
    def __init__(self, adj: torch.Tensor, d_in: int, d_hid: int, n_out: int):
        super().__init__()
        self.register_buffer("adj", adj)
        self.lin1, self.lin2 = nn.Linear(d_in, d_hid), nn.Linear(d_hid, n_out)

    def forward(self, x):
        h = torch.relu(self.adj @ self.lin1(x))
        return self.adj @ self.lin2(h)


@case("gcn_unlabelled_nodes_trained_as_class0", "targets",
      bug="In transductive node classification only 15% of the nodes are labelled, but the label vector is built "
          "with np.zeros and the cross-entropy runs over all nodes, so the 85% unlabelled nodes are trained as "
          "class 0 and the model predicts class 0 almost everywhere.",
      cause_pattern=r"unlabel\w*|train_mask|(mask\w*|exclud\w*) (the )?(loss|nodes)|placeholder|np\.zeros|"
                    r"(label|class) 0 .{0,60}(most|majority|\d+ ?%)|(most|majority|\d+ ?%) of (the )?(nodes|targets|"
                    r"labels).{0,60}(0|zero|same class)|nodes? .{0,60}ignore_index|ignore_index.{0,60}nodes?")
def gcn_unlabelled_nodes_trained_as_class0(fixed: bool = False) -> dict:
    seed(0)
    g = gen(12)
    a, x, y = sbm_graph(600, 4, g)
    order = torch.randperm(600, generator=g)
    train_idx, val_idx = order[:90], order[300:]
    labels = np.full(600, -100) if fixed else np.zeros(600, dtype=np.int64)
    labels[train_idx.numpy()] = y[train_idx].numpy()
    val_labels = torch.full((600,), -100)
    val_labels[val_idx] = y[val_idx]
    model = DenseGCN(sym_norm(a), 16, 32, 4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4),
                train_loader=DataLoader([(x, torch.as_tensor(labels))], batch_size=None),
                val_loader=DataLoader([(x, val_labels)], batch_size=None),
                loss_fn=nn.CrossEntropyLoss(), max_steps=100)


def node_fwd(m, b):
    return m(b[0].to(dev(m))).argmax(-1), b[1].to(dev(m))


fix("gcn_unlabelled_nodes_trained_as_class0", fixed_of(gcn_unlabelled_nodes_trained_as_class0),
    acc_on(val_batches, node_fwd), "val node accuracy", steps=100)

# --------------------------------------------------------------------------------------------------------------------
# Patch matching with a contrastive loss copied from the paper (y = 0 similar) on a dataset where 1 means match.


def patch_pairs(n: int, g: torch.Generator, n_proto: int = 12):
    """2x8x8 patches: random prototypes under a brightness/contrast change plus noise; match = 1 for the same one."""
    protos = torch.randn(n_proto, 2, 8, 8, generator=g)

    def view(idx):
        gain = 0.7 + 0.6 * torch.rand(len(idx), 1, 1, 1, generator=g)
        bias = 0.3 * torch.randn(len(idx), 1, 1, 1, generator=g)
        return gain * protos[idx] + bias + 0.5 * torch.randn(len(idx), 2, 8, 8, generator=g)

    a = torch.randint(0, n_proto, (n,), generator=g)
    match = (torch.rand(n, generator=g) < 0.5).long()
    b = torch.where(match == 1, a, (a + torch.randint(1, n_proto, (n,), generator=g)) % n_proto)
    return view(a), view(b), match.float()


def patch_descriptor() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 16))


PATCH_MARGIN = 2.0


@case("patch_match_contrastive_label_flipped", "targets",
      bug="The contrastive loss is written as in Hadsell et al. (label 0 = similar pair, 1 = dissimilar), but the "
          "pair dataset labels a match 1 (as the Keras siamese example does), so matching patches are pushed "
          "apart and non-matching ones pulled together.",
      cause_pattern=r"label (convention|meaning|semantics)|(convention|meaning) of the label|revers\w* label|"
                    r"labels? (are|is) (inverted|reversed|flipped|swapped)|1 ?- ?(label|y|match)|"
                    r"(1|one) (means|=|for) (similar|match|same).*(0|zero) (means|=|for) (similar|match|same)|"
                    r"(similar|matching) pairs? (are|get) (pushed|pulled) apart|"
                    r"(dissimilar|non-?matching) pairs? (are|get) pulled together|Hadsell")
def patch_match_contrastive_label_flipped(fixed: bool = False) -> dict:
    seed(0)
    a, b, match = patch_pairs(1600, gen(13))

    def contrastive(model, batch):
        x1, x2, y = batch
        d = F.pairwise_distance(model(x1), model(x2))
        if fixed:
            loss = y * d ** 2 + (1 - y) * torch.clamp(PATCH_MARGIN - d, min=0) ** 2
        else:
            loss = (1 - y) * d ** 2 + y * torch.clamp(PATCH_MARGIN - d, min=0) ** 2  # Hadsell et al. 2006, eq. 4
        return 0.5 * loss.mean()

    model = patch_descriptor()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(a[:1300], b[:1300], match[:1300]), 32),
                val_loader=loader(TensorDataset(a[1300:], b[1300:], match[1300:]), 100, shuffle=False),
                loss_fn=contrastive, max_steps=200)


def patch_fwd(m, b):
    d = dev(m)
    dist = F.pairwise_distance(m(b[0].to(d)), m(b[1].to(d)))
    return (dist < PATCH_MARGIN / 2).long(), b[2].to(d).long()


fix("patch_match_contrastive_label_flipped", fixed_of(patch_match_contrastive_label_flipped),
    acc_on(val_batches, patch_fwd), "val match accuracy", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# Keypoint heatmaps at stride 4 drawn at the input-pixel coordinates (not divided by the stride).

STRIDE, HM = 4, 8


class KeypointTiles(Dataset):
    """32x32 tiles with a bright (keypoint 0) and a dark (keypoint 1) spot; target: 2 Gaussian heatmaps at 8x8."""

    def __init__(self, images, coords, fixed: bool, with_coords: bool = False):
        self.images, self.coords, self.fixed, self.with_coords = images, coords, fixed, with_coords
        ys, xs = torch.meshgrid(torch.arange(HM).float(), torch.arange(HM).float(), indexing="ij")
        self.grid = xs, ys

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        xs, ys = self.grid
        maps = []
        for x, y in self.coords[i]:  # pixel coordinates in the 32x32 input
            if self.fixed:
                x, y = x / STRIDE, y / STRIDE
            maps.append(torch.exp(-((xs - x) ** 2 + (ys - y) ** 2) / 2.0))
        heatmap = torch.stack(maps)
        if self.with_coords:
            return self.images[i], self.coords[i], heatmap
        return self.images[i], heatmap


def keypoint_tiles(n: int, g: torch.Generator):
    c0, b0 = blobs(n, 32, g, radius=1.5)
    c1, b1 = blobs(n, 32, g, radius=1.5)
    img = (b0 - b1)[:, None] + 0.2 * torch.randn(n, 1, 32, 32, generator=g)
    return img, torch.stack([c0, c1], 1)


def heatmap_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, stride=2, padding=1),
                         nn.ReLU(), nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 2, 1))


@case("keypoint_heatmap_not_divided_by_stride", "targets",
      bug="The keypoint heatmaps are 8x8 (stride 4 of the 32x32 input) but the Gaussians are drawn at the keypoints' "
          "input-pixel coordinates instead of coordinates divided by the stride, so most target heatmaps are empty "
          "(the peak lies off the map) and the rest peak at the wrong cell.",
      cause_pattern=r"stride|(divid|scal)\w* .*(coordinates|keypoints?).*(heatmap|output) (resolution|size)|"
                    r"(heatmap|output) (resolution|size)|off the (map|heatmap)|outside the (map|heatmap)|"
                    r"(empty|all-?zero|blank) (target )?heatmaps?|heatmaps? .*(empty|all zeros?|blank)|"
                    r"feat_stride|input[- ]pixel coordinates")
def keypoint_heatmap_not_divided_by_stride(fixed: bool = False) -> dict:
    seed(0)
    img, coords = keypoint_tiles(1200, gen(14))
    model = heatmap_net()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(KeypointTiles(img[:1000], coords[:1000], fixed), 16),
                val_loader=loader(KeypointTiles(img[1000:], coords[1000:], fixed, with_coords=True), 100,
                                  shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=200)


def keypoint_fwd(m, b):
    d = dev(m)
    hm = m(b[0].to(d))  # (N, 2, 8, 8)
    flat = hm.flatten(2).argmax(-1)
    pred = torch.stack([flat % HM, flat // HM], -1).float()
    true = (b[1].to(d) / STRIDE).round()
    hit = ((pred - true).abs().amax(-1) <= 1).long()
    return hit, torch.ones_like(hit)


fix("keypoint_heatmap_not_divided_by_stride", fixed_of(keypoint_heatmap_not_divided_by_stride),
    acc_on(val_batches, keypoint_fwd), "val keypoints within one cell", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# Diffusion-style denoiser trained on torch.rand_like noise (uniform [0, 1)) instead of torch.randn_like.


def gratings(n: int, g: torch.Generator) -> torch.Tensor:
    """8x8 images: the sum of two oriented sinusoidal gratings with random phase (a low-dimensional family)."""
    ys, xs = torch.meshgrid(torch.arange(8).float(), torch.arange(8).float(), indexing="ij")
    out = torch.zeros(n, 8, 8)
    for fx, fy in ((0.6, 0.0), (0.3, 0.5)):
        phase = torch.rand(n, 1, 1, generator=g) * 2 * math.pi
        amp = 0.5 + 0.5 * torch.rand(n, 1, 1, generator=g)
        out += amp * torch.sin(fx * xs + fy * ys + phase)
    return out.reshape(n, 64)


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64 + 8, 128), nn.SiLU(), nn.Linear(128, 128), nn.SiLU(),
                                 nn.Linear(128, 64))

    def forward(self, x_t, t):
        freqs = torch.arange(1, 5, device=t.device).float() * math.pi
        emb = torch.cat([torch.sin(t[:, None] * freqs), torch.cos(t[:, None] * freqs)], -1)
        return self.net(torch.cat([x_t, emb], -1))


def schedule(t):
    return torch.cos(t * math.pi / 2), torch.sin(t * math.pi / 2)


@case("denoiser_trained_on_uniform_noise", "targets",
      bug="The denoiser's training noise is drawn with torch.rand_like (uniform on [0, 1), mean 0.5) instead of "
          "torch.randn_like (standard normal), so it learns to predict a noise law the forward process and the "
          "sampler never use and fails on Gaussian-noised inputs.",
      cause_pattern=r"rand_like|randn_like|uniform|gaussian|normal distribution|standard normal|N\(0, ?1\)|"
                    r"noise .*(mean|distribution|law)|mean 0\.5|\[0, ?1\)")
def denoiser_trained_on_uniform_noise(fixed: bool = False) -> dict:
    seed(0)
    g = gen(15)
    x0 = gratings(2000, g)
    val_t = torch.rand(400, generator=g) * 0.9 + 0.05
    val_noise = torch.randn(400, 64, generator=g)

    def diffusion_loss(model, batch):
        x = batch[0]
        t = torch.rand(x.shape[0], device=x.device) * 0.9 + 0.05
        noise = torch.randn_like(x) if fixed else torch.rand_like(x)
        a, s = schedule(t)
        x_t = a[:, None] * x + s[:, None] * noise
        return F.mse_loss(model(x_t, t), noise)

    model = Denoiser()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x0[:1600]), 64),
                val_loader=loader(TensorDataset(x0[1600:], val_t, val_noise), 100, shuffle=False),
                loss_fn=diffusion_loss, max_steps=300)


def eps_fwd(m, b):
    d = dev(m)
    x, t, noise = (v.to(d) for v in b)
    a, s = schedule(t)
    return m(a[:, None] * x + s[:, None] * noise, t), noise


fix("denoiser_trained_on_uniform_noise", fixed_of(denoiser_trained_on_uniform_noise),
    rmse_on(val_batches, eps_fwd), "val noise-prediction RMSE (Gaussian noise)", steps=300, higher=False)
