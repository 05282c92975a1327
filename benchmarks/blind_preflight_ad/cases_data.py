"""Data: the Dataset, collate_fn, preprocessing or split hands the model something other than intended."""

from __future__ import annotations

import collections

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, TensorDataset

from .registry import acc_of, case, first_arg, fix, fixed_of, gen, loader, mean_over, rmse_of, seed

# --- D1: a vocabulary built separately on each split ------------------------------------------------------------------

WORDS = [f"w{i}" for i in range(120)]


def _texts(n, s):
    g = gen(s)
    weight = torch.randn(len(WORDS), generator=gen(81))
    freq = torch.softmax(torch.randn(len(WORDS), generator=gen(82)), 0)
    ids = torch.multinomial(freq, n * 12, replacement=True, generator=g).view(n, 12)
    labels = (weight[ids].sum(1) > 0).long()
    return [[WORDS[i] for i in row] for row in ids.tolist()], labels


def build_vocab(texts):
    counts = collections.Counter(w for t in texts for w in t)
    return {w: i for i, (w, _) in enumerate(counts.most_common())}


def encode(texts, vocab):
    return torch.tensor([[vocab.get(w, 0) for w in t] for t in texts])


class BagClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(len(WORDS), 16, mode="mean")
        self.head = nn.Linear(16, 2)

    def forward(self, ids):
        return self.head(self.bag(ids))


@case("data_vocabulary_rebuilt_on_validation_split", "data",
      bug="build_vocab (words ranked by frequency) is called once on the training texts and again on the validation "
          "texts, so the same word gets a different id in each split: the model is validated on ids that mean other "
          "words; the validation texts must be encoded with the training vocabulary",
      cause_pattern=r"vocab\w*[^.]{0,80}(separately|each split|per split|again|rebuil\w*|refit\w*|re-?fit)|"
                    r"(same|training) (vocab\w*|token(izer)?|word index|encoder|mapping)[^.]{0,40}(for|on) (the )?(val\w*|test|both)|"
                    r"(ids|indices|token ids)[^.]{0,40}(differ|mean (other|different))|fit\w* on the (validation|test)")
def data_vocabulary_rebuilt_on_validation_split(fixed=False):
    seed(0)
    tr, y = _texts(2048, 1)
    va, yv = _texts(512, 2)
    vocab = build_vocab(tr)
    val_vocab = vocab if fixed else build_vocab(va)
    model = BagClassifier()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(encode(tr, vocab), y), 64),
                val_loader=loader(TensorDataset(encode(va, val_vocab), yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("data_vocabulary_rebuilt_on_validation_split", fixed_of(data_vocabulary_rebuilt_on_validation_split),
    acc_of(first_arg), "val accuracy")


# --- D2: uint8 pixels cast to float without scaling to [0, 1] ---------------------------------------------------------

def _digits(n, s):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    img = torch.randint(0, 60, (n, 1, 14, 14), generator=g)
    for i in range(n):
        k = int(y[i])
        if k == 0:
            img[i, 0, 3:11, 6:8] += 180         # vertical stroke
        elif k == 1:
            img[i, 0, 6:8, 3:11] += 180         # horizontal stroke
        elif k == 2:
            img[i, 0, 3:11, 3:11] += 60         # filled square
        else:
            img[i, 0, 2:12:3, 2:12:3] += 190    # dots
    return img.clamp(max=255).to(torch.uint8), y


class PixelDataset(Dataset):
    def __init__(self, images, labels, scale):
        self.images, self.labels, self.scale = images, labels, scale

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i].float() / self.scale, self.labels[i]


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x)


@case("data_uint8_pixels_not_scaled", "data",
      bug="the Dataset turns the uint8 images into floats with .float() but never divides by 255, so the inputs "
          "are 0-255 instead of 0-1: the first activations and gradients are ~100x larger than the SGD learning "
          "rate was set for, and the run diverges or dies",
      cause_pattern=r"(image|pixel|input)s?[^.]{0,60}/ ?255|divide\w* by 255|\b0 ?[-–] ?255\b|\[0, ?255\]|uint8|ToTensor|"
                    r"pixel[^.]{0,60}(not (scaled|divided|normali[sz]ed)|raw (byte|integer))")
