"""Set ak, family data: preprocessing, Dataset and augmentation code that corrupts what the model sees."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_ak.cases_shapes import TinyFCN
from benchmarks.blind_preflight_ak.registry import acc_of, case, fix, fixed_of, gen, loader, mean_over, rmse_of, seed

# --- 1. standardisation along the wrong numpy axis --------------------------------------------------------------------


def loan_table(n, s=0):
    """Income, loan amount, age, tenure, ... in their own units; default if a risk score is high."""
    g = gen(s)
    scales = torch.tensor([50000.0, 20000.0, 40.0, 10.0, 5.0, 1.0, 300.0, 2.0])
    z = torch.randn(n, 8, generator=g)
    raw = z * scales + scales * 2
    risk = z @ torch.tensor([-1.0, 1.2, -0.5, -0.8, 0.9, 0.7, -0.6, 0.4])
    return raw, (risk > 0).long()


@case("ak_standardise_wrong_axis", "data",
      "The tabular features are standardised with (X - X.mean(axis=1, keepdims=True)) / X.std(axis=1, keepdims=True), "
      "over each row instead of each column (axis=0); every row is dominated by the income column, so the other "
      "seven features are squashed to nearly the same value and the risk signal is gone.",
      r"(axis ?= ?[01]|dim ?= ?[01]|per.?row|over (each |the )?rows?|row.?wise|each (row|sample) instead|"
      r"(column|feature).?wise|per.?(column|feature)|StandardScaler|wrong (axis|dim)|"
      r"(scale|statistic|mean|std)\w* .*(per row|across features|over features))")
def std_axis(fixed=False):
    seed(0)
    raw, y = loan_table(2000, s=22)
    ax = 0 if fixed else 1
    if fixed:                                     # statistics of the training rows, per column
        mu, sd = raw[:1600].mean(0, keepdim=True), raw[:1600].std(0, keepdim=True)
    else:
        mu, sd = raw.mean(ax, keepdim=True), raw.std(ax, keepdim=True)
    x = (raw - mu) / sd
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("ak_standardise_wrong_axis", fixed_of(std_axis), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")

# --- 2. last time step of right-padded sequences ---------------------------------------------------------------------


class ReviewGRU(nn.Module):
    def __init__(self, vocab=40, dim=32, fixed=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, 2)
        self.fixed = fixed

    def forward(self, batch):
        tokens, lengths = batch
        out, _ = self.gru(self.emb(tokens))
        if self.fixed:
            last = out[torch.arange(out.size(0), device=out.device), lengths - 1]
        else:
            last = out[:, -1]                     # the last column: padding for most reviews
        return self.head(last)


def reviews(n, T=60, s=0):
    """Sentiment of short reviews (4..12 tokens) right-padded with 0 to 60: positive words 1..5, negative 6..10."""
    g = gen(s)
    lengths = torch.randint(4, 13, (n,), generator=g)
    tokens = torch.randint(11, 40, (n, T), generator=g)
    label = torch.randint(0, 2, (n,), generator=g)
    sentiment = torch.where(label[:, None] == 1, torch.randint(1, 6, (n, 2), generator=g),
                            torch.randint(6, 11, (n, 2), generator=g))
    tokens[:, :2] = sentiment                     # the opinion words come first
    tokens[torch.arange(T)[None, :] >= lengths[:, None]] = 0
    return tokens, lengths, label


def _review_collate(batch):
    return (torch.stack([b[0] for b in batch]), torch.stack([b[1] for b in batch])), torch.stack([b[2] for b in batch])


@case("ak_last_step_of_padded_batch", "data",
      "The review classifier takes the GRU output at out[:, -1], the last column of a batch right-padded to 60 "
      "tokens; for a 4-12 token review that is 48+ steps of padding after the words, so the state read is mostly the "
      "padding's and the opinion at the start is washed out (the lengths are in the batch but unused).",
      r"(out\[:, ?-1\]|last (time.?step|step|column|position|output)|padd\w* .*(last|end|position)|"
      r"pack_padded_sequence|lengths? ?- ?1|(true|real|actual) (length|last)|gather .*length|"
      r"right.?padd\w*|padding (tokens? )?(after|at the end))")
def last_padded(fixed=False):
    seed(0)
    tokens, lengths, y = reviews(1500, s=23)
    model = ReviewGRU(fixed=fixed)
    ds_tr = TensorDataset(tokens[:1200], lengths[:1200], y[:1200])
    ds_va = TensorDataset(tokens[1200:], lengths[1200:], y[1200:])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ds_tr, 32, collate_fn=_review_collate),
                val_loader=loader(ds_va, 300, shuffle=False, collate_fn=_review_collate),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("ak_last_step_of_padded_batch", fixed_of(last_padded), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")

# --- 3. random flip applied to the image but not the mask ------------------------------------------------------------


def road_scenes(n, size=16, s=0):
    """A bright lane region on the left or right side of each image, its width varying: mask = lane pixels."""
    g = gen(s)
    cols = torch.arange(size)[None, None, :].expand(n, size, size)
    edge = torch.randint(3, 9, (n, 1, 1), generator=g)
    mask = (cols < edge).long()
    right = torch.rand(n, generator=g) < 0.5
    mask[right] = mask[right].flip(-1)
    img = mask.float()[:, None] * 1.0 + 0.5 * torch.randn(n, 1, size, size, generator=g)
    return img, mask


class FlipSegDataset(Dataset):
    def __init__(self, img, mask, train, fixed):
        self.img, self.mask, self.train, self.fixed = img, mask, train, fixed

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        img, mask = self.img[i], self.mask[i]
        if self.train and torch.rand(()) < 0.5:
            img = img.flip(-1)
            if self.fixed:
                mask = mask.flip(-1)
        return img, mask


@case("ak_flip_image_not_mask", "data",
      "The segmentation Dataset's __getitem__ applies the random horizontal flip to the image only, as "
      "torchvision.transforms.RandomHorizontalFlip would when called on the image alone; half the training pairs "
      "show the lane on one side while the mask still marks the other.",
      r"(flip\w*|same (random )?(transform|augment)|(image|input) (but|and) not (the )?(mask|label|target)|"
      r"(mask|label|target) (is )?not (flipped|transformed|augmented)|joint\w* (transform|augment)|"
      r"misalign\w*|v2\.|albumentations|(augment|transform)\w* .*(only|both) .*(image|mask))")
def flip_only(fixed=False):
    seed(0)
    img, mask = road_scenes(1000, s=24)
    model = TinyFCN(classes=2)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(FlipSegDataset(img[:800], mask[:800], True, fixed), 32),
                val_loader=loader(FlipSegDataset(img[800:], mask[800:], False, fixed), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


def pixel_nll(model, kw):
    def fn(m, b):
        return F.cross_entropy(m(b[0]), b[1], reduction="sum").item(), b[1].numel()
    return mean_over(model, kw["val_loader"], fn)


fix("ak_flip_image_not_mask", fixed_of(flip_only), pixel_nll, "val pixel NLL", higher=False)

# --- 4. centring uint8 images wraps around ---------------------------------------------------------------------------


def exposure_pairs(n, size=12, s=0):
    """Grayscale uint8 images whose left half is a little brighter or darker than the right: label = left brighter."""
    g = gen(s)
    base = torch.randint(40, 216, (n, 1, 1, 1), generator=g).float()
    y = torch.randint(0, 2, (n,), generator=g)
    delta = torch.where(y == 1, 1.0, -1.0)[:, None, None, None] * 18
    img = base + 2 * torch.randn(n, 1, size, size, generator=g)
    img[..., : size // 2] += delta
    return img.clamp(0, 255).to(torch.uint8), y


@case("ak_uint8_centring_wraps", "data",
      "The uint8 images are centred with (img - 128) while still uint8 and only then cast with .float() / 128; "
      "unsigned subtraction wraps around, so a pixel of 120 becomes 248 and 130 becomes 2: every image whose "
      "brightness straddles 128 gets its bright and dark halves swapped.",
      r"(uint8 .*(subtract|wrap|centr|minus|- ?128|arithmetic)|(subtract|centr)\w* .*uint8|unsigned|wrap\w*|\.float\(\) before|cast\w* (to float )?(before|first)|integer (arithmetic|subtraction)|"
      r"(subtract|centr|normali[sz])\w* .*(uint8|integer|before (the )?(cast|float))|modulo 256|% ?256|"
      r"to\(torch\.float)")
def uint8_wrap(fixed=False):
    seed(0)
    img, y = exposure_pairs(2000, s=25)
    x = (img.float() - 128) / 128 if fixed else (img - 128).float() / 128
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d((1, 2)), nn.Flatten(),
                          nn.Linear(16, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("ak_uint8_centring_wraps", fixed_of(uint8_wrap), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")

# --- 5. in-place normalisation in __getitem__ ------------------------------------------------------------------------


class MeterDataset(Dataset):
    """Smart-meter windows in kWh; normalised on the fly."""

    def __init__(self, x, y, mean, std, fixed):
        self.x, self.y, self.mean, self.std, self.fixed = x, y, mean, std, fixed

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        row = self.x[i]                           # a view into the stored tensor
        if self.fixed:
            row = (row - self.mean) / self.std
        else:
            row -= self.mean                      # in place: rewrites the dataset itself, every epoch again
            row /= self.std
        return row, self.y[i]


def meter_windows(n, s=0):
    g = gen(s)
    base = 40 + 8 * torch.randn(n, 1, generator=g)
    trend = torch.randn(n, 1, generator=g)
    x = base + trend * torch.linspace(-3, 3, 16) + 1.5 * torch.randn(n, 16, generator=g)
    return x, (base.squeeze(1) - 40) / 8 + trend.squeeze(1)


@case("ak_getitem_normalises_in_place", "data",
      "The Dataset's __getitem__ normalises with row -= mean; row /= std on self.x[i], a view of the stored tensor, "
      "so the stored data is normalised again on every epoch: after a few passes every window has collapsed to "
      "almost the same constant and the model trains on inputs that no longer carry the signal.",
      r"(in.?place|-=|/=|sub_|div_|view of the (stored|dataset|underlying)|\.clone\(\)|(modif|mutat|overwrit|rewrit)"
      r"\w* .*(dataset|stored|underlying|source)|normali[sz]\w* (again|twice|repeatedly|every epoch)|"
      r"(each|every) epoch .*(again|normali))")
def inplace_norm(fixed=False):
    seed(0)
    x, y = meter_windows(2000, s=26)
    mean, std = x[:1600].mean(0), x[:1600].std(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(MeterDataset(x[:1600].clone(), y[:1600], mean, std, fixed), 32),
                val_loader=loader(MeterDataset(x[1600:].clone(), y[1600:], mean, std, fixed), 400, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1000)


fix("ak_getitem_normalises_in_place", fixed_of(inplace_norm), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE",
    higher=False)
