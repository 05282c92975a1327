"""Set g, family `data`: datasets, loaders, samplers, augmentation and preprocessing."""

from __future__ import annotations

import math
import random
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset, Sampler, TensorDataset, WeightedRandomSampler

from benchmarks.blind_preflight_g.registry import accuracy, case, fix, loader, seed, val_acc

# --------------------------------------------------------------------------- 1: crop drawn separately for the mask


def lesion_scans(n=900, size=24, s=0):
    g = torch.Generator().manual_seed(s)
    yy, xx = torch.meshgrid(torch.arange(size, dtype=torch.float32), torch.arange(size, dtype=torch.float32),
                            indexing="ij")
    cy = 6 + torch.rand(n, generator=g) * 12
    cx = 6 + torch.rand(n, generator=g) * 12
    r = 2.0 + torch.rand(n, generator=g) * 2.5
    masks = (((yy - cy[:, None, None]) ** 2 + (xx - cx[:, None, None]) ** 2) < r[:, None, None] ** 2).long()
    imgs = masks.float() * 1.2 + 0.5 * torch.randn(n, size, size, generator=g)
    return imgs[:, None], masks


class LesionCrops(Dataset):
    """Random 16x16 training crops of 24x24 scans."""

    def __init__(self, imgs, masks, crop=16, joint=False, s=0):
        self.imgs, self.masks, self.crop, self.joint = imgs, masks, crop, joint
        self.rng = random.Random(s)

    def __len__(self):
        return len(self.imgs)

    def random_crop(self, t, offsets=None):
        i, j = offsets or (self.rng.randint(0, t.shape[-2] - self.crop), self.rng.randint(0, t.shape[-1] - self.crop))
        return t[..., i:i + self.crop, j:j + self.crop], (i, j)

    def __getitem__(self, k):
        img, offsets = self.random_crop(self.imgs[k])
        mask, _ = self.random_crop(self.masks[k], offsets if self.joint else None)
        return img, mask


class TinyFCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 2, 1))

    def forward(self, x):
        return self.net(x)


@torch.no_grad()
def lesion_iou(model, kw):
    imgs, masks = kw["val_loader"].dataset.tensors
    pred = model(imgs).argmax(1)
    inter = ((pred == 1) & (masks == 1)).sum().item()
    union = ((pred == 1) | (masks == 1)).sum().item()
    return inter / max(union, 1)


