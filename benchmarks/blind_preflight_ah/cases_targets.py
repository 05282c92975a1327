"""Targets: what the loss is asked to fit is not what the user meant (label encodings, label ranges, ignored
classes, missing negatives, target scale)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.blind_preflight_ah.registry import acc_of, case, fix, fixed_of, gen, loader, mean_over, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------
# Cell segmentation: the mask goes through the same "to_tensor" as the image (uint8 / 255), then .long().


def cell_tiles(n: int, s: int, size: int = 16):
    """uint8 grey tiles with 1-3 bright blobs (class 1) and dim blobs (class 2) on background (class 0), and masks."""
    g = gen(s)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    masks = torch.zeros(n, size, size, dtype=torch.uint8)
    for cls in (1, 2):
        for _ in range(2):
            cy = torch.randint(2, size - 2, (n, 1, 1), generator=g)
            cx = torch.randint(2, size - 2, (n, 1, 1), generator=g)
            r = torch.randint(2, 4, (n, 1, 1), generator=g)
            blob = (yy - cy) ** 2 + (xx - cx) ** 2 <= r ** 2
            masks[blob & (masks == 0)] = cls
    level = torch.tensor([40.0, 200.0, 120.0])[masks.long()]
    images = (level + 25 * torch.randn(n, size, size, generator=g)).clamp(0, 255).to(torch.uint8)
    return images.numpy(), masks.numpy()


def to_tensor(array):
    """Like torchvision's ToTensor on a uint8 array: float in [0, 1] with a channel axis."""
    return torch.from_numpy(array).float().div(255).unsqueeze(0)


class CellDataset(Dataset):
    def __init__(self, images, masks, fixed=False):
        self.images, self.masks, self.fixed = images, masks, fixed

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = to_tensor(self.images[i])
        if self.fixed:
            mask = torch.from_numpy(self.masks[i]).long()         # class ids as they are
        else:
            mask = to_tensor(self.masks[i])[0].long()             # same transform as the image, then to class ids
        return image, mask


class CellNet(nn.Module):
    def __init__(self, width=12):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, 3, 1))

    def forward(self, x):
        return self.net(x)


def mask_to_tensor(fixed: bool = False):
    seed(0)
    images, masks = cell_tiles(400, 21)
    vimages, vmasks = cell_tiles(120, 22)
    model = CellNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=DataLoader(CellDataset(images, masks, fixed), batch_size=16, shuffle=True,
                                        generator=torch.Generator().manual_seed(1234)),
                val_loader=DataLoader(CellDataset(vimages, vmasks, fixed), batch_size=40),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


case("ah_mask_scaled_by_to_tensor", "targets",
     "The segmentation Dataset runs the uint8 class mask through the image's ToTensor-style transform, which divides "
     "by 255, and then .long() truncates the values 1/255 and 2/255 to 0, so every training mask is all background "
     "(class 0) and the model learns to predict background everywhere.",
     r"(to_?tensor|/ ?255|div(ide[sd]?)?\(? ?(by )?255).{0,80}(mask|label|target)|"
     r"masks?\b.{0,80}(to_?tensor|/ ?255|\b255\b|\[0, ?1\]|scaled|rescaled|fraction)|"
     r"(label|target)s?\b.{0,80}(to_?tensor|/ ?255|\b255\b)|"
     r"\.long\(\).{0,60}(truncat|round|floor|zero)|(truncat|round|floor)\w*.{0,60}(mask|class id)|"
     r"masks?\b.{0,60}(all|only|entirely) (background|class 0|zeros?)")(mask_to_tensor)

# --------------------------------------------------------------------------------------------------------------
# Load forecasting: the label column is built with shift(+1) (the previous hour) instead of shift(-1) (the next).


def load_curve(hours: int, s: int):
    """Hourly grid load: a daily cycle with a drifting amplitude, a slow weather swing and AR(1) noise."""
    g = gen(s)
    t = torch.arange(hours).float()
    amp = 1.0 + 0.3 * torch.sin(2 * torch.pi * t / (24 * 9))
    noise = torch.zeros(hours)
    eps = 0.15 * torch.randn(hours, generator=g)
    for k in range(1, hours):
        noise[k] = 0.7 * noise[k - 1] + eps[k]
    return amp * torch.sin(2 * torch.pi * t / 24) + 0.5 * torch.sin(2 * torch.pi * t / 97) + noise


def load_windows(series: torch.Tensor, window: int, label_shift: int):
    """Windows of the last `window` hours ending at hour t, labelled with the series at hour t - label_shift
    (pandas: df["target"] = df["load"].shift(label_shift))."""
    idx = torch.arange(window, len(series) - 1)
    x = torch.stack([series[i - window + 1:i + 1] for i in idx])
    y = series[idx - label_shift].unsqueeze(1)
    return x, y


def shifted_target(fixed: bool = False):
    seed(0)
    shift = -1 if fixed else 1                  # the bug: shift(1) labels each window with the hour before its end
    x, y = load_windows(load_curve(3000, 45), 24, shift)
    xv, yv = load_windows(load_curve(1000, 46), 24, -1)   # validation: the next hour, as meant
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=3000)


