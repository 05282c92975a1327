"""Mechanics: how the hand-written dense and survival losses compute (softmax axis, positive mask of a focal loss,
the sign of an IoU loss, the risk-set order of a Cox likelihood, the interval mask of a discrete-time hazard)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_bd import synth
from benchmarks.blind_preflight_bd.common import BoxRegressor, HeatmapNet, TinyUNet, cox_fwd, risk_mlp
from benchmarks.blind_preflight_bd.registry import (
    case,
    cindex_of,
    fix,
    fixed_of,
    iou_of,
    loader,
    mean_over,
    miou_of,
    pck_of,
    seed,
)


# --- 1. multi-class soft Dice with the softmax over the batch axis -------------------------------------------------
def soft_dice_loss(fixed):
    def loss(logits, mask, eps=1.0):
        probs = torch.softmax(logits.float(), dim=1 if fixed else 0)
        onehot = F.one_hot(mask, logits.shape[1]).permute(0, 3, 1, 2).float()
        inter = (probs * onehot).sum(dim=(0, 2, 3))
        denom = probs.sum(dim=(0, 2, 3)) + onehot.sum(dim=(0, 2, 3))
        return 1 - ((2 * inter + eps) / (denom + eps)).mean()
    return loss


class DiceLoss(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fn = soft_dice_loss(fixed)

    def forward(self, logits, mask):
        return self.fn(logits, mask)


@case("seg_dice_softmax_over_batch_dim", "mechanics",
      "The soft Dice loss normalises the (N, C, H, W) logits with torch.softmax(logits, dim=0), across the images of "
      "the batch, instead of dim=1 across the classes: each pixel's class 'probabilities' do not sum to 1, the Dice "
      "overlap rewards one image outscoring the others, and the class argmax the metric reads is barely trained.",
      r"softmax.{0,40}dim\s*=\s*0|dim\s*=\s*0.{0,60}softmax|dim\s*=\s*1|(batch|sample) (dim|axis|dimension).{0,60}"
      r"(softmax|normali[sz])|(softmax|normali[sz]\w*) (over|across|along) (the )?(batch|images|samples)|class "
      r"(dim|axis|dimension|channel)|probabilities.{0,40}(do not|don't) sum to (1|one)")
def seg_dice_softmax_over_batch_dim(fixed=False):
    seed(0)
    imgs, masks = synth.seg_shapes(640, s=160)
    vi, vm = synth.seg_shapes(256, s=161)
    model = TinyUNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(synth.t(imgs), synth.t(masks)), 16),
                val_loader=loader(TensorDataset(synth.t(vi), synth.t(vm)), 64, shuffle=False),
                loss_fn=DiceLoss(fixed), max_steps=300)


def _seg_fwd(m, b):
    return m(b[0]), b[1]


fix("seg_dice_softmax_over_batch_dim", fixed_of(seg_dice_softmax_over_batch_dim), miou_of(_seg_fwd), "val mIoU")


# --- 2. CenterNet focal loss: positives found with gt.eq(1) on Gaussians drawn at sub-pixel centres ---------------
STRIDE = 2


class SubpixelHeatmaps(Dataset):
    def __init__(self, n, s, fixed):
        self.imgs, self.ctr = synth.blob_centers(n, s=s)
        self.hm = synth.gaussian_heatmap(self.ctr, 16, STRIDE, exact_peak=False)   # float centre: peak < 1
        self.fixed = fixed

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        return torch.from_numpy(self.imgs[i]), torch.from_numpy(self.hm[i]), torch.from_numpy(self.ctr[i])


def focal_fn(fixed):
    def loss_fn(model, batch, alpha=2, beta=4):
        imgs, gt, _ = batch
        gt = gt.unsqueeze(1)
        pred = torch.sigmoid(model(imgs).float()).clamp(1e-4, 1 - 1e-4)
        if fixed:   # the peak cell of each map is the positive
            pos = (gt == gt.amax(dim=(2, 3), keepdim=True)).float()
        else:
            pos = gt.eq(1).float()
        pos_loss = torch.log(pred) * (1 - pred) ** alpha * pos
        neg_loss = torch.log(1 - pred) * pred ** alpha * (1 - gt) ** beta * (1 - pos)
        return -(pos_loss.sum() + neg_loss.sum()) / pos.sum().clamp(min=1)
    return loss_fn


def _decode(hm):
    n, _, h, w = hm.shape
    idx = hm.reshape(n, -1).argmax(1)
    return torch.stack([(idx % w).float(), (idx // w).float()], 1) * STRIDE + STRIDE / 2


@case("centernet_focal_no_positive_pixels", "mechanics",
      "The focal loss takes its positives as gt.eq(1), but the Gaussians are drawn at the sub-pixel centre / stride, "
      "so no heatmap cell is exactly 1.0: every batch has zero positive pixels, only the negative term trains, and "
      "the head learns to predict background everywhere.",
      r"eq\(1\)|==\s*1|exactly (1|one)|no positive|zero positives?|num_pos|(peak|maximum).{0,60}(below|less than|"
      r"never|not) (1|one|exactly)|sub-?pixel|(integer|int\(\)|round).{0,40}(centre|center)|only (the )?negative "
      r"(term|loss|pixels)")
def centernet_focal_no_positive_pixels(fixed=False):
    seed(0)
    model = HeatmapNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(SubpixelHeatmaps(800, 170, fixed), 16),
                val_loader=loader(SubpixelHeatmaps(256, 171, fixed), 64, shuffle=False),
                loss_fn=focal_fn(fixed), max_steps=300)


def _detections(m, b, threshold=0.3):
    """CenterNet decoding: the peak is a detection only when its score clears the threshold; a missed object is
    reported at (-100, -100) so it never counts as a hit."""
    hm = torch.sigmoid(m(b[0]).float())
    xy = _decode(hm)
    score = hm.flatten(1).amax(1)
    return torch.where((score >= threshold)[:, None], xy, torch.full_like(xy, -100.0)), b[2]


fix("centernet_focal_no_positive_pixels", fixed_of(centernet_focal_no_positive_pixels), pck_of(_detections),
    "val recall@3px (score >= 0.3)")


# --- 3. an IoU loss that returns the IoU ---------------------------------------------------------------------------
def iou_loss(fixed):
    def loss(pred, target):
        x0 = torch.maximum(pred[:, 0], target[:, 0])
        y0 = torch.maximum(pred[:, 1], target[:, 1])
        x1 = torch.minimum(pred[:, 2], target[:, 2])
        y1 = torch.minimum(pred[:, 3], target[:, 3])
        inter = (x1 - x0).clamp(min=0) * (y1 - y0).clamp(min=0)
        area = lambda b: (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)  # noqa: E731
        iou = inter / (area(pred) + area(target) - inter + 1e-7)
        l1 = (pred - target).abs().mean()
        return (1 - iou).mean() + l1 if fixed else iou.mean() + l1
    return loss


class CornerBoxRegressor(BoxRegressor):
    """Predicts (x0, y0) and a positive (w, h) so the corners stay ordered."""

    def forward(self, x):
        o = super().forward(x)
        return torch.cat([o[:, :2] * 0.8, o[:, :2] * 0.8 + o[:, 2:] * 0.6], 1)


class _Boxes(Dataset):
    def __init__(self, n, s):
        self.imgs, self.boxes = synth.box_images(n, s=s)

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        return torch.from_numpy(self.imgs[i]), torch.from_numpy(self.boxes[i] / 32)


class IoULoss(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fn = iou_loss(fixed)

    def forward(self, pred, target):
        return self.fn(pred, target)


@case("box_iou_loss_returns_iou", "mechanics",
      "The IoU loss returns iou.mean() (plus an L1 term) instead of (1 - iou).mean(): minimising it drives the overlap "
      "with the true box down, so the L1 term and the IoU term pull against each other and the regressor learns "
      "boxes that avoid the object.",
      r"1\s*-\s*iou|\(1 - (g)?iou\)|sign|(maximi[sz]|minimi[sz]).{0,40}(iou|overlap)|(iou|overlap).{0,40}"
      r"(minimi[sz]|maximi[sz]|driven down|pushed down|decreas)|negat(ed|ive) (iou|overlap)|returns? (the )?iou "
      r"(itself|instead|rather)|similarity (instead of|not) (a )?(loss|distance)")
def box_iou_loss_returns_iou(fixed=False):
    seed(0)
    model = CornerBoxRegressor()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(_Boxes(800, 180), 16),
                val_loader=loader(_Boxes(256, 181), 64, shuffle=False),
                loss_fn=IoULoss(fixed), max_steps=300)


def _box_fwd(m, b):
    return m(b[0]) * 32, b[1] * 32


fix("box_iou_loss_returns_iou", fixed_of(box_iou_loss_returns_iou), iou_of(_box_fwd), "val box IoU")


# --- 4. a Cox loss that relies on the dataset being sorted, fed by a shuffling DataLoader -------------------------
def cox_sorted_input_loss(fixed):
    def loss_fn(model, batch):
        x, time, event = batch
        risk = model(x).squeeze(-1)
        if fixed:
            order = torch.argsort(time, descending=True)
            risk, event = risk[order], event[order]
        # rows arrive sorted by descending time (see SortedCohort), so the cumulative sum is the risk set
        log_risk_set = torch.log(torch.cumsum(torch.exp(risk), dim=0))
        return -((risk - log_risk_set) * event).sum() / event.sum().clamp(min=1)
    return loss_fn


class SortedCohort(Dataset):
    def __init__(self, n, s):
        x, t, e, _ = synth.survival_table(n, s=s, censor_rate=1.0, censor_feature=3)
        order = np.argsort(-t)                       # descending follow-up, as DeepSurv expects
        self.x, self.t, self.e = x[order], t[order], e[order]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i]), torch.tensor(self.t[i]), torch.tensor(self.e[i])


@case("cox_cumsum_risk_set_on_shuffled_batches", "mechanics",
      "The Cox loss builds each risk set with torch.cumsum(exp(risk)) assuming rows sorted by descending time; the "
      "dataset is sorted, but the DataLoader shuffles, so within a batch the 'risk set' of a death is a random subset "
      "of subjects instead of those still at risk at its time.",
      r"sort|risk set|cumsum|cumulative sum|shuffl.{0,60}(order|sorted)|order(ed|ing)? (by|of) (survival |event |"
      r"follow-?up )?time|argsort|descending time|(still )?at risk (at|when)")
def cox_cumsum_risk_set_on_shuffled_batches(fixed=False):
    seed(0)
    xv, _, _, tv = synth.survival_table(600, s=191)
    model = risk_mlp()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4),
                train_loader=loader(SortedCohort(1200, 190), 64),
                val_loader=loader(TensorDataset(synth.t(xv), synth.t(tv), torch.ones(600)), 200, shuffle=False),
                loss_fn=cox_sorted_input_loss(fixed), max_steps=300)


fix("cox_cumsum_risk_set_on_shuffled_batches", fixed_of(cox_cumsum_risk_set_on_shuffled_batches),
    cindex_of(cox_fwd), "val C-index")


# --- 5. discrete-time hazard BCE averaged over every interval, not only those at risk -----------------------------
N_BINS = 10


def hazard_bce(fixed):
    def loss_fn(model, batch):
        x, k, e = batch
        logits = model(x)                                              # (N, K)
        steps = torch.arange(logits.shape[1])
        target = ((steps[None, :] == k[:, None]) & (e[:, None] > 0)).float()
        bce = F.binary_cross_entropy_with_logits(logits.float(), target, reduction="none")
        if fixed:
            at_risk = (steps[None, :] <= k[:, None]).float()
            return (bce * at_risk).sum() / at_risk.sum()
        return bce.mean()
    return loss_fn


def _masked_nll(logits, k, e):
    steps = torch.arange(logits.shape[1])
    target = ((steps[None, :] == k[:, None]) & (e[:, None] > 0)).float()
    at_risk = (steps[None, :] <= k[:, None]).float()
    return (F.binary_cross_entropy_with_logits(logits.float(), target, reduction="none") * at_risk).sum()


def _intervals(n, s, edges=None):
    x, t, e, _ = synth.survival_table(n, s=s, censor_rate=0.5)
    if edges is None:
        edges = np.quantile(t, np.linspace(0, 1, N_BINS + 1)[1:-1])
    return TensorDataset(synth.t(x), synth.t(synth.discretize(t, edges).astype(np.int64)), synth.t(e)), edges


@case("hazard_bce_over_intervals_after_exit", "mechanics",
      "The per-interval BCE of the discrete-time hazard model is averaged over all K intervals for every subject, "
      "including the intervals after its death or censoring: each subject also counts as having survived every "
      "later interval, so the hazards are pushed toward 0 and the likelihood is not the survival likelihood.",
      r"at[- ]risk|risk set|after (the |its )?(death|event|censor|exit)|(interval|period)s? (after|beyond|past)|"
      r"mask.{0,60}(interval|period|bce|hazard)|survived (every|all) (later )?interval|(not|never) (at risk|"
      r"observed)|censor.{0,60}(mask|interval)")
def hazard_bce_over_intervals_after_exit(fixed=False):
    seed(0)
    train, edges = _intervals(1500, 200)
    val, _ = _intervals(600, 201, edges)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, N_BINS))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 64), val_loader=loader(val, 200, shuffle=False),
                loss_fn=hazard_bce(fixed), max_steps=300)


def _val_nll(model, kw):
    return mean_over(model, kw["val_loader"], lambda m, b: (_masked_nll(m(b[0]), b[1], b[2]).item(), b[0].shape[0]))


fix("hazard_bce_over_intervals_after_exit", fixed_of(hazard_bce_over_intervals_after_exit), _val_nll,
    "val discrete-time NLL", higher=False)
