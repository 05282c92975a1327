"""Set aa, family data: the Dataset, its augmentation, its normalisation, the image decoding or the collate
function hands the model inputs that no longer carry (or match) what the labels describe."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

from benchmarks.blind_preflight_aa.cases_mechanics import BinarySegNet
from benchmarks.blind_preflight_aa.registry import (
    acc_of,
    blob_scenes,
    case,
    fg_iou_of,
    fix,
    fixed_of,
    gen,
    loader,
    seed,
)

# ------------------------------------------------------------------------------------------------------------------
# 21. Segmentation augmentation: the same random transform object called on the image and on the mask separately.
# ------------------------------------------------------------------------------------------------------------------

class RandomFlipRotate:
    """A random horizontal / vertical flip and a random multiple of 90 degrees, drawn at each call."""

    def __call__(self, t: torch.Tensor, params=None):
        hflip, vflip, k = params if params is not None else self.draw()
        if hflip:
            t = t.flip(-1)
        if vflip:
            t = t.flip(-2)
        return torch.rot90(t, k, dims=(-2, -1))

    @staticmethod
    def draw():
        return bool(torch.rand(1) < 0.5), bool(torch.rand(1) < 0.5), int(torch.randint(0, 4, (1,)))


class CellSegDataset(Dataset):
    def __init__(self, img, masks, augment: bool, shared_params: bool = False):
        self.img, self.masks, self.augment, self.shared = img, masks, augment, shared_params
        self.transform = RandomFlipRotate()

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        img, mask = self.img[i], self.masks[i]
        if self.augment:
            if self.shared:
                params = self.transform.draw()
                img, mask = self.transform(img, params), self.transform(mask, params)
            else:
                img = self.transform(img)
                mask = self.transform(mask)
        return img, mask


@case("image_mask_separate_random", "data",
      bug="The cell-segmentation dataset calls the random flip/rotate transform once on the image and once on the "
          "mask, so each call draws its own random flip and rotation: 7 times out of 8 the mask no longer lies on the "
          "image it labels.",
      cause_pattern=r"(same|identical|shared|one|single) (random )?(transform|augmentation|flip|rotation|params|parameters|seed|draw)"
                    r".{0,80}(image|mask|both|pair)"
                    r"|(image|mask)s? .{0,60}(different|independent|separate)\w* (random )?(transforms?|augmentations?|flips?|rotations?|draws?|params|parameters)"
                    r"|(masks?|targets?) .{0,60}(misaligned|out of (alignment|register|sync)|no longer (aligned|lies? on|matches?))"
                    r"|(misaligned|out of sync).{0,60}(masks?|augment\w*)"
                    r"|(geometric|spatial) (augmentation|transform)s?.{0,60}(mask|target)")
def image_mask_separate_random(fixed: bool = False):
    seed(0)
    x, m = blob_scenes(768, s=51)
    m = m[:, None]                                              # (N, 1, H, W), like the logits
    model = BinarySegNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(CellSegDataset(x[:640], m[:640], augment=True, shared_params=fixed), 32),
                val_loader=loader(CellSegDataset(x[640:], m[640:], augment=False), 128, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=2000)


def _seg_masks(m, b):
    return m(b[0]) > 0, b[1] > 0.5


fix("image_mask_separate_random", fixed_of(image_mask_separate_random), fg_iou_of(_seg_masks), "val IoU")


# ------------------------------------------------------------------------------------------------------------------
# 22. Arrow / turn-sign classification with RandomHorizontalFlip: a flipped 'left' arrow is a 'right' arrow.
# ------------------------------------------------------------------------------------------------------------------

def arrow_templates(size: int = 16) -> torch.Tensor:
    """Noise-free arrows: 0 left, 1 right, 2 up, 3 down (shaft + head)."""
    base = torch.zeros(4, size, size)
    c = size // 2
    base[0, c - 1:c + 1, 4:13] = 1.0                           # shaft
    for k in range(4):
        base[0, c - 1 - k:c + 1 + k, 4 + k] = 1.0              # head pointing left
    base[1] = base[0].flip(-1)
    base[2] = base[0].t()
    base[3] = base[2].flip(-2)
    return base


def arrow_images(n: int, size: int = 16, s: int = 0):
    """Classes: 0 left, 1 right, 2 up, 3 down arrow, at a random offset, in noise."""
    g = gen(s)
    base = arrow_templates(size)
    y = torch.randint(0, 4, (n,), generator=g)
    img = 0.4 * torch.randn(n, 1, size, size, generator=g)
    for i in range(n):
        dy, dx = torch.randint(-2, 3, (2,), generator=g).tolist()
        img[i, 0] += 1.5 * torch.roll(base[y[i]], shifts=(dy, dx), dims=(0, 1))
    return img, y


class SignDataset(Dataset):
    def __init__(self, img, y, train: bool, hflip: bool = True):
        self.img, self.y, self.train, self.hflip = img, y, train, hflip

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        img = self.img[i]
        if self.train:
            if self.hflip and torch.rand(1).item() < 0.5:      # RandomHorizontalFlip(p=0.5), "standard" augmentation
                img = img.flip(-1)
            img = img + 0.1 * torch.randn_like(img)            # light noise jitter
        return img, self.y[i]


class SignNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                 nn.Linear(32 * 16, 4))

    def forward(self, x):
        return self.net(x)


@case("hflip_left_right_classes", "data",
      bug="The traffic-arrow classifier is trained with RandomHorizontalFlip(p=0.5), but its classes are 'left' and "
          "'right' arrows (and up/down): a flipped left arrow is a right arrow still labelled 'left', so half the "
          "left/right examples carry the opposite label and the model cannot tell the two apart.",
      cause_pattern=r"(horizontal|left[- ]right|hflip|mirror)\w*.{0,100}(label|class|orientation|direction|chiral|semantic)"
                    r"|(label|class|orientation|direction)\w*.{0,100}(horizontal(ly)? flip|hflip|mirror)"
                    r"|RandomHorizontalFlip|label[- ]preserving|(not|isn't|is not) (label[- ])?invariant")
def hflip_left_right_classes(fixed: bool = False):
    seed(0)
    x, y = arrow_images(896, s=52)
    model = SignNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(SignDataset(x[:768], y[:768], train=True, hflip=not fixed), 32),
                val_loader=loader(SignDataset(x[768:], y[768:], train=False), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("hflip_left_right_classes", fixed_of(hflip_left_right_classes),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc")


# ------------------------------------------------------------------------------------------------------------------
# 23. Vibration windows z-normalised one by one: the wear level is the amplitude, which the per-window std removes.
# ------------------------------------------------------------------------------------------------------------------

def wear_windows(n: int, length: int = 128, s: int = 0):
    """(n, 1, length) vibration windows; wear class 0/1/2 scales the whole signal (harmonics and noise) by 1, 1.7, 2.6
    and lifts its DC offset."""
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    t = torch.arange(length).float()
    ph = torch.rand(n, 3, generator=g) * 2 * math.pi
    base = (torch.sin(2 * math.pi * 5 * t / length + ph[:, :1]) + 0.5 * torch.sin(2 * math.pi * 11 * t / length + ph[:, 1:2])
            + 0.3 * torch.sin(2 * math.pi * 23 * t / length + ph[:, 2:]) + 0.4 * torch.randn(n, length, generator=g))
    gain = torch.tensor([1.0, 1.7, 2.6])[y]
    return (gain[:, None] * (base + 0.5))[:, None, :], y


class VibrationDataset(Dataset):
    def __init__(self, x, y, mean: float | None = None, std: float | None = None):
        self.x, self.y, self.mean, self.std = x, y, mean, std

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        w = self.x[i]
        if self.mean is None:                                   # standardise each window
            w = (w - w.mean()) / (w.std() + 1e-8)
        else:
            w = (w - self.mean) / self.std
        return w, self.y[i]


@case("per_window_znorm", "data",
      bug="The vibration dataset z-normalises every window by its own mean and std ((w - w.mean()) / w.std()); the "
          "wear classes differ exactly in amplitude and offset, which this removes, so all classes look alike. The "
          "statistics should come from the training set as a whole.",
      cause_pattern=r"(per|each|every|individual)[- ](window|sample|instance|example|segment|clip)\w* .{0,60}(normali[sz]|standardi[sz]|z-?scor|z-?norm|mean|std)"
                    r"|(normali[sz]|standardi[sz]|z-?scor|z-?norm)\w* .{0,60}(per|each|every|individual)[- ]?(window|sample|instance|example|segment|clip)"
                    r"|(amplitude|scale|offset|magnitude|gain).{0,80}(removed|lost|erased|discarded|normali[sz]ed away)"
                    r"|instance[- ]norm\w*|(its|their) own (mean|std|statistics)")
def per_window_znorm(fixed: bool = False):
    seed(0)
    x, y = wear_windows(896, s=53)
    mean, std = (float(x[:768].mean()), float(x[:768].std())) if fixed else (None, None)
    model = nn.Sequential(nn.Conv1d(1, 16, 7, padding=3), nn.ReLU(), nn.Conv1d(16, 16, 7, padding=3), nn.ReLU(),
                          nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(VibrationDataset(x[:768], y[:768], mean, std), 32),
                val_loader=loader(VibrationDataset(x[768:], y[768:], mean, std), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("per_window_znorm", fixed_of(per_window_znorm), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc")


# ------------------------------------------------------------------------------------------------------------------
# 24. Training images decoded with OpenCV (BGR), validation images with PIL (RGB).
# ------------------------------------------------------------------------------------------------------------------

def fruit_photos(n: int, size: int = 12, s: int = 0):
    """uint8 RGB photos (n, size, size, 3): class 0 red, 1 green, 2 blue fruit on a grey background."""
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    img = 110 + 20 * torch.randn(n, size, size, 3, generator=g)
    colours = torch.tensor([[200.0, 40, 40], [50, 190, 60], [40, 60, 200]])
    for i in range(n):
        r = int(torch.randint(3, 6, (1,), generator=g))
        cy, cx = torch.randint(r, size - r, (2,), generator=g).tolist()
        yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        disc = ((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r
        img[i][disc] = colours[y[i]] + 15 * torch.randn(int(disc.sum()), 3, generator=g)
    return img.clamp(0, 255).to(torch.uint8).numpy(), y


def cv2_imread(store: np.ndarray, i: int) -> np.ndarray:
    """What cv2.imread returns for the stored RGB file: the channels in BGR order."""
    return store[i][:, :, ::-1]


def pil_open(store: np.ndarray, i: int) -> np.ndarray:
    return store[i]


class FruitDataset(Dataset):
    def __init__(self, store, y, reader, to_rgb: bool = False):
        self.store, self.y, self.reader, self.to_rgb = store, y, reader, to_rgb

    def __len__(self):
        return len(self.store)

    def __getitem__(self, i):
        img = self.reader(self.store, i)
        if self.to_rgb:
            img = img[:, :, ::-1]                               # cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        t = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float() / 255
        return (t - 0.45) / 0.25, self.y[i]


@case("bgr_train_rgb_val", "data",
      bug="The training Dataset reads photos with cv2.imread, which returns BGR, while the validation Dataset (and "
          "the deployment code) read them with PIL in RGB: the network learns 'red' from the third channel and at "
          "validation sees red in the first, so red and blue fruit are swapped.",
      cause_pattern=r"\bBGR\b|COLOR_BGR2RGB|cvtColor|cv2\.imread|(channel|colou?r) (order|orders|ordering)"
                    r"|(RGB|colou?r channels?) .{0,60}(swapped|reversed|flipped|mismatch)"
                    r"|(train\w*|validation|val)\b.{0,80}(preprocess\w*|decod\w*|load\w*|read\w*) .{0,60}(differ|mismatch|inconsistent)")
def bgr_train_rgb_val(fixed: bool = False):
    seed(0)
    store, y = fruit_photos(896, s=54)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten(),
                          nn.Linear(16, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(FruitDataset(store[:768], y[:768], cv2_imread, to_rgb=fixed), 32),
                val_loader=loader(FruitDataset(store[768:], y[768:], pil_open), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("bgr_train_rgb_val", fixed_of(bgr_train_rgb_val), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc")


# ------------------------------------------------------------------------------------------------------------------
# 25. Variable-length sensor sessions, right-padded by the collate function, classified from out[:, -1].
# ------------------------------------------------------------------------------------------------------------------

def machine_sessions(n: int, s: int = 0):
    """Sessions of 10-80 readings (2 channels) of idle noise; the last 6 readings are the shutdown signature that
    is the class (4): a step up or down on channel 0 or on channel 1."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    seqs = []
    for i in range(n):
        length = int(torch.randint(10, 81, (1,), generator=g))
        x = 0.3 * torch.randn(length, 2, generator=g)
        ch, sign = divmod(int(y[i]), 2)
        x[-6:, ch] += 1.5 if sign else -1.5
        seqs.append(x)
    return seqs, y