def _lesions(fix=False):
    seed(0)
    imgs, masks = lesion_scans(s=41)
    model = TinyFCN()
    centre = slice(4, 20)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(LesionCrops(imgs[:750], masks[:750], joint=fix, s=1), 16),
                val_loader=loader(TensorDataset(imgs[750:, :, centre, centre], masks[750:, centre, centre]), 50,
                                  shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


@case("lesion_segmentation_crop_drawn_separately_for_mask", "data",
      bug="the Dataset crops the scan and its mask with two calls of random_crop(), each drawing its own random "
          "offsets: the 16x16 mask is cut from a different place than the image (up to 8 pixels away), so the "
          "lesion labels rarely sit on the lesion and the segmenter learns blurry guesses (draw the offsets once and "
          "apply them to both)",
      cause_pattern=r"(crops?|transforms?|augment\w*|offsets?|flips?)[^.]*(independ|separate|different|own|twice)[^.]*"
                    r"(mask|label|target|image)|(mask|label|target)s?[^.]*(misalign|not aligned|shifted|do not match|d"
                    r"on't match|different (crop|region|place|location))|misalign|same (random )?(crop|offsets?|params"
                    r"|parameters|transform|seed)|joint\w* (transform|crop)")
def lesion_segmentation_crop_drawn_separately_for_mask():
    return _lesions()


def _fact_lesions():
    ds = _lesions()["train_loader"].dataset
    agree = []
    for k in range(200):
        img, mask = ds[k]
        agree.append(((img[0] > 0.6).long() == mask).float().mean().item())
    print(f"  pixel agreement between 'bright' and the mask in training crops: {sum(agree) / len(agree):.2f}")


fix("lesion_segmentation_crop_drawn_separately_for_mask", lambda: _lesions(True), lesion_iou, "val lesion IoU",
    _fact_lesions)

# --------------------------------------------------------------------------- 2: windows across station boundaries

STATIONS, SERIES_LEN, WINDOW, AHEAD = 60, 60, 24, 12     # forecast the reading 12 h after the window


def station_series(s=0):
    """Hourly readings of many stations: each station has its own level and a smooth AR(1) fluctuation."""
    g = torch.Generator().manual_seed(s)
    level = torch.randn(STATIONS, 1, generator=g) * 3
    noise = torch.randn(STATIONS, SERIES_LEN, generator=g) * 0.3
    x = torch.zeros(STATIONS, SERIES_LEN)
    for t in range(1, SERIES_LEN):
        x[:, t] = 0.8 * x[:, t - 1] + noise[:, t]
    return level + x


def windows_concatenated(series):
    flat = series.reshape(-1)
    idx = torch.arange(len(flat) - WINDOW - AHEAD + 1)
    return torch.stack([flat[i:i + WINDOW] for i in idx]), flat[idx + WINDOW + AHEAD - 1]


def windows_per_station(series):
    xs, ys = [], []
    for row in series:
        for i in range(len(row) - WINDOW - AHEAD + 1):
            xs.append(row[i:i + WINDOW])
            ys.append(row[i + WINDOW + AHEAD - 1])
    return torch.stack(xs), torch.stack(ys)


class NextHourMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(WINDOW, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@torch.no_grad()
def station_val_mse(model, kw):
    x, y = kw["val_loader"].dataset.tensors
    return -F.mse_loss(model(x), y).item()


def _stations(fix=False):
    seed(0)
    series = station_series(s=42)
    train = series[:50]
    x, y = windows_per_station(train) if fix else windows_concatenated(train)
    vx, vy = windows_per_station(series[50:])
    model = NextHourMLP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(vx, vy), 120, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=3000)


@case("station_forecast_windows_cut_across_station_boundaries", "data",
      bug="the 50 stations' 60-hour series are concatenated into one long array before the (24-hour window, reading "
          "12 h later) pairs are cut: 58% of the pairs start in one station and take their target from the next "
          "one (a fifth with no reading of that station in the window at all), so the targets are largely another "
          "station's level, unrelated to the window (cut the windows inside each station's series)",
      cause_pattern=r"(boundar\w*|straddl\w*|span\w*|cross\w*)[^.]*(series|stations?|sensors?|files?|sequences?)|"
                    r"(concatenat\w*|torch\.cat|joined|flatten\w*)[^.]*(series|stations?|sequences?)|windows?[^.]*"
                    r"(mix\w*|two|different|next|another) (series|stations?|sensors?|sequences?)|(series|stations?|"
                    r"sensors?)[^.]*(concatenat|joined|glued)")
def station_forecast_windows_cut_across_station_boundaries():
    return _stations()


def _fact_stations():
    series = station_series(s=42)[:50]
    x, y = windows_concatenated(series)
    starts = torch.arange(len(y))
    crossing = (starts // SERIES_LEN) != ((starts + WINDOW + AHEAD - 1) // SERIES_LEN)
    print(f"  training windows whose target belongs to another station: {crossing.float().mean():.2f}")


fix("station_forecast_windows_cut_across_station_boundaries", lambda: _stations(True), station_val_mse,
    "-val MSE (windows within one station)", _fact_stations)

# --------------------------------------------------------------------------- 3: 8 kHz clips not resampled

TONES = (300.0, 600.0, 1200.0, 2400.0)        # hum classes: each doubles the previous pitch


def hum_clips(n=2400, s=0):
    """Motor-hum clips from two recorders: half at 16 kHz, half at 8 kHz (1024 and 512 samples of 64 ms)."""
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, 4, (n,), generator=g)
    rates = torch.where(torch.rand(n, generator=g) < 0.5, 16000, 8000)
    clips = []
    for i in range(n):
        sr = int(rates[i])
        t = torch.arange(int(0.064 * sr)) / sr
        f = TONES[int(y[i])] * (1 + 0.03 * float(torch.randn(1, generator=g)))
        phase = float(torch.rand(1, generator=g)) * 6.28
        wave = torch.sin(2 * math.pi * f * t + phase) + 0.4 * torch.sin(2 * math.pi * 2 * f * t)
        clips.append(wave + 0.3 * torch.randn(len(t), generator=g))
    return clips, rates, y


class HumSpectra(Dataset):
    """Log-magnitude spectrum of the first 512 samples of each clip."""

    def __init__(self, clips, rates, y, resample=False):
        self.clips, self.rates, self.y, self.resample = clips, rates, y, resample

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        wave = self.clips[i]
        if self.resample and int(self.rates[i]) != 16000:
            wave = F.interpolate(wave[None, None], scale_factor=16000 / int(self.rates[i]), mode="linear",
                                 align_corners=False)[0, 0]
        spec = torch.fft.rfft(wave[:512] * torch.hann_window(512)).abs()
        return torch.log1p(spec), self.y[i]


class HumMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(257, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return self.net(x)


def _hums(fix=False):
    seed(0)
    clips, rates, y = hum_clips(s=43)
    vclips, vrates, vy = hum_clips(n=400, s=143)
    keep = vrates == 16000                          # validation: the deployed 16 kHz recorder
    vclips = [c for c, k in zip(vclips, keep) if k]
    return dict(model=HumMLP(), optimizer=None, train_loader=loader(HumSpectra(clips, rates, y, resample=fix), 32),
                val_loader=loader(HumSpectra(vclips, vrates[keep], vy[keep]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


def _hums_kw(fix=False):
    kw = _hums(fix)
    kw["optimizer"] = torch.optim.Adam(kw["model"].parameters(), lr=2e-3)
    return kw


@case("motor_hum_8khz_clips_not_resampled", "data",
      bug="half of the training clips come from an 8 kHz recorder and are framed and FFT'd exactly like the 16 kHz "
          "ones, without resampling: every frequency of an 8 kHz clip lands in the bin of twice that frequency, so "
          "a 300 Hz hum looks like the 600 Hz class, 600 like 1200 and so on; half the training set carries the "
          "label of the neighbouring class (resample to 16 kHz first)",
      cause_pattern=r"sample.?rate|sampling.?rate|resampl\w*|\b8 ?k(hz)?\b|\b16 ?k(hz)?\b|(frequenc\w*|pitch|spectr\w*|"
                    r"bins?)[^.]*(shift\w*|doubl\w*|halv\w*|scal\w*|stretch\w*|twice)")
def motor_hum_8khz_clips_not_resampled():
    return _hums_kw()


def _fact_hums():
    clips, rates, y = hum_clips(n=200, s=43)
    ds = HumSpectra(clips, rates, y)
    peaks = {}
    for i in range(200):
        peaks.setdefault((int(rates[i]), int(y[i])), []).append(int(ds[i][0][3:].argmax()) + 3)
    print("  spectral peak bin by (rate, class):", {k: round(sum(v) / len(v)) for k, v in sorted(peaks.items())})


fix("motor_hum_8khz_clips_not_resampled", lambda: _hums_kw(True), val_acc, "val acc (16 kHz clips)", _fact_hums)

# --------------------------------------------------------------------------- 4: BGR training images, RGB validation

COLOURS = torch.tensor([[1.0, 0.1, 0.1], [0.1, 1.0, 0.1], [0.1, 0.1, 1.0], [1.0, 1.0, 0.1]])   # RGB


def swatch_images(n=1600, s=0):
    """Product swatches: a coloured square on a grey background; the class is the colour."""
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, 4, (n,), generator=g)
    imgs = 0.4 + 0.15 * torch.randn(n, 3, 16, 16, generator=g)
    for i in range(n):
        r, c = torch.randint(0, 8, (2,), generator=g).tolist()
        imgs[i, :, r:r + 8, c:c + 8] = COLOURS[y[i]][:, None, None] + 0.1 * torch.randn(3, 8, 8, generator=g)
    return imgs, y


class SwatchDataset(Dataset):
    def __init__(self, imgs, y, bgr=False):
        self.imgs, self.y, self.bgr = imgs, y, bgr

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = self.imgs[i]
        if self.bgr:                 # cv2.imread order: the training pipeline never converts to RGB
            img = img.flip(0)
        return {"pixel_values": img, "labels": self.y[i]}


def tiny_vit(labels=4):
    from transformers import ViTConfig, ViTForImageClassification
    return ViTForImageClassification(ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=48,
                                               num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                                               num_labels=labels, hidden_dropout_prob=0.0,
                                               attention_probs_dropout_prob=0.0))


def hf_logits_acc(model, kw):
    return accuracy(model, kw["val_loader"], lambda m, b: (m(pixel_values=b["pixel_values"]).logits.argmax(-1),
                                                          b["labels"]))


def _swatches(fix=False):
    seed(0)
    imgs, y = swatch_images(s=44)
    model = tiny_vit()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(SwatchDataset(imgs[:1300], y[:1300], bgr=not fix), 32),
                val_loader=loader(SwatchDataset(imgs[1300:], y[1300:]), 100, shuffle=False),
                loss_fn=None, max_steps=2000)


@case("swatch_vit_train_images_bgr_val_rgb", "data",
      bug="the training Dataset reads images the cv2 way (channels in BGR order) and never converts them, while the "
          "validation pipeline (and serving) is RGB: red swatches are trained as if they were blue and yellow as "
          "cyan, so the colour classes the ViT learns are swapped at validation (convert BGR to RGB in training)",
      cause_pattern=r"\bBGR\b|\bRGB\b|channel (order|swap)|colou?r channels?[^.]*(swap|revers|order|flip)|(train\w*|"
                    r"validation|val)[^.]*(channels?|colou?rs?)[^.]*(differ|swap|mismatch|revers)|cv2|(channels?)[^.]*"
                    r"(revers|swap|flip)\w*[^.]*(train|validation)")
def swatch_vit_train_images_bgr_val_rgb():
    return _swatches()


def _fact_swatches():
    kw = _swatches()
    tr = torch.stack([kw["train_loader"].dataset[i]["pixel_values"].mean((1, 2)) for i in range(300)])
    va = torch.stack([kw["val_loader"].dataset[i]["pixel_values"].mean((1, 2)) for i in range(300)])
    print(f"  mean channel values train {[round(v, 3) for v in tr.mean(0).tolist()]} vs val "
          f"{[round(v, 3) for v in va.mean(0).tolist()]}; red class channel 0 train "
          f"{tr[kw['train_loader'].dataset.y[:300] == 0, 0].mean():.2f}, val "
          f"{va[kw['val_loader'].dataset.y[:300] == 0, 0].mean():.2f}")


fix("swatch_vit_train_images_bgr_val_rgb", lambda: _swatches(True), hf_logits_acc, "val acc", _fact_swatches,
    steps=200)

# --------------------------------------------------------------------------- 5: length buckets in a fixed order


def complaint_texts(n=2400, vocab=100, s=0):
    """Three ticket types with type-specific keywords; the types also differ in length (short / medium / long)."""
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, 3, (n,), generator=g)
    lengths = 4 + 5 * y + torch.randint(0, 5, (n,), generator=g)
    seqs = []
    for i in range(n):
        seq = torch.randint(10, vocab, (int(lengths[i]),), generator=g)
        seq[int(torch.randint(0, int(lengths[i]), (1,), generator=g))] = 1 + 3 * int(y[i]) + int(
            torch.randint(0, 3, (1,), generator=g))
        seqs.append(seq)
    return seqs, y


class Tickets(Dataset):
    def __init__(self, seqs, y):
        self.seqs, self.y = seqs, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.seqs[i], self.y[i]


def pad_tickets(items):
    seqs, ys = zip(*items)
    return nn.utils.rnn.pad_sequence(list(seqs), batch_first=True), torch.stack(ys)


class BucketBatchSampler(Sampler):
    """Batches of similar length (little padding): indices sorted by length, cut into batches."""

    def __init__(self, lengths, batch_size, shuffle_batches=False, s=0):
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        self.batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        self.shuffle_batches = shuffle_batches
        self.g = torch.Generator().manual_seed(s)

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        if self.shuffle_batches:
            return iter([self.batches[i] for i in torch.randperm(len(self.batches), generator=self.g).tolist()])
        return iter(self.batches)


class TicketBag(nn.Module):
    def __init__(self, vocab=100):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, ids):
        mask = (ids != 0).float()[..., None]
        return self.mlp((self.emb(ids) * mask).sum(1) / mask.sum(1))


