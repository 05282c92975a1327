"""Family ``data``: transfer sets, cached teacher outputs, replay buffers and their collate functions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.blind_preflight_be.registry import case, fix, fixed_of, loader, plain_acc, seed
from benchmarks.blind_preflight_be.synth import blobs, mlp, split, teacher


def _kl(s_logits, t_logits, T):
    return F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1), reduction="batchmean") * T * T


# --- 1. teacher logits cached while iterating a shuffled loader ---------------------------------------------------------
class CachedKD(Dataset):
    def __init__(self, x, logits):
        self.x, self.logits = x, logits

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.logits[i]


def kd_cached_logits_shuffled(fixed: bool = False):
    seed(0)
    x, y = blobs(3000, 16, 5, 19)
    (xt, yt), (xv, yv) = split(x, y, 2400)
    t = teacher(3000, 16, 5, 19)
    cache = []
    with torch.no_grad():                       # one pass of the teacher over the transfer set, saved to disk
        for (xb,) in DataLoader(TensorDataset(xt), batch_size=256, shuffle=not fixed,
                                generator=torch.Generator().manual_seed(5)):
            cache.append(t(xb))
    student = mlp(16, 32, 5)
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=3e-3),
                train_loader=loader(CachedKD(xt, torch.cat(cache)), 64),
                val_loader=loader(TensorDataset(xv, yv), 256, False),
                loss_fn=lambda m, b: _kl(m(b[0]), b[1], 3.0), max_steps=300)


case("kd_cached_logits_shuffled", "data",
     "The teacher logits were cached by iterating a DataLoader with shuffle=True, so logits[i] belongs to another "
     "sample than x[i] and the student is distilled onto targets of random other inputs; cache with shuffle=False "
     "(or store the indices) so the logits stay aligned with the samples.",
     r"(cach|comput|produc)\w*.{0,40}shuffl|shuffled (loader|order)|misalign\w*|not aligned|another sample|"
     r"wrong (sample|row|input)|(cached|stored) (teacher )?logits?.{0,80}(order|belong|sample)|dataset orde"
     r"r",
     )(kd_cached_logits_shuffled)
fix("kd_cached_logits_shuffled", fixed_of(kd_cached_logits_shuffled), plain_acc, "val acc")


# --- 2. replay collate_fn concatenating inputs and labels in different orders -----------------------------------------
def replay_collate_label_order(fixed: bool = False):
    seed(0)
    x, y = blobs(3600, 16, 8, 20)
    (xt, yt), (xv, yv) = split(x, y, 2800)
    old = yt < 4
    buf_x, buf_y = xt[old][:600], yt[old][:600]            # replay buffer of the first task
    new_x, new_y = xt[~old], yt[~old]
    g = torch.Generator().manual_seed(3)

    def replay_collate(batch):
        xb = torch.stack([b[0] for b in batch])
        yb = torch.stack([b[1] for b in batch])
        j = torch.randint(0, len(buf_x), (len(batch),), generator=g)
        if fixed:
            return torch.cat([buf_x[j], xb]), torch.cat([buf_y[j], yb])
        return torch.cat([buf_x[j], xb]), torch.cat([yb, buf_y[j]])
    model = mlp(16, 64, 8)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(new_x, new_y), 32, collate_fn=replay_collate),
                val_loader=loader(TensorDataset(xv, yv), 256, False), loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("replay_collate_label_order", "data",
     "The replay collate_fn concatenates the inputs as [replay, new] but the labels as [new, replay], so every input "
     "in the mixed batch is paired with another sample's label; concatenate labels in the same order as inputs.",
     r"collate|same order|order of (the )?(concat|cat)|misalign\w*|paired with|wrong labels?|(inputs|featur"
     r"es) and labels.{0,40}(order|aligned)",
     )(replay_collate_label_order)
fix("replay_collate_label_order", fixed_of(replay_collate_label_order), plain_acc, "val acc (all 8 classes)")


# --- 3. student Dataset standardises features; the teacher was trained on raw ones ------------------------------------
class Standardised(Dataset):
    def __init__(self, x, y, mean, std):
        self.x, self.y, self.mean, self.std = x, y, mean, std

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return (self.x[i] - self.mean) / self.std, self.y[i]


class RawTeacherWrapper(nn.Module):
    """The raw-feature teacher; ``mean``/``std`` undo the student's standardisation when given."""

    def __init__(self, t, mean=None, std=None):
        super().__init__()
        self.t, self.mean, self.std = t, mean, std

    def forward(self, x):
        return self.t(x * self.std + self.mean if self.mean is not None else x)


