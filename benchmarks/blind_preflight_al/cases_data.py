"""Set al, family data: the Dataset, collate or preprocessing hands the model something other than what it seems."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight_al.cases_targets import blob_scenes, fcn, seg_iou
from benchmarks.blind_preflight_al.registry import acc_of, adam, case, ds, fix, fixed_of, gen, loader, seed


def _argmax_fwd(m, b):
    return m(b[0]).argmax(-1), b[-1]


# 21 ----------------------------------------------------------------- image and mask flipped by separate draws
class FlipSegDataset(Dataset):
    def __init__(self, img, mask, joint):
        self.img, self.mask, self.joint = img, mask, joint

    def __len__(self):
        return len(self.img)

    @staticmethod
    def random_flip(t, draw):
        if draw[0] < 0.5:
            t = t.flip(-1)
        if draw[1] < 0.5:
            t = t.flip(-2)
        return t

    def __getitem__(self, i):
        draw = torch.rand(2)
        img = self.random_flip(self.img[i], draw)
        mask = self.random_flip(self.mask[i], draw if self.joint else torch.rand(2))   # a second, independent draw
        return img, mask


def off_centre_blobs(n, s):
    img, mask = blob_scenes(n, s)
    return img, mask.float() / 255


@case("al_image_mask_separate_random", "data",
      "The segmentation Dataset applies its random horizontal/vertical flips to the image and to the mask with two "
      "independent random draws, so in about 3 of 4 samples the mask no longer lines up with the image.",
      r"(same|identical|shared|single|one) (random )?(transform|flip|augment|draw|parameters|seed).{0,60}(image|mask)"
      r"|(image|mask).{0,80}(independent|separate|different) (random|draw|transform|flip)|(mask|label|target)s?.{0,60}"
      r"(misalign|no longer (line|match)|out of (sync|alignment)|not aligned)")
def al_image_mask_separate_random(fixed=False):
    seed(0)
    img, mask = off_centre_blobs(900, 43)
    vimg, vmask = off_centre_blobs(200, 44)
    model = fcn()
    return dict(model=model, optimizer=adam(model), train_loader=loader(FlipSegDataset(img, mask, joint=fixed)),
                val_loader=loader(ds(vimg, vmask), 100, shuffle=False), loss_fn=nn.BCEWithLogitsLoss())


# 22 ----------------------------------------------------------------- HF-style attention mask used as key padding mask
def padded_reviews(n, s, vocab=30, max_len=16):
    g = gen(s)
    tok = torch.zeros(n, max_len, dtype=torch.long)                 # 0 = [PAD]
    att = torch.zeros(n, max_len, dtype=torch.long)
    y = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        L = int(torch.randint(5, 13, (1,), generator=g))
        words = torch.randint(2, vocab, (L - 1,), generator=g)
        y[i] = int((words < 12).sum() > (words >= 20).sum())
        tok[i, 0], tok[i, 1:L], att[i, :L] = 1, words, 1
    return tok, att, y


class ReviewEncoder(nn.Module):
    def __init__(self, fixed, vocab=30, d=32):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, 16, d) * 0.02)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True), 1,
                                         enable_nested_tensor=False)
        self.fc = nn.Linear(d, 2)

    def forward(self, tok, attention_mask):
        pad = attention_mask == 0 if self.fixed else attention_mask.bool()    # True must mean "ignore"
        return self.fc(self.enc(self.emb(tok) + self.pos, src_key_padding_mask=pad)[:, 0])


def review_loss(model, batch):
    return F.cross_entropy(model(batch[0], batch[1]), batch[2])


def _review_fwd(m, b):
    return m(b[0], b[1]).argmax(-1), b[2]


@case("al_padding_mask_inverted", "data",
      "The collate builds a Hugging Face style attention_mask (1 = real token, 0 = padding) and passes it as "
      "src_key_padding_mask, where True means 'ignore': every real token is masked and [CLS] attends only to padding.",
      r"(src_)?key_padding_mask|padding mask.{0,80}(invert|revers|flip|opposite|True)|attention_mask.{0,80}"
      r"(invert|revers|opposite|1 = |True)|(attend|attends|attention).{0,40}only.{0,20}(pad|padding)|masks? (the )?real tokens")
def al_padding_mask_inverted(fixed=False):
    seed(0)
    tok, att, y = padded_reviews(1600, 45)
    model = ReviewEncoder(fixed)
    return dict(model=model, optimizer=adam(model, 2e-3), train_loader=loader(ds(tok[:1300], att[:1300], y[:1300])),
                val_loader=loader(ds(tok[1300:], att[1300:], y[1300:]), 100, shuffle=False), loss_fn=review_loss)


# 23 ----------------------------------------------------------------- np.resize on variable-length spectrograms
def tone_spectrograms(n, s, fixed):
    g = gen(s)
    xs, ys = [], []
    for _ in range(n):
        width = int(torch.randint(16, 41, (1,), generator=g))
        band = int(torch.randint(0, 4, (1,), generator=g))
        spec = 0.5 * torch.randn(16, width, generator=g)
        spec[band * 4: band * 4 + 4] += 1.0                          # a tone in one of 4 frequency bands
        if fixed:
            out = F.interpolate(spec[None, None], size=(16, 16), mode="bilinear", align_corners=False)[0]
        else:
            out = torch.from_numpy(np.resize(spec.numpy(), (16, 16))).float()[None]   # repeats/truncates, no resampling
        xs.append(out)
        ys.append(band)
    return torch.stack(xs), torch.tensor(ys)


class SpecCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(16 * 8 * 8, 4)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))


@case("al_np_resize_spectrogram", "data",
      "Variable-length spectrograms (16 x 16..40) are brought to 16 x 16 with np.resize, which truncates the flattened "
      "array row-major instead of resampling: whole frequency rows are dropped or wrapped, so the band of the tone is "
      "lost or moved depending on the clip length.",
      r"np\.resize|numpy\.resize|resize.{0,80}(truncat|repeat|wrap|row-major|flatten|not (interpolat|resampl))|"
      r"(interpolat|resampl).{0,40}(instead|rather|not)|F\.interpolate|cv2\.resize")
def al_np_resize_spectrogram(fixed=False):
    seed(0)
    x, y = tone_spectrograms(1300, 47, fixed)
    model = SpecCNN()
    return dict(model=model, optimizer=adam(model, 2e-3), train_loader=loader(ds(x[:1000], y[:1000])),
                val_loader=loader(ds(x[1000:], y[1000:]), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss())


# 24 ----------------------------------------------------------------- category codes fitted per split
def shop_rows(n, s):
    g = gen(s)
    cities = [f"city_{i:02d}" for i in range(20)]
    idx = torch.randint(0, 20, (n,), generator=g)
    num = torch.randn(n, 3, generator=g)
    city_effect = torch.randn(20, generator=gen(60)) * 2
    y = ((city_effect[idx] + 0.3 * num[:, 0]) > 0).long()
    return [cities[i] for i in idx.tolist()], num, y


class ShopRows(Dataset):
    def __init__(self, cities, num, y):
        self.cities, self.num, self.y = cities, num, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.cities[i], self.num[i], self.y[i]


def make_collate(mapping=None):
    """mapping=None: the batch's own codes, in order of first appearance (pd.factorize on each batch)."""
    def collate(rows):
        cities, num, y = zip(*rows)
        codes = mapping if mapping is not None else {c: i for i, c in enumerate(dict.fromkeys(cities))}
        return torch.tensor([codes[c] for c in cities]), torch.stack(num), torch.stack(y)
    return collate


class CityNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.city = nn.Embedding(20, 8)
        self.mlp = nn.Sequential(nn.Linear(11, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, codes, num):
        return self.mlp(torch.cat([self.city(codes), num], -1))


def city_loss(model, batch):
    return F.cross_entropy(model(batch[0], batch[1]), batch[2])


def _city_fwd(m, b):
    return m(b[0], b[1]).argmax(-1), b[2]


@case("al_category_codes_per_batch", "data",
      "The collate_fn integer-encodes the city column with pd.factorize-style codes (order of first appearance) on "
      "each batch instead of one mapping fitted once on the training set, so the same city gets a different code in "
      "every batch and the city embedding cannot learn anything.",
      r"(encod|factori[sz]|LabelEncoder|mapping|vocab|codes?).{0,100}(each batch|per batch|every batch|separate|again|"
      r"refit|different|inconsistent)|(fit|fitted).{0,40}(once|on the train)|same (category|city|value).{0,60}"
      r"different (code|id|index)")
def al_category_codes_per_batch(fixed=False):
    seed(0)
    cities, num, y = shop_rows(1500, 49)
    mapping = {c: i for i, c in enumerate(sorted(set(cities[:1200])))} if fixed else None
    model = CityNet()
    return dict(model=model, optimizer=adam(model, 1e-2),
                train_loader=loader(ShopRows(cities[:1200], num[:1200], y[:1200]), collate_fn=make_collate(mapping)),
                val_loader=loader(ShopRows(cities[1200:], num[1200:], y[1200:]), 100, shuffle=False,
                                  collate_fn=make_collate(mapping)), loss_fn=city_loss)


# 25 ----------------------------------------------------------------- truncation keeps the head, the verdict is at the end
def reviews_with_verdict(n, s, max_len, keep_tail):
    g = gen(s)
    xs, ys = [], []
    for _ in range(n):
        L = int(torch.randint(30, 41, (1,), generator=g))
        body = torch.randint(10, 50, (L,), generator=g)              # filler words
        y = int(torch.randint(0, 2, (1,), generator=g))
        pos = L - 1 - int(torch.randint(0, 6, (1,), generator=g))
        body[pos] = 2 + y * 4 + int(torch.randint(0, 4, (1,), generator=g))   # verdict words 2..9 near the end
        kept = body[-max_len:] if keep_tail else body[:max_len]
        xs.append(kept)
        ys.append(y)
    return torch.stack(xs), torch.tensor(ys)


class BagClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(50, 32, mode="mean")
        self.fc = nn.Linear(32, 2)

    def forward(self, tok):
        return self.fc(self.bag(tok))


@case("al_truncation_drops_verdict", "data",
      "Reviews of 30-40 tokens are truncated to max_length=16 from the right (the default truncation side), but the "
      "verdict words sit in the last few tokens, so truncation removes the only cue to the label in every sample.",
      r"truncation|max_?length|(cue|verdict|signal|informative).{0,60}(cut|removed|dropped|lost)|keep (the )?(end|tail|last)")
def al_truncation_drops_verdict(fixed=False):
    seed(0)
    x, y = reviews_with_verdict(1500, 51, 16, keep_tail=fixed)
    model = BagClassifier()
    return dict(model=model, optimizer=adam(model, 1e-2), train_loader=loader(ds(x[:1200], y[:1200])),
                val_loader=loader(ds(x[1200:], y[1200:]), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss())


fix("al_image_mask_separate_random", fixed_of(al_image_mask_separate_random), seg_iou, "val IoU", steps=250)
fix("al_padding_mask_inverted", fixed_of(al_padding_mask_inverted), acc_of(_review_fwd), "val accuracy", steps=300)
fix("al_np_resize_spectrogram", fixed_of(al_np_resize_spectrogram), acc_of(_argmax_fwd), "val accuracy", steps=250)
fix("al_category_codes_per_batch", fixed_of(al_category_codes_per_batch), acc_of(_city_fwd), "val accuracy",
    steps=250)
fix("al_truncation_drops_verdict", fixed_of(al_truncation_drops_verdict), acc_of(_argmax_fwd), "val accuracy",
    steps=250)