def data_uint8_pixels_not_scaled(fixed=False):
    seed(0)
    x, y = _digits(1536, 3)
    xv, yv = _digits(384, 4)
    scale = 255.0 if fixed else 1.0
    model = SmallCNN()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(PixelDataset(x, y, scale), 32),
                val_loader=loader(PixelDataset(xv, yv, scale), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("data_uint8_pixels_not_scaled", fixed_of(data_uint8_pixels_not_scaled), acc_of(first_arg), "val accuracy")


# --- D3: the "last" time step of a right-padded batch ---------------------------------------------------------------

PAD = 0


def _sessions(n, s):
    """Click sessions of 3..60 page ids (1..20); the label is the category (id % 3) of the last page visited."""
    g = gen(s)
    lengths = torch.randint(3, 61, (n,), generator=g)
    seqs = [torch.randint(1, 21, (int(L),), generator=g) for L in lengths]
    labels = torch.tensor([int(q[-1]) % 3 for q in seqs])
    return seqs, labels


class SessionSet(Dataset):
    def __init__(self, seqs, labels):
        self.seqs, self.labels = seqs, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.seqs[i], self.labels[i]


def collate_sessions(batch):
    seqs, labels = zip(*batch)
    lengths = torch.tensor([len(q) for q in seqs])
    return pad_sequence(seqs, batch_first=True, padding_value=PAD), lengths, torch.stack(labels)


class SessionRNN(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(21, 16, padding_idx=PAD)
        self.rnn = nn.RNN(16, 32, batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, ids, lengths):
        out, _ = self.rnn(self.emb(ids))
        if self.fixed:
            idx = (lengths.to(out.device) - 1).view(-1, 1, 1).expand(-1, 1, out.shape[-1])
            last = out.gather(1, idx).squeeze(1)
        else:
            last = out[:, -1]
        return self.head(last)


def _session_loss(model, batch):
    ids, lengths, y = batch
    return nn.functional.cross_entropy(model(ids, lengths), y)


def _session_pred(m, b):
    return m(b[0], b[1]).argmax(-1), b[2]


@case("data_last_step_of_right_padded_batch", "data",
      bug="the collate_fn right-pads the sessions with pad_sequence(batch_first=True) and the model reads "
          "out[:, -1] as each session's final state: for every session shorter than the longest in its batch that "
          "position is after a run of padding steps, not its last real step; it needs the output at lengths - 1 "
          "(or pack_padded_sequence)",
      cause_pattern=r"pack_padded_sequence|lengths? ?- ?1|(pad|padding)[^.]{0,60}(last|final) (time )?step|"
                    r"(last|final) (time )?step[^.]{0,60}(pad|padding)|(reads?|takes?|picks?) (the )?padding|"
                    r"(last|final) (real|valid|non-pad\w*) (token|step|position)")
def data_last_step_of_right_padded_batch(fixed=False):
    seed(0)
    seqs, y = _sessions(2048, 5)
    vseqs, yv = _sessions(512, 6)
    model = SessionRNN(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(SessionSet(seqs, y), 32, collate_fn=collate_sessions),
                val_loader=loader(SessionSet(vseqs, yv), 128, shuffle=False, collate_fn=collate_sessions),
                loss_fn=_session_loss, max_steps=300)


fix("data_last_step_of_right_padded_batch", fixed_of(data_last_step_of_right_padded_batch), acc_of(_session_pred),
    "val accuracy")


# --- D4: a label-sorted table split by slicing ----------------------------------------------------------------------

def _species(n, s):
    g = gen(s)
    y = torch.randint(0, 5, (n,), generator=g)
    centers = torch.randn(5, 6, generator=gen(91)) * 1.6
    return centers[y] + torch.randn(n, 6, generator=g), y


@case("data_sorted_table_split_by_slicing", "data",
      bug="the table comes sorted by species and is split with x[:n_train] / x[n_train:] without shuffling first: "
          "the first 75% hold classes 0-3 only (all of class 4 and part of class 3 fall in the validation slice), so the model "
          "never sees one of the classes it must predict",
      cause_pattern=r"sorted by (label|class|target|species)|(split|slic\w*)[^.]{0,60}without shuffl\w*|"
                    r"shuffle (before|the rows before) (splitting|the split)|stratif\w*|"
                    r"class(es)? [^.]{0,40}(absent|missing|never (seen|appear\w*)) (from|in) (the )?train\w*|"
                    r"(unseen|missing) class(es)?")
def data_sorted_table_split_by_slicing(fixed=False):
    seed(0)
    x, y = _species(2500, 7)
    order = torch.argsort(y, stable=True)            # the file is sorted by species
    x, y = x[order], y[order]
    if fixed:
        perm = torch.randperm(len(y), generator=gen(0))
        x, y = x[perm], y[perm]
    n_train = int(0.75 * len(y))
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:n_train], y[:n_train]), 64),
                val_loader=loader(TensorDataset(x[n_train:], y[n_train:]), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


def _species_test_acc(model, kw):
    xt, yt = _species(1000, 8)
    fn = lambda m, b: ((m(b[0]).argmax(-1) == b[1]).sum().item(), b[1].numel())  # noqa: E731
    return mean_over(model, [(xt.to(next(model.parameters()).device), yt)], fn)


fix("data_sorted_table_split_by_slicing", fixed_of(data_sorted_table_split_by_slicing), _species_test_acc,
    "accuracy on a fresh balanced test set")


# --- D5: a horizontal flip applied to the image but not to the keypoint ---------------------------------------------

def _blobs(n, s):
    g = gen(s)
    pos = torch.randint(1, 15, (n, 2), generator=g)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    img = torch.exp(-((yy - pos[:, 0, None, None]) ** 2 + (xx - pos[:, 1, None, None]) ** 2) / 3.0)
    img = img[:, None] + 0.1 * torch.randn(n, 1, 16, 16, generator=g)
    return img, pos.float() / 15.0                      # (row, col) in [0, 1]


class KeypointSet(Dataset):
    def __init__(self, images, points, augment, flip_target):
        self.images, self.points, self.augment, self.flip_target = images, points, augment, flip_target
        self.g = gen(123)

    def __len__(self):
        return len(self.points)

    def __getitem__(self, i):
        img, pt = self.images[i], self.points[i].clone()
        if self.augment and torch.rand(1, generator=self.g) < 0.5:
            img = img.flip(-1)                             # RandomHorizontalFlip
            if self.flip_target:
                pt[1] = 1.0 - pt[1]
        return img, pt


class KeypointNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                 nn.Linear(16 * 16, 2))

    def forward(self, x):
        return self.net(x)


