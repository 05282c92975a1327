"""What is trained: which parameters of a dense / survival model the optimizer really updates."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_bd import synth
from benchmarks.blind_preflight_bd.common import Backbone, BoxRegressor, block
from benchmarks.blind_preflight_bd.registry import case, fix, fixed_of, iou_of, loader, mean_over, miou_of, pck_of, seed


# --- 1. centre / size heads: the size head left out of the optimizer's parameter list ----------------------------
class CentreSizeNet(nn.Module):
    def __init__(self, w=16):
        super().__init__()
        self.backbone = Backbone(1, w)
        self.centre_head = nn.Sequential(nn.Flatten(), nn.Linear(w * 64, 64), nn.ReLU(), nn.Linear(64, 2))
        self.size_head = nn.Sequential(nn.Flatten(), nn.Linear(w * 64, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, x):
        f = self.backbone(x)
        return torch.sigmoid(torch.cat([self.centre_head(f), self.size_head(f)], 1))   # cxcywh in [0, 1]


def _cxcywh_to_xyxy(b):
    return torch.cat([b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2], 1)


def _boxes_cxcywh(n, s):
    imgs, xyxy = synth.box_images(n, s=s)
    cxcywh = np.concatenate([(xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]], 1) / 32
    return TensorDataset(synth.t(imgs), synth.t(cxcywh.astype(np.float32)))


@case("box_size_head_missing_from_optimizer", "what_is_trained",
      "The optimizer is built from model.backbone and model.centre_head parameters only: the two-layer model.size_head "
      "branch is never in any param group, so its random weights stay as initialised and every predicted width and "
      "height is a fixed random function of the shared features, whatever the L1 loss on them says.",
      r"size_head|not (in|passed to|registered with) the optimi[sz]er|missing from (the )?optimi[sz]er|never "
      r"(updated|trained|stepped)|param(eter)? groups?.{0,60}(miss|omit|left out|exclude)|model\.parameters\(\)|"
      r"receive gradients? but (are )?never updated|(has|have|get|gets) (a )?grad(ient)?s? but")
def box_size_head_missing_from_optimizer(fixed=False):
    seed(0)
    model = CentreSizeNet()
    params = (list(model.parameters()) if fixed else
              list(model.backbone.parameters()) + list(model.centre_head.parameters()))
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=1e-3),
                train_loader=loader(_boxes_cxcywh(800, 110), 16),
                val_loader=loader(_boxes_cxcywh(256, 111), 64, shuffle=False),
                loss_fn=nn.L1Loss(), max_steps=300)


def _cxcywh_fwd(m, b):
    return _cxcywh_to_xyxy(m(b[0])) * 32, _cxcywh_to_xyxy(b[1]) * 32


fix("box_size_head_missing_from_optimizer", fixed_of(box_size_head_missing_from_optimizer), iou_of(_cxcywh_fwd),
    "val box IoU")


# --- 2. discrete-time hazard: per-interval baseline kept as a plain tensor ----------------------------------------
N_BINS = 12


class DiscreteHazard(nn.Module):
    """logit h_k(x) = baseline_k + g(x): a proportional-odds discrete-time hazard model."""

    def __init__(self, d=8, fixed=False):
        super().__init__()
        self.g = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 1))
        if fixed:
            self.baseline = nn.Parameter(torch.zeros(N_BINS))
        else:
            self.baseline = torch.zeros(N_BINS, requires_grad=True)   # learnable per-interval log-odds

    def forward(self, x):
        return self.g(x) + self.baseline          # (N, K) hazard logits


def _hazard_table(n, s, edges=None):
    x, t, e, _ = synth.survival_table(n, s=s, censor_rate=0.3, shape=4.0)
    if edges is None:  # equal-width follow-up intervals (e.g. yearly visits) up to the 95th percentile
        edges = np.linspace(0, np.quantile(t, 0.95), N_BINS + 1)[1:-1]
    k = synth.discretize(t, edges)
    return TensorDataset(synth.t(x), synth.t(k.astype(np.int64)), synth.t(e)), edges


def discrete_nll(logits, k, event):
    """Per-interval BCE over the intervals a subject was at risk in; target 1 only in the event interval."""
    K = logits.shape[1]
    steps = torch.arange(K)
    at_risk = (steps[None, :] <= k[:, None]).float()
    target = ((steps[None, :] == k[:, None]) & (event[:, None] > 0)).float()
    bce = F.binary_cross_entropy_with_logits(logits.float(), target, reduction="none")
    return (bce * at_risk).sum() / logits.shape[0]


def _hazard_fn(model, batch):
    x, k, e = batch
    return discrete_nll(model(x), k, e)


@case("hazard_baseline_plain_tensor", "what_is_trained",
      "The per-interval baseline log-odds of the discrete-time hazard model is a plain tensor with "
      "requires_grad=True set as a module attribute, not an nn.Parameter: model.parameters() does not list it, the "
      "optimizer never updates it, and the hazard's shape over time stays flat at its zero initialisation.",
      r"nn\.Parameter|plain tensor|register_parameter|register_buffer|not (a |an )?(registered )?param|"
      r"model\.parameters\(\).{0,60}(does not|doesn't|not) (list|include|contain)|not (in|part of) "
      r"model\.parameters|baseline.{0,60}(never|not) (updated|trained|learned)|requires_grad\s*=\s*True.{0,60}"
      r"(attribute|tensor)")
def hazard_baseline_plain_tensor(fixed=False):
    seed(0)
    train, edges = _hazard_table(1500, 120)
    val, _ = _hazard_table(600, 121, edges)
    model = DiscreteHazard(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 64), val_loader=loader(val, 200, shuffle=False),
                loss_fn=_hazard_fn, max_steps=300)


def _val_nll(model, kw):
    def fn(m, b):
        x, k, e = b
        return discrete_nll(m(x), k, e).item() * x.shape[0], x.shape[0]
    return mean_over(model, kw["val_loader"], fn)


fix("hazard_baseline_plain_tensor", fixed_of(hazard_baseline_plain_tensor), _val_nll, "val discrete-time NLL",
    higher=False)


# --- 3. the segmentation head built inside forward -----------------------------------------------------------------
class LazyHeadUNet(nn.Module):
    def __init__(self, n_classes=3, w=12, fixed=False):
        super().__init__()
        self.enc1 = block(3, w)
        self.enc2 = block(w, 2 * w)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.dec = block(3 * w, w)
        self.n_classes, self.w = n_classes, w
        if fixed:
            self.head = nn.Conv2d(w, n_classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        d = self.dec(torch.cat([self.up(e2), e1], 1))
        head = self.head if hasattr(self, "head") else nn.Conv2d(self.w, self.n_classes, 1).to(d.device)
        return head(d)


@case("seg_head_conv_created_in_forward", "what_is_trained",
      "The UNet's 1x1 classification conv is created inside forward (nn.Conv2d(w, n_classes, 1) on every call) "
      "instead of in __init__: it is a fresh random layer each step, is not a registered submodule, is never in the "
      "optimizer, and the decoder is chasing a different random projection of its features every batch.",
      r"(created|constructed|instantiated|built|defined) (inside|in) (the )?forward|__init__|new (random )?"
      r"(layer|module|conv).{0,30}(every|each) (call|step|forward|batch)|fresh (random )?(layer|weights)|not "
      r"(a )?registered (sub)?module|never in the optimi[sz]er|re-?initiali[sz]ed (every|each)")
def seg_head_conv_created_in_forward(fixed=False):
    seed(0)
    imgs, masks = synth.seg_shapes(640, s=130)
    vi, vm = synth.seg_shapes(256, s=131)
    model = LazyHeadUNet(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(synth.t(imgs), synth.t(masks)), 16),
                val_loader=loader(TensorDataset(synth.t(vi), synth.t(vm)), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


def _seg_fwd(m, b):
    torch.manual_seed(0)
    return m(b[0]), b[1]


fix("seg_head_conv_created_in_forward", fixed_of(seg_head_conv_created_in_forward), miou_of(_seg_fwd), "val mIoU")


# --- 4. the optimizer built over the EMA copy's parameters ---------------------------------------------------------
class LandmarkNet(nn.Module):
    def __init__(self, w=16):
        super().__init__()
        self.backbone = Backbone(1, w)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(w * 64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return torch.sigmoid(self.head(self.backbone(x))).view(-1, 2, 2)   # two (x, y) in [0, 1]


def _landmarks(n, s):
    imgs, kps = synth.two_points(n, s=s)
    return TensorDataset(synth.t(imgs), synth.t(kps / 32))


@case("kp_optimizer_over_ema_copy", "what_is_trained",
      "The EMA model is made with copy.deepcopy(model) and the optimizer is then built over ema.parameters(): the loss "
      "backpropagates into the live model's parameters, which no optimizer steps, while the optimizer steps the "
      "copy, whose .grad stays None, so neither model ever changes.",
      r"deepcopy|\bema\b|exponential moving average|optimi[sz]er.{0,60}(other|another|different|copy|second) "
      r"(model|module|copy)|(parameters|params).{0,40}(not|never) (the ones|those).{0,40}(loss|forward|trained)|"
      r"never (updated|stepped)|not (the )?(model|parameters) (being )?"
      r"(trained|passed)")
def kp_optimizer_over_ema_copy(fixed=False):
    seed(0)
    model = LandmarkNet()
    ema = copy.deepcopy(model)
    for p in ema.parameters():
        p.requires_grad_(fixed is False)
    optimizer = torch.optim.Adam((model if fixed else ema).parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(_landmarks(800, 140), 16),
                val_loader=loader(_landmarks(256, 141), 64, shuffle=False),
                loss_fn=nn.SmoothL1Loss(beta=0.05), max_steps=300)


def _kp_fwd(m, b):
    return m(b[0]) * 32, b[1] * 32


fix("kp_optimizer_over_ema_copy", fixed_of(kp_optimizer_over_ema_copy), pck_of(_kp_fwd), "val PCK@3px")


# --- 5. a randomly initialised backbone run under torch.no_grad() as a "frozen feature extractor" --------------
class FrozenTrunkRegressor(BoxRegressor):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed

    def forward(self, x):
        if self.fixed:
            f = self.backbone(x)
        else:
            with torch.no_grad():                 # backbone is frozen: saves memory
                f = self.backbone(x)
        return torch.sigmoid(self.head(f))


class _Boxes(Dataset):
    def __init__(self, n, s):
        self.imgs, self.boxes = synth.box_images(n, s=s)

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        return torch.from_numpy(self.imgs[i]), torch.from_numpy(self.boxes[i] / 32)


@case("box_random_backbone_under_no_grad", "what_is_trained",
      "The box regressor runs its backbone under torch.no_grad() as if it were a pretrained frozen feature extractor, "
      "but the backbone was never loaded with weights: it is a random conv trunk, no gradient reaches it, and only "
      "the MLP head learns, on random features.",
      r"no_grad|randomly initiali[sz]ed.{0,60}(frozen|backbone|trunk|feature)|(frozen|no gradient).{0,60}(random|"
      r"never (loaded|pretrained)|untrained|not pretrained)|(backbone|trunk|encoder).{0,60}(never|not) "
      r"(trained|updated|receive)|pretrained weights|load_state_dict|requires_grad.{0,40}(backbone|trunk)|"
      r"(gradients?|grads?) (do not|don't|never) (reach|flow)")
def box_random_backbone_under_no_grad(fixed=False):
    seed(0)
    model = FrozenTrunkRegressor(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(_Boxes(800, 150), 16),
                val_loader=loader(_Boxes(256, 151), 64, shuffle=False),
                loss_fn=nn.SmoothL1Loss(beta=0.05), max_steps=300)


def _box_fwd(m, b):
    return m(b[0]) * 32, b[1] * 32


fix("box_random_backbone_under_no_grad", fixed_of(box_random_backbone_under_no_grad), iou_of(_box_fwd),
    "val box IoU")
