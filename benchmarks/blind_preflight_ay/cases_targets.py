"""Targets: what the labels mean: class-index mappings, mixup label mixing, target scales, loss parameterisation."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight_ay.registry import (
    SmallCNN,
    arrows,
    case,
    colour_blobs,
    dots,
    fix,
    fixed_of,
    loader,
    rmse_of,
    seed,
    tensor_loaders,
    to_chw,
    val_acc,
)

# the class folders as os.listdir returns them on the val share (arbitrary order) and the colour each one holds
FOLDERS_LISTDIR = ["tomato", "lime", "sky", "banana"]  # colour index 0..3 = red, green, blue, yellow


@case("class_to_idx_folder_order", "targets",
      "The train split maps folder names to indices with sorted() (as ImageFolder's class_to_idx does), the val "
      "split with the order os.listdir returned: the same class gets a different index in the two splits.",
      r"class_to_idx|sort(ed)?\(|os\.listdir|folder (order|name)|(class|label)[- ](index|idx|mapping|map|order)|"
      r"index mapping|mapping.{0,40}(differ|inconsistent|mismatch)|(differ|inconsistent|mismatch).{0,40}mapping|"
      r"(train|val).{0,60}(different|inconsistent).{0,30}(label|index|indices|mapping)")
def class_to_idx_folder_order(fixed=False):
    seed(10)
    img, colour = colour_blobs(1600, s=11)
    names = [FOLDERS_LISTDIR[c] for c in colour]
    train_map = {c: i for i, c in enumerate(sorted(FOLDERS_LISTDIR))}
    val_map = train_map if fixed else {c: i for i, c in enumerate(FOLDERS_LISTDIR)}
    y_tr = torch.tensor([train_map[n] for n in names[:1200]])
    y_va = torch.tensor([val_map[n] for n in names[1200:]])
    x = to_chw(img)
    model = SmallCNN(4)
    tr, va = tensor_loaders(x[:1200], y_tr, x[1200:], y_va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("class_to_idx_folder_order", fixed_of(class_to_idx_folder_order), val_acc, "val accuracy")


def mixup_loss(fixed, alpha=0.4):
    beta = torch.distributions.Beta(torch.tensor(alpha), torch.tensor(alpha))

    def loss_fn(model, batch):
        x, y = batch
        lam = beta.sample().to(x.device)
        perm = torch.randperm(x.size(0), device=x.device)
        out = model(lam * x + (1 - lam) * x[perm])
        if fixed:
            return lam * F.cross_entropy(out, y) + (1 - lam) * F.cross_entropy(out, y[perm])
        return (1 - lam) * F.cross_entropy(out, y) + lam * F.cross_entropy(out, y[perm])
    return loss_fn


@case("mixup_weights_swapped", "targets",
      "Mixup mixes the images as lam * x + (1 - lam) * x[perm] but weights the losses (1 - lam) * CE(y) + "
      "lam * CE(y[perm]): the label weights are swapped, so a mostly-x image is trained mostly towards y[perm].",
      r"mixup|mix-up|lam(bda)?\b.{0,60}(swap|revers|invert|1 ?- ?lam)|(swap|revers|invert).{0,60}(lam|weight|label)|"
      r"label (mixing|weights?).{0,40}(wrong|inconsistent|mismatch)|y\[perm\]|permuted (label|target)")
def mixup_weights_swapped(fixed=False):
    seed(12)
    img, y = colour_blobs(1600, s=13)
    x, y = to_chw(img), torch.from_numpy(y)
    model = SmallCNN(4)
    tr, va = tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=mixup_loss(fixed), max_steps=300)


fix("mixup_weights_swapped", fixed_of(mixup_weights_swapped), val_acc, "val accuracy")


@case("count_targets_scaled_train_only", "targets",
      "The training counts are divided by MAX_COUNT (12) to keep the regression target in [0, 1] but the validation "
      "counts are left raw: the model learns counts on a 12x smaller scale than it is evaluated (and used) on.",
      r"(train|training)\w*.{0,80}(val|validation)\w*.{0,60}(scale|units?|divided|normali[sz])|"
      r"(divided|scaled|normali[sz]ed) by (12|MAX_COUNT|the max)|/ ?12|MAX_COUNT|(scale|units?) (mismatch|differ)|"
      r"(val|validation) (counts|targets).{0,40}(raw|unscaled|not scaled)|rescale.{0,40}(pred|output)|de-?normali[sz]")
def count_targets_scaled_train_only(fixed=False):
    seed(14)
    img, y = dots(1600, s=15)
    x, y = to_chw(img), torch.from_numpy(y).unsqueeze(1)
    y_tr = y[:1200] if fixed else y[:1200] / 12
    model = SmallCNN(1)
    tr, va = tensor_loaders(x[:1200], y_tr, x[1200:], y[1200:])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.MSELoss(), max_steps=300)


fix("count_targets_scaled_train_only", fixed_of(count_targets_scaled_train_only), rmse_of(), "val RMSE (count)",
    higher=False)


class CountNet(nn.Module):
    """Counting head ending in Softplus: the output is the predicted count (a rate)."""

    def __init__(self):
        super().__init__()
        self.body = SmallCNN(1)
        self.act = nn.Softplus()

    def forward(self, x):
        return self.act(self.body(x))


@case("poisson_log_input_default", "targets",
      "The counting head outputs the rate through Softplus, but nn.PoissonNLLLoss() keeps its default "
      "log_input=True, which treats the output as log(rate): the model learns log-counts and its outputs, read as "
      "counts, are far off.",
      r"log_input|PoissonNLL|log[- ]?(rate|count|space|scale)|exp\(|softplus|(rate|count).{0,40}log")
def poisson_log_input_default(fixed=False):
    seed(16)
    img, y = dots(1600, s=17)
    x, y = to_chw(img), torch.from_numpy(y).unsqueeze(1)
    model = CountNet()
    tr, va = tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:])
    loss = nn.PoissonNLLLoss(log_input=False) if fixed else nn.PoissonNLLLoss()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tr, val_loader=va,
                loss_fn=loss, max_steps=300)


fix("poisson_log_input_default", fixed_of(poisson_log_input_default), rmse_of(), "val RMSE (count)", higher=False)


class ArrowDataset(Dataset):
    """Arrows as uint8 HWC arrays, a random horizontal flip (the usual augmentation), then to CHW floats."""

    def __init__(self, img, y, fixed, train=True):
        self.img, self.y, self.fixed, self.train = img, y, fixed, train
        self.rng = np.random.default_rng(1)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        im, label = self.img[i], int(self.y[i])
        if self.train and self.rng.random() < 0.5:
            im = np.flip(im, axis=1)
            if self.fixed and label < 2:
                label = 1 - label  # a mirrored left arrow is a right arrow
        return torch.from_numpy(np.ascontiguousarray(im)).permute(2, 0, 1).float().div(255), label


@case("hflip_changes_label", "targets",
      "Random horizontal flips are applied to arrows whose class is their left/right direction, without swapping "
      "the label: half the flipped left-pointing arrows are labelled left while pointing right, so left vs right "
      "becomes a coin toss.",
      r"flip.{0,80}(label|class|direction|orientation|left|right|chirality|mirror)|"
      r"(label|class|direction|orientation).{0,80}flip|mirror|RandomHorizontalFlip|"
      r"augmentation.{0,60}(label|class).{0,30}(change|invalid|not (label|class)[- ]preserving)|label[- ]preserving")
def hflip_changes_label(fixed=False):
    seed(18)
    img, y = arrows(1600, s=19)
    model = SmallCNN(4)
    tr = loader(ArrowDataset(img[:1200], y[:1200], fixed), 32)
    va = loader(ArrowDataset(img[1200:], y[1200:], fixed, train=False), 128, shuffle=False)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("hflip_changes_label", fixed_of(hflip_changes_label), val_acc, "val accuracy")