class SessionDataset(Dataset):
    def __init__(self, seqs, y):
        self.seqs, self.y = seqs, y

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i], self.y[i]


def pad_collate(batch):
    seqs, ys = zip(*batch)
    lengths = torch.tensor([len(s) for s in seqs])
    return pad_sequence(seqs, batch_first=True), lengths, torch.stack(ys)    # zeros appended after each session


class SessionLSTM(nn.Module):
    def __init__(self, last_real_step: bool = False):
        super().__init__()
        self.lstm = nn.LSTM(2, 32, batch_first=True)
        self.head = nn.Linear(32, 4)
        self.last_real_step = last_real_step

    def forward(self, x, lengths):
        out, _ = self.lstm(x)                                   # (N, T_max, 32)
        if self.last_real_step:
            idx = lengths.to(out.device) - 1
            last = out[torch.arange(out.size(0), device=out.device), idx]
        else:
            last = out[:, -1]                                   # "the last time step"
        return self.head(last)


def session_ce(model, batch):
    x, lengths, y = batch
    return nn.functional.cross_entropy(model(x, lengths), y)


@case("postpad_last_step", "data",
      bug="The collate function right-pads the variable-length sessions with pad_sequence(batch_first=True) and the "
          "LSTM classifies from out[:, -1]: for every session shorter than the longest in its batch that output comes "
          "after up to 70 steps of zero padding, not from the session's last real reading (out[i, lengths[i] - 1]).",
      cause_pattern=r"pack_padded_sequence|pad(ding|ded)? .{0,80}(last|final) (time ?step|output|state|step)"
                    r"|(last|final) (time ?step|output|state|step).{0,80}pad(ding|ded)?"
                    r"|lengths?\[?i?\]? ?- ?1|out\[:, ?-1\]|(gather|index) (at|by) (the )?(sequence )?lengths?"
                    r"|(right|post)[- ]pad\w*")
def postpad_last_step(fixed: bool = False):
    seed(0)
    seqs, y = machine_sessions(1024, s=55)
    model = SessionLSTM(last_real_step=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(SessionDataset(seqs[:896], y[:896]), 32, collate_fn=pad_collate),
                val_loader=loader(SessionDataset(seqs[896:], y[896:]), 128, shuffle=False, collate_fn=pad_collate),
                loss_fn=session_ce, max_steps=2000)


fix("postpad_last_step", fixed_of(postpad_last_step),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val acc")
