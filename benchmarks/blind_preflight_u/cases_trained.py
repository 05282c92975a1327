"""What is trained: which weights the optimizer actually moves (new heads, buffers, re-created parameters, losses
rebuilt outside the graph, modules 'unfrozen' by attribute)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_u.registry import acc_of, case, fix, fixed_of, loader, mean_over, rng, seed

cls_acc = acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


def _textures(n, s, n_cls=4):
    """Material patches: each class a base colour plus its own stripe frequency, 3x16x16."""
    r = rng(s)
    base = np.array([[0.7, 0.3, 0.2], [0.2, 0.6, 0.3], [0.3, 0.3, 0.7], [0.6, 0.6, 0.2], [0.5, 0.2, 0.6]])[:n_cls]
    y = r.integers(0, n_cls, n)
    xs = np.arange(16)
    img = r.normal(0, 0.12, (n, 3, 16, 16))
    for i in range(n):
        phase = r.uniform(0, 2 * np.pi)
        img[i] += base[y[i]][:, None, None] + 0.15 * np.sin((y[i] + 1) * xs * 0.6 + phase)[None, None, :]
    return torch.from_numpy(img.astype(np.float32)), torch.from_numpy(y)


# --- 1. new classifier head assigned after the optimizer was built ---------------------------------------------------

class Backbone(nn.Module):
    def __init__(self, n_out):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten())
        self.head = nn.Linear(64, n_out)

    def forward(self, x):
        return self.head(self.features(x))


@case("material_head_swapped_after_optimizer", "what_is_trained",
      bug="Transfer-learning notebook: the optimizer is created on model.parameters() of the 'pretrained' net, then "
          "the backbone is frozen and model.head is replaced by a new nn.Linear for the 4 materials; the new head's "
          "weights are not in the optimizer (it still holds the old head), so nothing is ever updated.",
      cause_pattern=r"(head|classifier|fc|new (layer|module|linear)).{0,100}not (in|held by|part of) (the )?optimi[sz]er"
                    r"|optimi[sz]er.{0,100}(before|does not (hold|contain|include)|missing|stale|old).{0,80}"
                    r"(head|classifier|new (layer|linear|module))|re-?(create|build) the optimi[sz]er"
                    r"|(replaced|reassigned|swapped).{0,60}after.{0,40}optimi[sz]er")
def material_head(fixed=False):
    seed(0)
    xtr, ytr = _textures(1000, 21)
    xva, yva = _textures(300, 22)
    model = Backbone(n_out=10)                   # stands in for the ImageNet-style checkpoint
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for p in model.features.parameters():
        p.requires_grad = False
    model.head = nn.Linear(64, 4)
    if fixed:
        optimizer = torch.optim.Adam(model.head.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(xtr, ytr), 32),
                val_loader=loader(TensorDataset(xva, yva), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("material_head_swapped_after_optimizer", fixed_of(material_head), cls_acc, "val accuracy")


# --- 2. a learnable band-mixing layer registered as a buffer ----------------------------------------------------------

def _multispectral(n, s):
    """8-band crop tiles (reflectance); the crop type shows in the red-edge/NIR/SWIR bands 5-7 only."""
    r = rng(s)
    y = r.integers(0, 3, n)
    x = r.normal(0.3, 0.08, (n, 8, 12, 12))
    for i in range(n):
        x[i, 5 + y[i]] += 0.25 + r.normal(0, 0.03)
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y)


class BandMixNet(nn.Module):
    """A learnable 8 -> 3 band projection ('false colour') in front of an RGB-sized CNN."""

    def __init__(self, fixed):
        super().__init__()
        init = torch.zeros(3, 8)
        init[0, 0] = init[1, 1] = init[2, 2] = 1.0          # start from the visible bands
        if fixed:
            self.mix = nn.Parameter(init)
        else:
            self.register_buffer("mix", init)                # so .to(device) moves it
        self.cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(16, 3))

    def forward(self, x):
        return self.cnn(torch.einsum("oc,nchw->nohw", self.mix, x))


@case("crop_band_mix_registered_as_buffer", "what_is_trained",
      bug="The 8->3 band-mixing matrix meant to be learned is stored with self.register_buffer('mix', ...) (to make "
          ".to(device) move it), so it is not a parameter: it stays at its visible-band initialisation and the "
          "NIR/SWIR bands that carry the crop signal never reach the CNN.",
      cause_pattern=r"register_buffer|buffer.{0,80}(not (a )?param|never (trained|updated|learn)|not (updated|trained|"
                    r"learn|in model\.parameters))|nn\.Parameter.{0,60}(instead|rather)"
                    r"|(band|mix\w*).{0,60}(never|not) (trained|updated|learn)")
def crop_band_mix(fixed=False):
    seed(0)
    xtr, ytr = _multispectral(900, 23)
    xva, yva = _multispectral(300, 24)
    model = BandMixNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xtr, ytr), 32),
                val_loader=loader(TensorDataset(xva, yva), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("crop_band_mix_registered_as_buffer", fixed_of(crop_band_mix), cls_acc, "val accuracy")


# --- 3. Dice computed in numpy and re-wrapped with requires_grad=True -------------------------------------------------

def _lesions(n, s):
    r = rng(s)
    img = r.normal(0.4, 0.07, (n, 1, 16, 16)).astype(np.float32)
    mask = np.zeros((n, 1, 16, 16), dtype=np.float32)
    yy, xx = np.mgrid[:16, :16]
    for i in range(n):
        cy, cx, rad = r.uniform(3, 13), r.uniform(3, 13), r.uniform(2, 4.5)
        blob = (yy - cy) ** 2 + (xx - cx) ** 2 < rad ** 2
        mask[i, 0][blob] = 1
        img[i, 0][blob] += 0.35
    return torch.from_numpy(img), torch.from_numpy(mask)


def dice_np(pred, target, eps=1.0):
    inter = (pred * target).sum()
    return (2 * inter + eps) / (pred.sum() + target.sum() + eps)


def lesion_dice_loss(fixed):
    def loss_fn(model, batch):
        x, mask = batch
        probs = torch.sigmoid(model(x))
        if fixed:
            return 1 - dice_np(probs, mask)
        dice = dice_np(probs.detach().cpu().numpy(), mask.cpu().numpy())
        # RuntimeError: element 0 of tensors does not require grad -> "fix":
        return torch.tensor(1.0 - float(dice), requires_grad=True, device=x.device)
    return loss_fn


def _lesion_fcn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 1, 1))


def lesion_iou(model, kw):
    def fn(m, b):
        p = torch.sigmoid(m(b[0])) > 0.5
        t = b[1] > 0.5
        return (p & t).sum().item(), (p | t).sum().item()
    return mean_over(model, kw["val_loader"], fn)


@case("lesion_numpy_dice_requires_grad", "what_is_trained",
      bug="The Dice loss is computed in numpy on probs.detach().cpu().numpy() and returned as "
          "torch.tensor(1 - dice, requires_grad=True) to silence 'element 0 of tensors does not require grad': the "
          "loss is a fresh leaf with no path back to the model, so backward() gives every weight no gradient.",
      cause_pattern=r"requires_grad ?= ?True.{0,100}(loss|leaf|new tensor|torch\.tensor)"
                    r"|torch\.tensor\(.{0,40}requires_grad|(loss|dice).{0,80}(numpy|\.detach\(\)|new leaf|re-?wrapped)"
                    r"|\.numpy\(\).{0,80}(loss|graph|gradient)")
def lesion_dice(fixed=False):
    seed(0)
    xtr, mtr = _lesions(800, 25)
    xva, mva = _lesions(200, 26)
    model = _lesion_fcn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xtr, mtr), 16),
                val_loader=loader(TensorDataset(xva, mva), 50, shuffle=False),
                loss_fn=lesion_dice_loss(fixed), max_steps=300)


fix("lesion_numpy_dice_requires_grad", fixed_of(lesion_dice), lesion_iou, "val lesion IoU")


# --- 4. positional embedding created as nn.Parameter inside forward() -------------------------------------------------

def _quadrant_images(n, s):
    """Which quadrant of the 16x16 wafer image holds the defect (a bright 3x3 speck)."""
    r = rng(s)
    img = r.normal(0.3, 0.05, (n, 1, 16, 16)).astype(np.float32)
    y = np.zeros(n, dtype=np.int64)
    for i in range(n):
        cy, cx = r.integers(1, 15, 2)
        img[i, 0, cy - 1:cy + 2, cx - 1:cx + 2] = 0.9
        y[i] = 2 * int(cy >= 8) + int(cx >= 8)
    return torch.from_numpy(img), torch.from_numpy(y)


class PatchAttention(nn.Module):
    def __init__(self, fixed, dim=32):
        super().__init__()
        self.fixed, self.dim = fixed, dim
        self.embed = nn.Linear(16, dim)
        if fixed:
            self.pos = nn.Parameter(torch.randn(1, 16, dim))
        self.block = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, 4)

    def forward(self, x):
        n = x.shape[0]
        patches = x.unfold(2, 4, 4).unfold(3, 4, 4).reshape(n, 16, 16)      # 16 patches of 4x4
        tokens = self.embed(patches)
        if not self.fixed:
            self.pos = nn.Parameter(torch.randn(1, 16, self.dim, device=x.device))
        return self.head(self.block(tokens + self.pos).mean(1))


@case("wafer_pos_embedding_in_forward", "what_is_trained",
      bug="The patch-attention model creates its positional embedding as self.pos = nn.Parameter(torch.randn(...)) "
          "inside forward(): a fresh random tensor every call that the optimizer never sees, so positions are noise "
          "and the defect's quadrant cannot be learned.",
      cause_pattern=r"nn\.Parameter.{0,80}(forward|every (call|step|iteration)|each (call|step|forward))"
                    r"|(created|re-?initiali[sz]ed|re-?created|new).{0,60}(every|each|on every) (forward|call|step)"
                    r"|(positional|position|pos_?emb\w*).{0,80}(not (registered|trained|learn)|re-?creat|forward)"
                    r"|param\w*.{0,40}(created|registered|appear\w*) (in|during|inside) (the )?forward")
def wafer_pos(fixed=False):
    seed(0)
    xtr, ytr = _quadrant_images(1000, 27)
    xva, yva = _quadrant_images(300, 28)
    model = PatchAttention(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xtr, ytr), 32),
                val_loader=loader(TensorDataset(xva, yva), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("wafer_pos_embedding_in_forward", fixed_of(wafer_pos), cls_acc, "val accuracy")


# --- 5. 'unfreezing' the last stage with module.requires_grad = True ---------------------------------------------------

def _pairs(n, s):
    """Two coloured LEDs on a board: class = which colour is on the left and whether they sit above each other."""
    r = rng(s)
    img = r.normal(0.2, 0.05, (n, 3, 16, 16)).astype(np.float32)
    y = np.zeros(n, dtype=np.int64)
    red, green = np.array([0.9, 0.2, 0.2], np.float32), np.array([0.2, 0.9, 0.2], np.float32)
    for i in range(n):
        vertical, red_first = r.integers(2), r.integers(2)
        a = r.integers(2, 8, 2)
        b = a + (np.array([r.integers(4, 7), r.integers(-1, 2)]) if vertical else
                 np.array([r.integers(-1, 2), r.integers(4, 7)]))
        first, second = (red, green) if red_first else (green, red)
        img[i, :, a[0] - 1:a[0] + 1, a[1] - 1:a[1] + 1] = first[:, None, None]
        img[i, :, b[0] - 1:b[0] + 1, b[1] - 1:b[1] + 1] = second[:, None, None]
        y[i] = 2 * vertical + red_first
    return torch.from_numpy(img), torch.from_numpy(y)


class StagedNet(nn.Module):
    def __init__(self, n_out):
        super().__init__()
        self.stage1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.stage2 = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())
        self.stage3 = nn.Sequential(nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
                                    nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(32, n_out)

    def forward(self, x):
        return self.head(self.pool(self.stage3(self.stage2(self.stage1(x)))).flatten(1))


@case("led_stage3_requires_grad_attribute", "what_is_trained",
      bug="After freezing every parameter, the last stage is 'unfrozen' with model.stage3.requires_grad = True, which "
          "only sets a plain attribute on the nn.Module: its parameters keep requires_grad=False, the optimizer built "
          "from the trainable parameters gets only the new head, and the features that must learn the LED layout "
          "stay frozen at their random 'pretrained' values.",
      cause_pattern=r"requires_grad ?= ?True.{0,80}(module|attribute|no effect|does not|doesn't)"
                    r"|(module|stage\d|nn\.Module)\w*\.requires_grad\b|requires_grad_\(|attribute.{0,40}requires_grad"
                    r"|(still|remain\w*) frozen|not (actually )?unfrozen")
def led_stage3(fixed=False):
    seed(0)
    xtr, ytr = _pairs(1000, 29)
    xva, yva = _pairs(300, 30)
    model = StagedNet(n_out=10)
    for p in model.parameters():
        p.requires_grad = False
    if fixed:
        model.stage3.requires_grad_(True)
    else:
        model.stage3.requires_grad = True
    model.head = nn.Linear(32, 4)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(xtr, ytr), 32),
                val_loader=loader(TensorDataset(xva, yva), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("led_stage3_requires_grad_attribute", fixed_of(led_stage3), cls_acc, "val accuracy")