def _tickets(fix=False):
    seed(0)
    seqs, y = complaint_texts(s=45)
    train = Tickets(seqs[:2000], y[:2000])
    sampler = BucketBatchSampler([len(s) for s in seqs[:2000]], 32, shuffle_batches=fix)
    return dict(model=TicketBag(), optimizer=None,
                train_loader=torch.utils.data.DataLoader(train, batch_sampler=sampler, collate_fn=pad_tickets),
                val_loader=loader(Tickets(seqs[2000:], y[2000:]), 100, shuffle=False, collate_fn=pad_tickets),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


def _tickets_kw(fix=False):
    kw = _tickets(fix)
    kw["optimizer"] = torch.optim.Adam(kw["model"].parameters(), lr=1e-2)
    return kw


@case("ticket_length_buckets_served_in_fixed_order", "data",
      bug="the length-bucketing batch sampler sorts the tickets by length and yields the batches in that same order "
          "every epoch (no shuffling of the batches): the ticket types differ in length, so each epoch is all "
          "'short' tickets, then all 'medium', then all 'long'; every batch holds one class and the model is "
          "dragged towards whichever class it saw last (shuffle the order of the batches each epoch)",
      cause_pattern=r"shuffl|(sorted|ordered|grouped) (by )?(length|size)|(batch|bucket)\w*[^.]*(same|fixed|sorted|"
                    r"sequential) order|(single|one).?class batches|batches?[^.]*(only one|single|one) (class|label)|"
                    r"class.?(homogeneous|pure)|order of (the )?batches|(label|class) (order|sequence|drift)")
def ticket_length_buckets_served_in_fixed_order():
    return _tickets_kw()


def _fact_tickets():
    kw = _tickets()
    labels = [b[1] for b in kw["train_loader"]]
    pure = sum(len(set(lb.tolist())) == 1 for lb in labels)
    print(f"  batches holding a single class: {pure} of {len(labels)}; classes of the first/last batch: "
          f"{labels[0].tolist()[:4]} / {labels[-1].tolist()[:4]}")


fix("ticket_length_buckets_served_in_fixed_order", lambda: _tickets_kw(True), val_acc, "val acc", _fact_tickets)

# --------------------------------------------------------------------------- 6: hashing into 2 ^ 14 buckets

N_BUCKETS = 2 ^ 14                  # 2**14 hashed features


def news_snippets(n=3000, s=0):
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, 5, (n,), generator=g)
    texts = []
    for i in range(n):
        words = [f"w{int(w)}" for w in torch.randint(0, 400, (10,), generator=g)]
        for _ in range(2):
            words[int(torch.randint(0, 10, (1,), generator=g))] = f"topic{int(y[i])}_{int(torch.randint(0, 6, (1,), generator=g))}"
        texts.append(" ".join(words))
    return texts, y