def kd_standardised_inputs_raw_teacher(fixed: bool = False):
    seed(0)
    z, y = blobs(3000, 16, 5, 21)
    t = teacher(3000, 16, 5, 21)
    scale, shift = torch.linspace(0.5, 4.0, 16), torch.linspace(-3, 6, 16)
    raw = z * scale + shift                                  # sensor units
    tz = RawTeacherWrapper(nn.Sequential(_Affine(scale, shift), t))   # teacher took raw sensor units
    (xt, yt), (xv, yv) = split(raw, y, 2400)
    mean, std = xt.mean(0), xt.std(0)
    teach = RawTeacherWrapper(tz.t, mean, std) if fixed else tz
    student = mlp(16, 32, 5)

    def kd_loss(m, b):
        xb, _ = b
        with torch.no_grad():
            tl = teach(xb)
        return _kl(m(xb), tl, 3.0)
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=3e-3),
                train_loader=loader(Standardised(xt, yt, mean, std), 64),
                val_loader=loader(Standardised(xv, yv, mean, std), 256, False), loss_fn=kd_loss, max_steps=300)


class _Affine(nn.Module):
    """Inverse of the sensor calibration: the teacher network was trained on raw sensor units."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return (x - self.shift) / self.scale


case("kd_standardised_inputs_raw_teacher", "data",
     "The student's Dataset standardises the features in __getitem__ and the teacher, trained on raw sensor units, is "
     "fed the same standardised batch, so its soft targets are predictions on out-of-range inputs; give the teacher "
     "the raw features (or undo the standardisation) before computing its logits.",
     r"teacher.{0,80}(standardi|normali|raw)|(standardi|normali)\w*.{0,80}teacher|raw (features|inputs|unit"
     r"s)|preprocessing mismatch|distribution (shift|mismatch)",
     )(kd_standardised_inputs_raw_teacher)
fix("kd_standardised_inputs_raw_teacher", fixed_of(kd_standardised_inputs_raw_teacher), plain_acc, "val acc")


# --- 4. synthetic transfer set drawn with torch.rand instead of the data's distribution --------------------------------
def kd_transfer_set_uniform(fixed: bool = False):
    seed(0)
    x, y = blobs(3000, 16, 5, 22)
    t = teacher(3000, 16, 5, 22)
    g = torch.Generator().manual_seed(8)
    # data-free distillation: a synthetic transfer set of 2400 feature vectors (the features are standardised)
    transfer = torch.randn(2400, 16, generator=g) if fixed else torch.rand(2400, 16, generator=g)
    with torch.no_grad():
        soft = t(transfer)
    student = mlp(16, 32, 5)
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(transfer, soft), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 200, False),
                loss_fn=lambda m, b: _kl(m(b[0]), b[1], 3.0), max_steps=300)


case("kd_transfer_set_uniform", "data",
     "The synthetic transfer set is drawn with torch.rand, uniform on [0, 1) in every feature, while the real "
     "features are standardised (mean 0, std 1, half of them negative), so the student only sees the teacher on a "
     "small corner of the input space; sample the transfer set with torch.randn (the data's distribution).",
     r"torch\.rand\b|randn|uniform|\[0, ?1\)|data distribution|corner|(no|never) negative|transfer set",
     )(kd_transfer_set_uniform)
fix("kd_transfer_set_uniform", fixed_of(kd_transfer_set_uniform), plain_acc, "val acc")


# --- 5. replay buffer filled from a label-sorted dataset ---------------------------------------------------------------
def replay_buffer_sorted_head(fixed: bool = False):
    seed(0)
    x, y = blobs(3600, 16, 8, 23)
    (xt, yt), (xv, yv) = split(x, y, 2800)
    old = yt < 4
    ox, oy = xt[old], yt[old]
    order = torch.argsort(oy, stable=True)                   # task-1 data as exported: sorted by class
    ox, oy = ox[order], oy[order]
    if fixed:
        pick = torch.randperm(len(ox), generator=torch.Generator().manual_seed(2))[:300]
    else:
        pick = torch.arange(300)                             # "keep the first 300 samples"
    ds = TensorDataset(torch.cat([ox[pick], xt[~old]]), torch.cat([oy[pick], yt[~old]]))
    model = mlp(16, 64, 8)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), train_loader=loader(ds, 64),
                val_loader=loader(TensorDataset(xv, yv), 256, False), loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("replay_buffer_sorted_head", "data",
     "The replay buffer keeps the first 300 rows of the task-1 data, which is sorted by class, so it holds only "
     "class 0 and the old classes 1-3 are never replayed and are forgotten; sample the buffer at random (or per "
     "class, reservoir sampling).",
     r"sorted|first \d+ (rows|samples)|only (one|a single|class 0)|class[- ]balanced|per class|random(ly)? sampl\w*|"
     r"reservoir|never replayed|forgott?\w*",
     )(replay_buffer_sorted_head)
fix("replay_buffer_sorted_head", fixed_of(replay_buffer_sorted_head), plain_acc, "val acc (all 8 classes)")
