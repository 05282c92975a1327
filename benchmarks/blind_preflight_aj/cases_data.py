"""Set aj, family ``data``: the Dataset, its transform or the collate_fn hands the model something other than what
the user thinks."""

from __future__ import annotations

import torch
import transformers  # noqa: E402
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_aj.cases_shapes import KeywordCNN, spectrograms
from benchmarks.blind_preflight_aj.cases_targets import FingerprintNet, contrastive_loss, verification_auc
from benchmarks.blind_preflight_aj.cases_trained import hf_acc, tiny_bert_config
from benchmarks.blind_preflight_aj.registry import acc_of, case, fix, fixed_of, gen, loader, mean_over, seed

# --------------------------------------------------------------------------------------------------------------------
# 1. eye-landmark regression with a horizontal-flip augmentation that mirrors x but keeps left/right labels

def eye_images(n: int, s: int, size: int = 16):
    """Two identical eye blobs per face; the subject's LEFT eye is on the image's right (larger x). Targets are
    (x_left, y_left, x_right, y_right) in [0, 1]."""
    g = gen(s)
    cx = torch.randint(5, 11, (n,), generator=g)
    cy = torch.randint(3, 13, (n,), generator=g)
    half = torch.randint(2, 5, (n,), generator=g)
    xl, xr = cx + half, cx - half
    xl, xr = xl.clamp(max=size - 1), xr.clamp(min=0)
    img = torch.rand(n, 1, size, size, generator=g) * 0.3
    img[torch.arange(n), 0, cy, xl] += 1.0
    img[torch.arange(n), 0, cy, xr] += 1.0
    pts = torch.stack([xl, cy, xr, cy], 1).float()
    return img, (pts + 0.5) / size


class EyeDataset(Dataset):
    def __init__(self, img, pts, augment: bool, swap_sides: bool):
        self.img, self.pts, self.augment, self.swap_sides = img, pts, augment, swap_sides

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        img, pts = self.img[i], self.pts[i].clone()
        if self.augment and torch.rand(()) < 0.5:
            img = img.flip(-1)
            pts[0::2] = 1 - pts[0::2]                       # mirror the x coordinates
            if self.swap_sides:
                pts = pts[[2, 3, 0, 1]]                     # the subject's left eye is now the right one
        return img, pts


@case("aj_landmark_hflip_without_side_swap", "data",
      bug="The eye-landmark Dataset flips half the faces horizontally and mirrors the x coordinates, but keeps the "
          "(left_eye, right_eye) order: after a flip the subject's left eye is the other blob, so half the targets "
          "name the wrong eye and the regressor learns the midpoint of both eyes.",
      cause_pattern=r"(flip|mirror)\w*\W.{0,100}(left|right|swap|symmetr|order|pairs?)|"
                    r"(left|right)[ /-]?(and |\/|-)?(right|left)\W.{0,60}(swap|flip|mirror|exchang)|"
                    r"(swap|exchang)\w*\W.{0,40}(left|right|symmetric)|(symmetric|lateral) (keypoints?|landmarks?)")
def landmark_flip(fixed: bool = False):
    seed(0)
    img, pts = eye_images(1500, 1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(EyeDataset(img[:1200], pts[:1200], augment=True, swap_sides=fixed), 32),
                val_loader=loader(EyeDataset(img[1200:], pts[1200:], augment=False, swap_sides=fixed), 100,
                                  shuffle=False),
                loss_fn=nn.SmoothL1Loss(beta=0.02), max_steps=600)


def landmark_px_error(model, kw) -> float:
    def fn(m, b):
        img, pts = b
        pred = m(img.to(next(m.parameters()).device)).float().cpu()
        return ((pred - pts).view(-1, 2, 2).norm(dim=-1) * 16).sum().item(), 2 * len(img)
    return mean_over(model, kw["val_loader"], fn)


