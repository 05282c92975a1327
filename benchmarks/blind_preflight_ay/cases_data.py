"""Data: what reaches the model: colour order, value range and normalisation, augmentation, pairing, dtype."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight_ay.registry import (
    SmallCNN,
    case,
    colour_blobs,
    fix,
    fixed_of,
    loader,
    seed,
    tensor_loaders,
    to_chw,
    val_acc,
)


@case("bgr_train_rgb_val", "data",
      "The training images are read with cv2.imread (BGR channel order) and never converted with cv2.cvtColor(..., "
      "cv2.COLOR_BGR2RGB), while the validation images come through PIL (RGB): red and blue are swapped between "
      "training and validation on colour-defined classes.",
      r"BGR|cvtColor|COLOR_BGR2RGB|cv2|channel order|red and blue|blue and red|(swap|revers).{0,30}channel|"
      r"channels?.{0,30}(swap|revers)|\[\.\.\., ?::-1\]")
def bgr_train_rgb_val(fixed=False):
    seed(40)
    img, y = colour_blobs(1600, s=41)
    train_img = img[:1200] if fixed else np.ascontiguousarray(img[:1200, :, :, ::-1])  # what cv2.imread returns
    x_tr, x_va = to_chw(train_img), to_chw(img[1200:])
    y = torch.from_numpy(y)
    model = SmallCNN(4)
    tr, va = tensor_loaders(x_tr, y[:1200], x_va, y[1200:])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("bgr_train_rgb_val", fixed_of(bgr_train_rgb_val), val_acc, "val accuracy")

IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


@case("imagenet_stats_on_0_255", "data",
      "ImageNet mean/std (0.485, 0.456, 0.406)/(0.229, 0.224, 0.225), which assume pixels in [0, 1], are applied to "
      "float pixels still in [0, 255] (the ToTensor /255 step was skipped): inputs reach ~1000 and the BN-free "
      "network trains badly.",
      r"\[0, ?255\]|0-255|0\.\.255|/ ?255|divid\w* by 255|ToTensor|ImageNet (mean|stat)|"
      r"(mean|std|stat\w*).{0,60}\[0, ?1\]|pixel.{0,40}(range|255)")
def imagenet_stats_on_0_255(fixed=False):
    seed(42)
    img, y = colour_blobs(1600, s=43)
    x = torch.from_numpy(img).permute(0, 3, 1, 2).float()
    if fixed:
        x = x / 255
    x = (x - IMAGENET_MEAN) / IMAGENET_STD
    y = torch.from_numpy(y)
    model = SmallCNN(4, bn=False)
    tr, va = tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:])
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), train_loader=tr,
                val_loader=va, loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("imagenet_stats_on_0_255", fixed_of(imagenet_stats_on_0_255), val_acc, "val accuracy")


class JitterDataset(Dataset):
    """uint8 HWC images with a hand-written colour jitter (brightness, and a hue rotation when hue is on)."""

    def __init__(self, img, y, hue: bool, train=True):
        self.img, self.y, self.hue, self.train = img, y, hue, train
        self.rng = np.random.default_rng(2)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        im = self.img[i].astype(np.float32)
        if self.train:
            im = im * self.rng.uniform(0.8, 1.2)
            if self.hue:  # hue=0.5: any rotation of the colour wheel, in 120-degree steps
                im = np.roll(im, int(self.rng.integers(0, 3)), axis=-1)
        x = torch.from_numpy(np.clip(im, 0, 255) / 255).permute(2, 0, 1).float()
        return x, int(self.y[i])


@case("hue_jitter_on_colour_classes", "data",
      "The colour-jitter augmentation includes a full hue rotation (ColorJitter(hue=0.5)-style) on a task whose "
      "classes are defined by colour: red, green and blue blobs are turned into one another while keeping their "
      "label, so the colour that defines the class is randomised.",
      r"hue|ColorJitter|colou?r jitter|colou?r augment|augmentation.{0,80}(colou?r|label|class)|"
      r"(colou?r|class|label).{0,60}(randomi[sz]|destroy|altered|changed).{0,30}augment|label[- ]preserving")
def hue_jitter_on_colour_classes(fixed=False):
    seed(44)
    img, y = colour_blobs(1600, s=45)
    model = SmallCNN(4)
    tr = loader(JitterDataset(img[:1200], y[:1200], hue=not fixed), 32)
    va = loader(JitterDataset(img[1200:], y[1200:], hue=False, train=False), 128, shuffle=False)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("hue_jitter_on_colour_classes", fixed_of(hue_jitter_on_colour_classes), val_acc, "val accuracy")


class PathDataset(Dataset):
    """Images looked up by path (here: by index into an in-memory 'disk'), labels from a parallel list."""

    def __init__(self, disk, paths, labels):
        self.disk, self.paths, self.labels = disk, paths, labels

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return to_chw(self.disk[self.paths[i]][None])[0], int(self.labels[i])


@case("paths_shuffled_without_labels", "data",
      "Before the train split the file paths are shuffled with random.shuffle(paths) but the parallel labels list "
      "is not shuffled with them: every training image gets another image's label.",
      r"shuffl\w*.{0,60}(label|target|separately|independent|pair|path)|(label|target)s?.{0,60}(shuffl|misalign|"
      r"out of sync)|(path|image|file)s?.{0,60}(label|target)s?.{0,40}(mismatch|misalign|out of sync|no longer)|zip\(")
def paths_shuffled_without_labels(fixed=False):
    seed(46)
    img, y = colour_blobs(1600, s=47)
    disk = {f"img_{i:05d}.png": img[i] for i in range(len(img))}
    paths, labels = list(disk)[:1200], list(y[:1200])
    rnd = random.Random(0)
    if fixed:
        pairs = list(zip(paths, labels))
        rnd.shuffle(pairs)
        paths, labels = map(list, zip(*pairs))
    else:
        rnd.shuffle(paths)
    model = SmallCNN(4)
    tr = loader(PathDataset(disk, paths, labels), 32)
    va = loader(PathDataset(disk, list(disk)[1200:], list(y[1200:])), 128, shuffle=False)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("paths_shuffled_without_labels", fixed_of(paths_shuffled_without_labels), val_acc, "val accuracy")


DATA_MEAN = torch.tensor([0.45, 0.45, 0.43]).view(1, 3, 1, 1)
DATA_STD = torch.tensor([0.12, 0.12, 0.12]).view(1, 3, 1, 1)


@case("val_transform_missing_normalize", "data",
      "The training transform is ToTensor + Normalize(mean, std) with the dataset's statistics, but the validation "
      "transform is only ToTensor: the model is evaluated on inputs in [0, 1] while it learned on standardised "
      "inputs (mean 0, std 1).",
      r"Normali[sz]e\(|(val|validation)\w*.{0,60}(not|never|without|missing).{0,30}normali[sz]|"
      r"normali[sz]\w*.{0,60}(only|not).{0,30}(train|val)|(train|val)\w*.{0,60}(transform|preprocess)\w*.{0,60}"
      r"(differ|mismatch|inconsistent|same)|(mean|std).{0,40}(val|validation)")
def val_transform_missing_normalize(fixed=False):
    seed(48)
    img, y = colour_blobs(1600, s=49)
    x = to_chw(img)
    y = torch.from_numpy(y)
    x_tr = (x[:1200] - DATA_MEAN) / DATA_STD
    x_va = (x[1200:] - DATA_MEAN) / DATA_STD if fixed else x[1200:]
    model = SmallCNN(4)
    tr, va = tensor_loaders(x_tr, y[:1200], x_va, y[1200:])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("val_transform_missing_normalize", fixed_of(val_transform_missing_normalize), val_acc, "val accuracy")