case("ah_forecast_target_shifted_backwards", "targets",
     "The forecasting labels are built with df['target'] = df['load'].shift(1), the hour before the window's last "
     "hour, instead of shift(-1), the next hour: every training target is a copy of an input column, so the network "
     "learns to repeat a past value and never forecasts.",
     r"shift\(\+?1\)|shift\(-1\)|(targets?|labels?)\b.{0,80}(cop(y|ies)|equal|identical|duplicate|same as|"
     r"leak)\w*.{0,40}"
     r"(inputs?|features?|columns?|lag)|(inputs?|features?|columns?).{0,60}(cop(y|ies)|equal|identical|same as).{0,40}"
     r"(targets?|labels?)|(previous|past|earlier|preceding) (value|hour|step|time ?step)|predict\w* the past|"
     r"(shifted|shift)\w* (in the )?wrong (way|direction)|future (value|step)")(shifted_target)

# --------------------------------------------------------------------------------------------------------------
# POS-style tagging: labels padded with 0 (pad_sequence's default) and CrossEntropyLoss(ignore_index=0), while
# tag 0 is a real tag (NOUN).

TAG_VOCAB = 40


def tag_sentences(n: int, s: int):
    """Token ids 1..39 (0 is padding); tag = token // 10 (0..3), but tag 0 for tokens right after an odd token."""
    g = gen(s)
    out = []
    for _ in range(n):
        length = int(torch.randint(5, 15, (1,), generator=g))
        toks = torch.randint(1, TAG_VOCAB, (length,), generator=g)
        tags = toks // 10
        after_odd = torch.zeros(length, dtype=torch.bool)
        after_odd[1:] = toks[:-1] % 2 == 1
        tags[after_odd] = 0
        out.append((toks, tags))
    return out


class Tagger(nn.Module):
    def __init__(self, dim=16, hidden=24, tags=4):
        super().__init__()
        self.embed = nn.Embedding(TAG_VOCAB, dim, padding_idx=0)
        self.rnn = nn.GRU(dim, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, tags)

    def forward(self, tokens):
        h, _ = self.rnn(self.embed(tokens))
        return self.out(h)


def tagging(fixed: bool = False):
    seed(0)
    train, val = tag_sentences(900, 27), tag_sentences(300, 28)
    label_pad = -100 if fixed else 0

    def collate(items):
        toks = pad_sequence([t for t, _ in items], batch_first=True, padding_value=0)
        tags = pad_sequence([y for _, y in items], batch_first=True, padding_value=label_pad)
        return toks, tags

    criterion = nn.CrossEntropyLoss(ignore_index=label_pad)

    def tag_loss(model, batch):
        toks, tags = batch
        return criterion(model(toks).reshape(-1, 4), tags.reshape(-1))

    model = Tagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=DataLoader(train, batch_size=32, shuffle=True, collate_fn=collate,
                                        generator=torch.Generator().manual_seed(1234)),
                val_loader=DataLoader(val, batch_size=100, collate_fn=collate), loss_fn=tag_loss, max_steps=2000)


case("ah_ignore_index_drops_real_tag", "targets",
     "The tagger pads its label sequences with 0 (pad_sequence's default) and builds "
     "CrossEntropyLoss(ignore_index=0), but tag 0 is a real tag (more than half of the tokens), so every real tag-0 "
     "token is ignored by the loss and the model never learns to predict it; labels should be padded with -100.",
     r"ignore_index ?= ?0|(class|label|tag|index) 0\b.{0,80}(ignored|never|excluded|masked|dropped|not (trained|"
     r"learn))|"
     r"(ignored|excluded|masked|dropped).{0,60}(class|label|tag) 0\b|"
     r"(real|valid|genuine|actual) (class|label|tag).{0,60}(ignored|pad|excluded)|"
     r"(pad(ding)?|ignore)\w*.{0,60}(collides|coincides|clashes|same as|equals).{0,40}(class|label|tag)|"
     r"never (predict|learn)\w*.{0,40}(class|label|tag) 0")(tagging)

# --------------------------------------------------------------------------------------------------------------
# Credit scoring from a LIBSVM-style file: labels in {-1, +1} straight into BCEWithLogitsLoss.


def credit(n: int, s: int, d: int = 20):
    g = gen(300)
    w = torch.randn(d, generator=g)
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    score = x @ w / d ** 0.5 + 0.8 * torch.tanh(x[:, 0] * x[:, 1]) + 0.3 * torch.randn(n, generator=g)
    y = torch.where(score > 0.4, 1.0, -1.0)          # +1 / -1, as in the svmlight file
    return x, y.unsqueeze(1)


def pm_one_labels(fixed: bool = False):
    seed(0)
    x, y = credit(2000, 31)
    xv, yv = credit(800, 32)
    if fixed:
        y, yv = (y + 1) / 2, (yv + 1) / 2
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 400, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=3000)