fix("aj_landmark_hflip_without_side_swap", fixed_of(landmark_flip), landmark_px_error, "val eye error (px)",
    steps=300, higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 2. vibration band energies standardised per row (axis=1) instead of per feature column

def band_energies(n: int, s: int, d: int = 16):
    """Per-recording band energies: a loudness level times a random spectral shape; faults are the loud machines."""
    g = gen(s)
    level = torch.exp(torch.randn(n, 1, generator=g) * 0.5)
    shape = 1 + 0.3 * torch.rand(n, d, generator=g)
    x = level * shape + 0.05 * torch.randn(n, d, generator=g)
    y = (level.squeeze(1) > 1.0).long()
    return x.numpy(), y


@case("aj_vibration_standardized_per_row", "data",
      bug="The band-energy matrix X (recordings x 16 bands) is standardised with X.mean(axis=1) and X.std(axis=1), "
          "a snippet written for bands-by-recordings data: each recording is normalised by its own mean and spread, "
          "which removes its loudness, the one thing that tells a faulty machine (per-feature statistics, axis=0, "
          "were meant).",
      cause_pattern=r"axis\s*=?\s*[01]|per[- ](row|sample|recording|example)\W.{0,60}(normali[sz]|standardi[sz]|"
                    r"statistic|mean)|(normali[sz]|standardi[sz])\w*\W.{0,60}(each|per|every) (row|sample|recording|"
                    r"example)|(wrong|transposed) (axis|dimension|orientation)|StandardScaler|"
                    r"(per|each)[- ](feature|column)\W.{0,40}(mean|statistic|standardi[sz]|normali[sz])")
def vibration_per_row(fixed: bool = False):
    seed(0)
    x, y = band_energies(1500, 2)
    axis = 0 if fixed else 1
    x = (x - x.mean(axis=axis, keepdims=True)) / x.std(axis=axis, keepdims=True)
    x = torch.tensor(x, dtype=torch.float32)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("aj_vibration_standardized_per_row", fixed_of(vibration_per_row), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 3. feature files enumerated in directory-listing order, labels read from a CSV sorted by file name

class RecordingFolder:
    """Stands in for a folder of per-recording .npy feature files: ``listdir()`` returns the names in the
    file system's own order (hash order, not alphabetical), as os.listdir does."""

    def __init__(self, features: torch.Tensor, s: int):
        self.names = [f"rec_{i:04d}.npy" for i in range(len(features))]
        self.files = dict(zip(self.names, features))
        self.order = torch.randperm(len(features), generator=gen(s)).tolist()

    def listdir(self):
        return [self.names[i] for i in self.order]

    def load(self, name):
        return self.files[name]


class KeywordFolderDataset(Dataset):
    def __init__(self, folder: RecordingFolder, label_csv: dict, sort_names: bool):
        names = folder.listdir()
        self.names = sorted(names) if sort_names else names
        self.folder = folder
        self.labels = [label_csv[n] for n in sorted(label_csv)]     # the CSV is sorted by file name

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        return self.folder.load(self.names[i]), self.labels[i]


@case("aj_listdir_order_vs_sorted_labels", "data",
      bug="The keyword Dataset enumerates the feature files with os.listdir(), which returns them in file-system "
          "order, while the labels come from a CSV sorted by file name: features[i] and labels[i] belong to different "
          "recordings, so the training labels are a permutation unrelated to the inputs (sorted(os.listdir()) was "
          "needed).",
      cause_pattern=r"listdir|\bglob\b|sorted\(|(file|directory|folder)[- ](system |listing )?order|"
                    r"(features?|inputs?)\[i\] and (labels?|targets?)\[i\]|belong to different (recordings|files|samples)|"
                    r"(file|directory) (names?|listing)\W.{0,60}(sort|order)")
def listdir_order(fixed: bool = False):
    seed(0)
    spec, y = spectrograms(1300, 3)
    folder = RecordingFolder(spec[:1000], s=13)
    label_csv = {name: int(y[i]) for i, name in enumerate(folder.names)}
    model = KeywordCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(KeywordFolderDataset(folder, label_csv, sort_names=fixed), 32),
                val_loader=loader(TensorDataset(spec[1000:], y[1000:]), 100, shuffle=False),
                loss_fn=nn.NLLLoss(), max_steps=600)


fix("aj_listdir_order_vs_sorted_labels", fixed_of(listdir_order), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=200)


# --------------------------------------------------------------------------------------------------------------------
# 4. tiny BERT sentiment: the collate_fn builds attention_mask with nn.Transformer's convention (True = padding)

POS_TOKENS, NEG_TOKENS = range(5, 10), range(10, 15)


def review_ids(n: int, s: int, max_len: int = 16):
    g = gen(s)
    ids = torch.zeros(n, max_len, dtype=torch.long)
    y = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        length = int(torch.randint(6, 13, (1,), generator=g))
        toks = torch.randint(15, 40, (length,), generator=g)
        k = int(torch.randint(2, 4, (1,), generator=g))
        pool = torch.tensor(list(POS_TOKENS if y[i] == 1 else NEG_TOKENS))
        where = torch.randperm(length, generator=g)[:k]
        toks[where] = pool[torch.randint(0, 5, (k,), generator=g)]
        ids[i, 0] = 1
        ids[i, 1:1 + length] = toks
    return ids, y


def review_collate(pad_is_true: bool):
    def collate(rows):
        ids = torch.stack([r[0] for r in rows])
        labels = torch.stack([r[1] for r in rows])
        mask = (ids == 0) if pad_is_true else (ids != 0)     # key_padding_mask habit: True marks padding
        return {"input_ids": ids, "attention_mask": mask.long(), "labels": labels}
    return collate


@case("aj_bert_attention_mask_inverted", "data",
      bug="The review collate_fn builds attention_mask = (input_ids == pad_id), the nn.Transformer key_padding_mask "
          "convention where True marks padding, but Hugging Face's attention_mask means 1 = attend: every token "
          "attends only to the padding and the [CLS] summary never sees the words of the review.",
      cause_pattern=r"attention_mask|key_padding_mask|(padding|pad) mask\W.{0,60}(invert|revers|flip|opposite)|"
                    r"(mask|1s? and 0s?)\W.{0,60}(invert|revers|flip|swap|opposite)|attends? (only )?to (the )?"
                    r"(padding|pad tokens?)|(1|True) (marks|means|for) (the )?(padding|pad)")
def bert_mask_inverted(fixed: bool = False):
    seed(0)
    ids, y = review_ids(1400, 4)
    model = transformers.BertForSequenceClassification(tiny_bert_config(num_labels=2))
    collate = review_collate(pad_is_true=not fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:1100], y[:1100]), 32, collate_fn=collate),
                val_loader=loader(TensorDataset(ids[1100:], y[1100:]), 100, shuffle=False, collate_fn=collate),
                max_steps=500)