@case("data_flip_augmentation_not_applied_to_keypoint", "data",
      bug="the Dataset's random horizontal flip mirrors the image but leaves the (row, col) keypoint target "
          "unchanged: half of the training pairs point at the mirrored column, so the best the model can do is "
          "predict the middle column; the flip must also map col -> 1 - col",
      cause_pattern=r"(flip|augment\w*|transform\w*)[^.]{0,80}(not|never) (applied|mirrored|flipped|transformed|updated)[^.]{0,30}(target|label|keypoint|mask|coordinate)|"
                    r"(flip|augment\w*|transform\w*)[^.]{0,60}(image|input)[^.]{0,30}(but )?not (to )?(the )?(keypoint|target|label|mask|coordinate)|"
                    r"(target|label|keypoint|coordinate)s?[^.]{0,40}(not|never) (flipped|mirrored|transformed|updated)|"
                    r"1 ?- ?col|same (random )?transform\w* to (the )?(target|label|keypoint|mask)")
def data_flip_augmentation_not_applied_to_keypoint(fixed=False):
    seed(0)
    x, p = _blobs(2048, 9)
    xv, pv = _blobs(512, 10)
    model = KeypointNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(KeypointSet(x, p, augment=True, flip_target=fixed), 32),
                val_loader=loader(KeypointSet(xv, pv, augment=False, flip_target=True), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("data_flip_augmentation_not_applied_to_keypoint", fixed_of(data_flip_augmentation_not_applied_to_keypoint),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val keypoint RMSE", higher=False)
