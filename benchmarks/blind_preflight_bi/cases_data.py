"""Data: samplers, windows, collate functions and label encodings that hand the model the wrong rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from benchmarks.blind_preflight_bi.cases_shapes import K, Coral
from benchmarks.blind_preflight_bi.registry import (
    balanced_accuracy, case, coral_ranks, fix, fixed_of, gen, hetero, imbalanced, loader, mlp, rank_mae_metric,
    rmse_metric, seed, tds,
)


@case("sampler_given_class_weights", "data",
      bug="WeightedRandomSampler is given the per-class weights (length 2) instead of one weight per sample, so it "
          "only ever draws dataset indices 0 and 1.",
      cause_pattern=r"(per.class|class) weights.{0,150}(instead|rather|not).{0,40}(per.sample|each sample|sample "
                    r"weights)|(per.sample|one weight per (sample|row|example)).{0,150}(instead|rather|sampler)|"
                    r"(indices|index) 0 (and|or) 1|only (ever )?(draws|samples|yields).{0,60}(two|2|first)")
def sampler_given_class_weights(fixed: bool = False) -> dict:
    seed(0)
    x, y = imbalanced(s=18)
    yt = y[:1500].long()
    class_w = 1.0 / torch.bincount(yt, minlength=2).float()
    weights = class_w[yt] if fixed else class_w
    sampler = torch.utils.data.WeightedRandomSampler(weights, num_samples=len(yt), replacement=True,
                                                     generator=torch.Generator().manual_seed(0))
    model = mlp(x.shape[1], 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=torch.utils.data.DataLoader(tds(x[:1500], y[:1500, None]), batch_size=64,
                                                         sampler=sampler),
                val_loader=loader(tds(x[1500:], y[1500:]), 250, shuffle=False), loss_fn=nn.BCEWithLogitsLoss())


fix("sampler_given_class_weights", fixed_of(sampler_given_class_weights), balanced_accuracy, "val balanced accuracy")


class Windows(torch.utils.data.Dataset):
    """Windows of a multichannel sensor stream; the target is the reading that follows the window."""

    def __init__(self, x, y, w: int, fixed: bool = True):
        self.x, self.y, self.w, self.fixed = x, y, w, fixed

    def __len__(self):
        return len(self.x) - self.w

    def __getitem__(self, i):
        target = self.y[i + self.w] if self.fixed else self.y[i]
        return self.x[i:i + self.w].reshape(-1), target


def stream(n: int = 2400, c: int = 3, s: int = 19):
    g = gen(s)
    x = torch.randn(n, c, generator=g)
    y = torch.zeros(n)
    y[1:] = torch.tanh(x[:-1, 0] + x[:-1, 1] * x[:-1, 2]) * 2     # next reading depends on the latest inputs
    return x, y


@case("window_target_at_start", "data",
      bug="The sliding-window Dataset labels window i with y[i] (the reading before the window starts) instead of "
          "y[i + window], the reading that follows the window, so the target is unrelated to the window's inputs.",
      cause_pattern=r"(y\[i\]|window (start|begin)|start of the window|before the window).{0,150}(instead|rather|"
                    r"target|label)|(y\[i ?\+ ?(self\.)?w\w*\]|end of the window|after the window|follows the window)"
                    r".{0,100}(instead|rather|should)|(target|label)s?.{0,80}(misalign|offset|shifted|off by)")
def window_target_at_start(fixed: bool = False) -> dict:
    seed(0)
    x, y = stream()
    w = 8
    model = mlp(w * 3, 1)

    def loss_fn(m, batch):
        return F.mse_loss(m(batch[0]).squeeze(-1), batch[1])

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(Windows(x[:1800], y[:1800], w, fixed), 64),
                val_loader=loader(Windows(x[1800:], y[1800:], w, True), 200, shuffle=False), loss_fn=loss_fn)


fix("window_target_at_start", fixed_of(window_target_at_start),
    rmse_metric(lambda m, b: (m(b[0]).squeeze(-1), b[1])), "val RMSE", higher=False)


class Seqs(torch.utils.data.Dataset):
    def __init__(self, n: int = 1200, t: int = 30, s: int = 20):
        g = gen(s)
        self.lengths = torch.randint(5, t + 1, (n,), generator=g)
        self.x = [torch.randn(int(L), 2, generator=g) for L in self.lengths]
        self.y = torch.stack([xi[:, 0].mean() * 3 + xi[-1, 1] for xi in self.x])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def sorting_collate(fixed: bool):
    def collate(items):
        xs = [it[0] for it in items]
        ys = torch.stack([it[1] for it in items])
        lengths = torch.tensor([len(x_) for x_ in xs])
        lengths, order = lengths.sort(descending=True)
        xs = [xs[i] for i in order]
        ys = ys[order] if fixed else ys
        padded = nn.utils.rnn.pad_sequence(xs, batch_first=True)
        return padded, lengths, ys
    return collate


class PackedGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(2, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x, lengths):
        _, h = self.gru(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=True))
        return self.head(h[-1]).squeeze(-1)


def packed_loss(m, batch):
    x, lengths, y = batch
    return F.mse_loss(m(x, lengths), y)


@case("collate_sorts_inputs_not_targets", "data",
      bug="The collate_fn sorts the padded sequences by length for pack_padded_sequence but leaves the targets in "
          "the original order, so inside every batch the targets are paired with the wrong sequences.",
      cause_pattern=r"(sort|order|reorder|permut).{0,150}(target|label|y)s?.{0,80}(not|never|original|unsorted|"
                    r"without)|(target|label)s?.{0,100}(not|never) (re)?(sort|order|permut)|(target|label)s?.{0,80}"
                    r"(paired|matched) with the wrong")
def collate_sorts_inputs_not_targets(fixed: bool = False) -> dict:
    seed(0)
    ds = Seqs()
    train = torch.utils.data.Subset(ds, range(900))
    val = torch.utils.data.Subset(ds, range(900, 1200))
    model = PackedGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, collate_fn=sorting_collate(fixed)),
                val_loader=loader(val, 150, shuffle=False, collate_fn=sorting_collate(True)), loss_fn=packed_loss)


fix("collate_sorts_inputs_not_targets", fixed_of(collate_sorts_inputs_not_targets),
    rmse_metric(lambda m, b: (m(b[0], b[1]), b[2])), "val RMSE", higher=False)


GRADES = ["very low", "low", "medium", "high", "very high"]


class GradedRows(torch.utils.data.Dataset):
    """Rows whose ordinal label arrives as a grade name, encoded to an integer rank here."""

    def __init__(self, x, names, fixed: bool = True):
        vocab = GRADES if fixed else sorted(set(GRADES))
        self.x = x
        self.y = torch.tensor([vocab.index(nm) for nm in names])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def coral_loss(m, batch):
    xb, yb = batch
    return F.binary_cross_entropy_with_logits(m(xb), (yb[:, None] > torch.arange(K - 1)[None, :]).float())


@case("ordinal_labels_alphabetical", "data",
      bug="The Dataset encodes the ordinal grade names with sorted(set(names)), alphabetical order, instead of the "
          "grades' natural order, so the integer ranks CORAL is trained on are not ordered.",
      cause_pattern=r"(alphabet|sorted\(set|lexicograph).{0,150}(order|rank|grade|label)|(grade|rank|label|ordinal)"
                    r".{0,150}(alphabet|not (in )?(their|the) (natural|true|ordinal) order|unordered|scrambled order)")
def ordinal_labels_alphabetical(fixed: bool = False) -> dict:
    seed(0)
    from benchmarks.blind_preflight_bi.registry import ordinal
    x, y = ordinal(s=21)
    names = [GRADES[int(v)] for v in y]
    model = Coral(x.shape[1])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(GradedRows(x[:1200], names[:1200], fixed), 64),
                val_loader=loader(GradedRows(x[1200:], names[1200:], True), 200, shuffle=False), loss_fn=coral_loss)


fix("ordinal_labels_alphabetical", fixed_of(ordinal_labels_alphabetical),
    rank_mae_metric(lambda m, x: coral_ranks(m(x))), "val rank MAE", higher=False)

_ = (hetero,)


def sensor_table(n: int = 1600, s: int = 22):
    """A table of named sensor columns (insertion order as logged) and a target."""
    g = gen(s)
    names = ["temp", "humidity", "pressure", "co2", "accel_x", "accel_y"]
    cols = {nm: torch.randn(n, generator=g) for nm in names}
    w = torch.tensor([1.5, -1.0, 0.5, 2.0, 0.0, -0.5])
    x = torch.stack([cols[nm] for nm in names], 1)
    y = torch.tanh(x @ w / 2) * 2 + 0.1 * torch.randn(n, generator=g)
    return cols, y


class TableRows(torch.utils.data.Dataset):
    def __init__(self, cols: dict, y, rows, order):
        self.x = torch.stack([cols[nm][rows] for nm in order], 1)
        self.y = y[rows]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


@case("train_columns_sorted_by_name", "data",
      bug="The training Dataset stacks the sensor columns in sorted(columns) name order while the validation Dataset "
          "keeps the logged column order, so at evaluation every feature lands in another feature's input slot.",
      cause_pattern=r"(column|feature)s?.{0,150}(order|sorted|permut|slot)\w*.{0,150}(train\w*|validation|val|eval)|"
                    r"(train\w*|validation|val|eval).{0,150}(column|feature)s?.{0,80}(different|other|another|"
                    r"mismatch\w*|sorted) (order|slot)")
def train_columns_sorted_by_name(fixed: bool = False) -> dict:
    seed(0)
    cols, y = sensor_table()
    logged = list(cols)
    model = mlp(len(cols), 1)
    train = TableRows(cols, y, slice(0, 1200), logged if fixed else sorted(cols))
    val = TableRows(cols, y, slice(1200, None), logged)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 64), val_loader=loader(val, 200, shuffle=False),
                loss_fn=lambda m, b: F.mse_loss(m(b[0]).squeeze(-1), b[1]))


fix("train_columns_sorted_by_name", fixed_of(train_columns_sorted_by_name),
    rmse_metric(lambda m, b: (m(b[0]).squeeze(-1), b[1])), "val RMSE", higher=False)