fix("aj_bert_attention_mask_inverted", fixed_of(bert_mask_inverted), hf_acc, "val accuracy", steps=250)


# --------------------------------------------------------------------------------------------------------------------
# 5. siamese pair Dataset whose 'positive' partner is the anchor itself

class SpeakerPairs(Dataset):
    """Speaker embeddings; each item is (anchor, partner, dissimilar) with dissimilar = 0 for a same-speaker pair."""

    def __init__(self, x, speaker, anchor_as_positive: bool, s: int = 0):
        self.x, self.speaker, self.bug = x, speaker, anchor_as_positive
        self.by_speaker = {int(c): torch.nonzero(speaker == c).flatten() for c in speaker.unique()}
        self.g = torch.Generator().manual_seed(s)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, idx):
        c = int(self.speaker[idx])
        if torch.rand((), generator=self.g) < 0.5:          # positive pair
            same = self.by_speaker[c]
            j = int(same[torch.randint(len(same), (1,), generator=self.g)])
            partner = self.x[idx] if self.bug else self.x[j]
            return self.x[idx], partner, torch.tensor(0.0)
        j = int(torch.randint(len(self.x), (1,), generator=self.g))
        while int(self.speaker[j]) == c:
            j = int(torch.randint(len(self.x), (1,), generator=self.g))
        return self.x[idx], self.x[j], torch.tensor(1.0)


def speaker_vectors(n: int, s: int, n_speakers: int = 10, d: int = 16):
    """Speaker prototypes plus a strong recording-channel nuisance in 4 directions and noise."""
    g = gen(s)
    proto = torch.randn(n_speakers, d, generator=g) * 1.2
    spk = torch.randint(0, n_speakers, (n,), generator=g)
    channel = torch.randn(4, d, generator=gen(99))
    return proto[spk] + 2.5 * torch.randn(n, 4, generator=g) @ channel + 0.5 * torch.randn(n, d, generator=g), spk


@case("aj_siamese_positive_is_anchor", "data",
      bug="The speaker-pair Dataset draws a same-speaker index j for positive pairs but returns self.x[idx] as the "
          "partner: every positive pair is the anchor paired with itself, its distance is 0 whatever the weights, "
          "so nothing pulls different recordings of one speaker together.",
      cause_pattern=r"(anchor|sample|item|itself)\W.{0,60}(paired|compared|partner)\W.{0,30}(itself|with itself|same)|"
                    r"(positive|similar) (pairs?|partners?|examples?)\W.{0,80}(identical|itself|same (sample|index|"
                    r"item|recording)|distance (of )?(zero|0)|duplicates?)|self\.x\[idx\]|\bidx\b.{0,30}\bj\b|"
                    r"(identical|duplicate) (inputs?|pairs?)")
def siamese_positive_self(fixed: bool = False):
    seed(0)
    x, spk = speaker_vectors(1200, 5)
    model = FingerprintNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(SpeakerPairs(x, spk, anchor_as_positive=not fixed), 32),
                val_loader=loader(TensorDataset(*_speaker_val()), 100, shuffle=False),
                loss_fn=contrastive_loss(flip=False), max_steps=600)


def _speaker_val():
    """Validation pairs of fresh recordings of the same 10 speakers: (x1, x2, 1 if same speaker)."""
    g = gen(77)
    x, spk = speaker_vectors(1200, 5)
    proto_x, proto_spk = x, spk
    a = torch.randint(0, len(proto_x), (600,), generator=g)
    same = torch.randint(0, 2, (600,), generator=g)
    b = torch.empty(600, dtype=torch.long)
    for k in range(600):
        pool = torch.nonzero((proto_spk == proto_spk[a[k]]) == bool(same[k])).flatten()
        pool = pool[pool != a[k]]
        b[k] = pool[torch.randint(len(pool), (1,), generator=g)]
    return proto_x[a], proto_x[b], same.float()


fix("aj_siamese_positive_is_anchor", fixed_of(siamese_positive_self), verification_auc, "val verification AUC",
    steps=400)