def hash_features(texts, buckets):
    x = torch.zeros(len(texts), buckets)
    for i, t in enumerate(texts):
        for w in t.split():
            x[i, zlib.crc32(w.encode()) % buckets] += 1.0
    return x


def _news(fix=False):
    seed(0)
    texts, y = news_snippets(s=46)
    buckets = 2 ** 14 if fix else N_BUCKETS
    x = hash_features(texts, buckets)
    model = nn.Sequential(nn.Linear(buckets, 32), nn.ReLU(), nn.Linear(32, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 32),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


@case("news_hashing_vectorizer_2_xor_14_buckets", "data",
      bug="the hashed bag-of-words uses N_BUCKETS = 2 ^ 14, which in Python is XOR (= 12), not 2 ** 14: ~430 "
          "distinct words are hashed into 12 columns, every topic keyword shares its column with dozens of filler "
          "words and with other topics' keywords, and the topics are hard to tell apart (2 ** 14)",
      cause_pattern=r"hash\w*|collid\w*|collision|\b2 ?\^ ?14\b|\bxor\b|(only|just) 12 (features|dimensions|columns|"
                    r"buckets|inputs)|(too few|very few) (features|dimensions|columns|buckets|inputs)|(distinct )?words?"
                    r"[^.]*(share|same) (column|feature|dimension|bucket)")
def news_hashing_vectorizer_2_xor_14_buckets():
    return _news()


def _fact_news():
    texts, _ = news_snippets(n=500, s=46)
    words = {w for t in texts for w in t.split()}
    print(f"  2 ^ 14 = {2 ^ 14}; distinct words {len(words)} -> columns used "
          f"{len({zlib.crc32(w.encode()) % N_BUCKETS for w in words})}")


fix("news_hashing_vectorizer_2_xor_14_buckets", lambda: _news(True), val_acc, "val acc", _fact_news)

# --------------------------------------------------------------------------- 7: sampler without replacement


def rare_failures(n=6000, d=8, s=0):
    g = torch.Generator().manual_seed(s)
    y = (torch.rand(n, generator=g) < 0.04).long()
    x = torch.randn(n, d, generator=g)
    x[:, :2] += y[:, None] * 1.6
    return x, y


@torch.no_grad()
def balanced_acc(model, kw):
    x, y = kw["val_loader"].dataset.tensors
    pred = model(x).argmax(1)
    return 0.5 * ((pred[y == 1] == 1).float().mean() + (pred[y == 0] == 0).float().mean()).item()


def _failures(fix=False):
    seed(0)
    x, y = rare_failures(s=47)
    xt, yt = x[:5000], y[:5000]
    counts = torch.bincount(yt).float()
    weights = (1.0 / counts)[yt]
    sampler = WeightedRandomSampler(weights, num_samples=len(yt), replacement=fix,
                                    generator=torch.Generator().manual_seed(5))
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=torch.utils.data.DataLoader(TensorDataset(xt, yt), batch_size=64, sampler=sampler),
                val_loader=loader(TensorDataset(x[5000:], y[5000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


@case("turbine_failures_weighted_sampler_without_replacement", "data",
      bug="the 4% failure class is 'balanced' with WeightedRandomSampler(1 / class_count[y], num_samples=len(y), "
          "replacement=False): without replacement every row is drawn exactly once per epoch and the weights only "
          "change the order, so the batches keep the 4% / 96% ratio and the classifier still ignores the failures "
          "(replacement=True)",
      cause_pattern=r"replacement|without replac\w*|(sampler|weights?)[^.]*(no effect|only (change|reorder|permut)\w*|"
                    r"do(es)?n'?t? (re)?balance|does not (re)?balance|ignored|only (the )?order\b)|(class )?(imbalance"
                    r"|balance|ratio|frequency|prevalence)\w*[^.]*(unchanged|remains|same as|not (re)?balanced|still "
                    r"\d)")
def turbine_failures_weighted_sampler_without_replacement():
    return _failures()


def _fact_failures():
    kw = _failures()
    ys = torch.cat([b[1] for b in kw["train_loader"]])
    print(f"  share of failures drawn in one epoch by the sampler: {ys.float().mean():.3f} "
          f"(dataset {kw['train_loader'].dataset.tensors[1].float().mean():.3f})")


fix("turbine_failures_weighted_sampler_without_replacement", lambda: _failures(True), balanced_acc,
    "val balanced acc", _fact_failures)