case("ah_bce_targets_minus_one_plus_one", "targets",
     "Labels read from an svmlight-style file are -1 / +1 and go straight into BCEWithLogitsLoss, whose targets must "
     "be in [0, 1]: for the -1 rows the loss softplus(x) + x falls without bound as their logits go to minus "
     "infinity, so the model pushes every logit down and the loss turns negative.",
     r"(targets?|labels?)\b.{0,80}(?<![\w(])(-1\b|-1\.0|negative values?|outside \[0, ?1\]|not in \[0, ?1\]|below 0)|"
     r"(?<![\w(])(-1|±1|\+/-1|\{-1, ?\+?1\})\b.{0,60}(targets?|labels?)|\[0, ?1\]|"
     r"negative loss|loss.{0,40}(negative|below zero|< ?0|unbounded)|\(y ?\+ ?1\) ?/ ?2|bce\w*.{0,80}(-1|"
     r"negative targets?)")(pm_one_labels)

# --------------------------------------------------------------------------------------------------------------
# Store demand forecasting: the targets were standardised (z-scores), the network still ends in nn.ReLU()
# "because sales cannot be negative".


def demand(n: int, s: int, lags: int = 14):
    """Daily sales of many stores: 14 standardised lags + day-of-week one-hot -> tomorrow's standardised sales."""
    g = gen(s)
    t0 = torch.randint(0, 365, (n, 1), generator=g)
    level = torch.randn(n, 1, generator=g) * 0.8
    t = t0 + torch.arange(lags + 1)
    series = level + 0.9 * torch.sin(2 * torch.pi * t / 7) + 0.5 * torch.sin(2 * torch.pi * t / 30) \
        + 0.25 * torch.randn(n, lags + 1, generator=g)
    dow = F.one_hot((t0[:, 0] + lags) % 7, 7).float()
    x = torch.cat([series[:, :lags], dow], 1)
    y = series[:, lags:]
    mean, std = -0.05, 1.1                      # the train-set statistics the user standardised with
    return (x - mean) / std * torch.cat([torch.ones(lags), torch.full((7,), std)]), (y - mean) / std


def relu_output(fixed: bool = False):
    seed(0)
    x, y = demand(2000, 43)
    xv, yv = demand(600, 44)
    layers = [nn.Linear(21, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)]
    if not fixed:
        layers.append(nn.ReLU())                 # "sales are never negative"
    model = nn.Sequential(*layers)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 600, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=3000)


case("ah_relu_output_on_standardised_target", "targets",
     "The demand regressor ends in nn.ReLU() 'because sales cannot be negative', but its targets are standardised "
     "z-scores, half of them below zero: every prediction is clipped at 0, the below-average days cannot be fitted "
     "and their zero-gradient outputs stop learning.",
     r"relu.{0,80}(output|final|last)|(ends?|ending) (in|with) (an? )?(nn\.)?relu|"
     r"(every|all|each) (predictions?|outputs?).{0,30}(clipped|clamped|zero)|(output|final|last) (layer|"
     r"activation).{0,80}(relu|non-?negative|clip|clamp)|"
     r"(predictions?|outputs?).{0,60}(never|cannot|can't|unable to).{0,30}(negative|below (0|zero))|"
     r"(non-?negative|>= ?0|clipped at (0|zero)).{0,80}(targets?|labels?).{0,60}negative|"
     r"(targets?|labels?).{0,60}negative.{0,80}(outputs?|predictions?).{0,40}(non-?negative|>= ?0|relu)")(relu_output)


# --------------------------------------------------------------------------------------------------------------
# The one-line fixes verify.py trains next to each case, and the metric both are scored on.


def _cell_miou(model, kw):
    """Mean IoU of the two cell classes on the true val masks (the broken val_loader's masks are zeroed too)."""
    images, masks = cell_tiles(120, 22)
    x = torch.from_numpy(images).float().div(255).unsqueeze(1)
    truth = torch.from_numpy(masks).long()
    was = model.training
    model.eval()
    with torch.no_grad():
        pred = model(x.to(next(model.parameters()).device)).argmax(1).cpu()
    model.train(was)
    ious = [((pred == c) & (truth == c)).sum().item() / max(((pred == c) | (truth == c)).sum().item(), 1)
            for c in (1, 2)]
    return sum(ious) / 2


def _tag_accuracy(model, kw):
    def fn(m, b):
        toks, tags = b
        real = toks != 0
        return (m(toks).argmax(-1)[real] == tags[real]).sum().item(), real.sum().item()
    return mean_over(model, kw["val_loader"], fn)


fix("ah_mask_scaled_by_to_tensor", fixed_of(mask_to_tensor), _cell_miou,
    "val mean IoU of the cell classes (true masks)")
fix("ah_forecast_target_shifted_backwards", fixed_of(shifted_target), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE of the next-hour forecast", higher=False)
fix("ah_ignore_index_drops_real_tag", fixed_of(tagging), _tag_accuracy, "val token accuracy", steps=200)
fix("ah_bce_targets_minus_one_plus_one", fixed_of(pm_one_labels),
    acc_of(lambda m, b: ((m(b[0]) > 0).long().view(-1), (b[1] > 0.5).long().view(-1))), "val accuracy")
fix("ah_relu_output_on_standardised_target", fixed_of(relu_output), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE (z-scores)", higher=False)
