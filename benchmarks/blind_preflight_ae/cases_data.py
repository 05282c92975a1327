"""Set ae, family data: what the loader delivers does not pair inputs with the right targets or scale."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.blind_preflight_ae.models import GRUSeq2Seq, MLPEncoder
from benchmarks.blind_preflight_ae.registry import acc_of, case, fix, fixed_of, gen, loader, mean_over, rmse_of, seed


def tiles(n: int, s: int, size: int = 12) -> torch.Tensor:
    """Asymmetric smooth 1-channel tiles (a ramp plus an off-centre blob), values in [0, 1]."""
    g = gen(s)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    cx, cy = torch.rand(n, 1, 1, generator=g) * 0.5, torch.rand(n, 1, 1, generator=g)
    blob = torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 0.02)
    ramp = xx * (0.5 + 0.5 * torch.rand(n, 1, 1, generator=g))
    img = 0.7 * blob + 1.5 * ramp
    return (img / img.amax(dim=(1, 2), keepdim=True)).unsqueeze(1)


# 1. An image denoiser whose Dataset applies its random horizontal flip separately to the noisy input and to the clean
#    target (two coin tosses): half of the pairs are mirror images of each other and the net learns to blur.
class FlipPairs(Dataset):
    def __init__(self, clean, shared_flip: bool):
        self.clean, self.shared_flip = clean, shared_flip

    def __len__(self):
        return len(self.clean)

    def __getitem__(self, i):
        clean = self.clean[i]
        noisy = clean + 0.3 * torch.randn_like(clean)
        flip_in = random.random() < 0.5
        flip_out = flip_in if self.shared_flip else random.random() < 0.5
        return (noisy.flip(-1) if flip_in else noisy), (clean.flip(-1) if flip_out else clean)


def flip_denoiser(fixed: bool = False):
    seed(0)
    x = tiles(1400, 161)
    vx = x[1200:]
    vnoisy = vx + 0.3 * torch.randn(vx.shape, generator=gen(162))
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 1, 3, padding=1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(FlipPairs(x[:1200], shared_flip=fixed), 32),
                val_loader=loader(TensorDataset(vnoisy, vx), 200, shuffle=False), loss_fn=nn.MSELoss(),
                max_steps=3000)


case("denoiser_flips_input_and_target_independently", "data",
     bug="The Dataset's random horizontal flip draws a separate coin toss for the noisy input and for the clean "
         "target, so about half of the training pairs are mirror images of each other and the denoiser learns the "
         "average of a tile and its mirror (a blur); draw the flip once and apply it to both.",
     cause_pattern=r"(separate|independent|two) (coin toss|random (draw|flip|transform)|flips?)"
                   r"|(flip|augment|transform)\w*.{0,80}(independently|separately).{0,60}(input|target|pair)"
                   r"|(mirror|flipped) (images?|copies) of each other|same (random )?(flip|transform|augmentation) (to|on) both"
                   r"|(input|target)s?.{0,40}(spatially )?misaligned")(flip_denoiser)
fix("denoiser_flips_input_and_target_independently", fixed_of(flip_denoiser),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val denoising RMSE", higher=False)


# 2. Distillation with teacher logits precomputed once by iterating a shuffle=True DataLoader and stored by position
#    next to the unshuffled dataset: row i gets the teacher output of some other example.
def precompute_teacher(teacher: nn.Module, x: torch.Tensor, shuffle: bool) -> torch.Tensor:
    dl = DataLoader(TensorDataset(x), batch_size=100, shuffle=shuffle, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        return torch.cat([teacher(b) for (b,) in dl])


def stored_kd_loss(model, batch, T: float = 2.0):
    x, t_logits = batch
    s = model(x)
    return F.kl_div(F.log_softmax(s / T, dim=1), F.softmax(t_logits / T, dim=1), reduction="batchmean") * T * T


def audio_teacher():
    torch.manual_seed(171)
    net = nn.Sequential(nn.Linear(24, 96), nn.Tanh(), nn.Linear(96, 6))
    with torch.no_grad():
        net[-1].weight.mul_(3.0)
    return net


def distill_stored_logits(fixed: bool = False):
    seed(0)
    teacher = audio_teacher()
    x = torch.randn(3000, 24, generator=gen(172))
    with torch.no_grad():
        vy = teacher(x[2500:]).argmax(1)
    t_logits = precompute_teacher(teacher, x[:2500], shuffle=not fixed)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2500], t_logits), 64),
                val_loader=loader(TensorDataset(x[2500:], vy), 500, shuffle=False), loss_fn=stored_kd_loss,
                max_steps=3000)


case("distill_teacher_logits_precomputed_shuffled", "data",
     bug="The teacher's logits were precomputed once by iterating a DataLoader with shuffle=True and then stored "
         "row by row next to the unshuffled inputs: the stored soft targets follow the shuffled order, so each input "
         "is paired with another example's teacher output; precompute with shuffle=False (or store by index).",
     cause_pattern=r"(precomput|cach|stor)\w*.{0,80}shuffle|shuffle\w*.{0,80}(precomput|cach|stor)\w*"
                   r"|(soft targets?|teacher (logits|outputs?)).{0,80}(another|other|different|wrong) (example|sample|row|input)"
                   r"|(misaligned|out of order|not aligned).{0,60}(teacher|soft target)|(teacher|soft target).{0,60}(misaligned|out of order)")(distill_stored_logits)
fix("distill_teacher_logits_precomputed_shuffled", fixed_of(distill_stored_logits),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val student accuracy (teacher labels)")


# 3. Triplet training for gait-sensor identity embeddings: the Dataset picks the positive from a random class's
#    index list rather than the anchor's own class, so most "positives" belong to a different person.
class GaitTriplets(Dataset):
    def __init__(self, x, y, positive_from_anchor_class: bool):
        self.x, self.y = x, y
        self.by_class = {int(c): (y == c).nonzero().flatten().tolist() for c in y.unique()}
        self.classes = list(self.by_class)
        self.ok = positive_from_anchor_class

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        c = int(self.y[i])
        pos_class = c if self.ok else random.choice(self.classes)
        neg_class = random.choice([k for k in self.classes if k != c])
        return self.x[i], self.x[random.choice(self.by_class[pos_class])], self.x[random.choice(self.by_class[neg_class])]


def gait_data(n: int, s: int):
    g = gen(s)
    centers = torch.randn(10, 20, generator=gen(181)) * 0.5
    y = torch.randint(0, 10, (n,), generator=g)
    return centers[y] + torch.randn(n, 20, generator=g), y


def triplet_loss(model, batch):
    a, p, n = batch
    return F.triplet_margin_loss(model(a), model(p), model(n), margin=1.0)


def gait_triplets(fixed: bool = False):
    seed(0)
    x, y = gait_data(2400, 182)
    vx, vy = gait_data(400, 183)
    model = MLPEncoder(20, 64, 16)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(GaitTriplets(x, y, positive_from_anchor_class=fixed), 64),
                val_loader=loader(TensorDataset(vx, vy), 400, shuffle=False), loss_fn=triplet_loss, max_steps=3000)


def nn_class_accuracy(model, kw):
    """Leave-one-out 1-nearest-neighbour identity accuracy of the validation embeddings."""
    def fn(m, b):
        x, y = b
        z = F.normalize(m(x).float(), dim=1)
        sim = z @ z.T
        sim.fill_diagonal_(-2)
        return (y[sim.argmax(1)] == y).sum().item(), len(y)
    return mean_over(model, kw["val_loader"], fn)


case("triplet_positive_drawn_from_any_class", "data",
     bug="The triplet Dataset draws the positive from a random class (random.choice over all classes) instead of the "
         "anchor's own class, so about 9 in 10 'positives' are another person's sample and the triplet loss pulls "
         "different identities together; pick the positive from the anchor's class list.",
     cause_pattern=r"positives?.{0,80}(random|any|other|different|wrong) (class|identity|person|label)"
                   r"|(random|any|other|different|wrong) (class|identity|person)\w*.{0,60}positives?"
                   r"|positive.{0,60}(not|never) (from|of|in) the anchor'?s? (own )?(class|identity|label)"
                   r"|anchor'?s? (own )?(class|label) (list|indices)")(gait_triplets)
fix("triplet_positive_drawn_from_any_class", fixed_of(gait_triplets), nn_class_accuracy,
    "val 1-NN identity accuracy")


# 4. A seq2seq cipher model whose source sentences are sorted by length for bucketing (srcs.sort(key=len)) while
#    the target list keeps its original order: the pairs no longer correspond.
def cipher_pairs(n: int, s: int, sort_sources_only: bool):
    g = gen(s)
    lengths = torch.randint(4, 10, (n,), generator=g).tolist()
    srcs = [torch.randint(2, 16, (k,), generator=g) for k in lengths]
    tgts = [(t - 2 + 4) % 14 + 2 for t in srcs]
    if sort_sources_only:
        srcs.sort(key=len)                                   # bucket by length ...
    else:
        order = sorted(range(n), key=lambda i: len(srcs[i]))
        srcs, tgts = [srcs[i] for i in order], [tgts[i] for i in order]
    src = torch.zeros(n, 9, dtype=torch.long)
    dec_in = torch.zeros(n, 9, dtype=torch.long)
    tgt = torch.full((n, 9), -100, dtype=torch.long)
    for i, (a, b) in enumerate(zip(srcs, tgts)):
        src[i, : len(a)] = a
        dec_in[i, 0], dec_in[i, 1: len(b)] = 1, b[:-1]
        tgt[i, : len(b)] = b
    return src, dec_in, tgt


def sorted_sources(fixed: bool = False):
    seed(0)
    src, dec_in, tgt = cipher_pairs(3000, 191, sort_sources_only=not fixed)
    vs, vd, vt = cipher_pairs(500, 192, sort_sources_only=False)
    model = GRUSeq2Seq(16, d=64)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(src, dec_in, tgt), 64),
                val_loader=loader(TensorDataset(vs, vd, vt), 250, shuffle=False),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]).permute(0, 2, 1), b[2], ignore_index=-100),
                max_steps=3000)


case("seq2seq_sources_sorted_targets_not", "data",
     bug="For length bucketing the source sequences are sorted by length (srcs.sort(key=len)) but the target list "
         "is left in its original order, so after sorting source i is paired with some other example's target; "
         "sort the (source, target) pairs together.",
     cause_pattern=r"sort\w*.{0,80}(sources?|inputs?).{0,80}(not|without|but not).{0,30}(targets?|labels?)"
                   r"|(sources?|inputs?) (and|vs\.?) (targets?|labels?).{0,60}(misaligned|out of (order|sync)|no longer (correspond|match))"
                   r"|sort the (\(?source, target\)? )?pairs together|pairs? no longer correspond")(sorted_sources)
fix("seq2seq_sources_sorted_targets_not", fixed_of(sorted_sources),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val teacher-forced token accuracy")


# 5. An autoencoder for 12x12 sprite tiles stored as uint8: the training Dataset converts to [0, 1] (/ 255) and a
#    later "normalise" step divides by 255 again, so it trains on values below 0.004; validation is scaled once.
class SpriteTiles(Dataset):
    def __init__(self, images_uint8, divide_twice: bool):
        self.images, self.divide_twice = images_uint8, divide_twice

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        x = self.images[i].float() / 255.0           # "to tensor"
        if self.divide_twice:
            x = x / 255.0                            # "normalise"
        x = x.flatten()
        return x, x


def sprite_ae(fixed: bool = False):
    seed(0)
    imgs = (tiles(1400, 201) * 255).round().to(torch.uint8)
    val = imgs[1200:].float().flatten(1) / 255.0
    model = nn.Sequential(nn.Linear(144, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 64), nn.ReLU(),
                          nn.Linear(64, 144))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(SpriteTiles(imgs[:1200], divide_twice=not fixed), 64),
                val_loader=loader(TensorDataset(val, val), 200, shuffle=False), loss_fn=nn.MSELoss(), max_steps=3000)


case("sprite_ae_pixels_divided_by_255_twice", "data",
     bug="The training Dataset scales the uint8 pixels to [0, 1] (/ 255) and then divides by 255 a second time in "
         "its normalisation step, so the autoencoder trains on inputs and targets below 0.004 while validation and "
         "inference tiles are in [0, 1]; divide by 255 once.",
     cause_pattern=r"(divid\w+|scal\w+) by 255.{0,40}(twice|two times|a second time|again)|(twice|double)[- ]?(scal|normali[sz]|divid)\w*"
                   r"|/\s*255.{0,60}/\s*255|below 0\.004|(255|pixel)\w*.{0,80}(twice|a second time)"
                   r"|(train\w*|inputs?).{0,60}\[0,\s*1/255\]")(sprite_ae)
fix("sprite_ae_pixels_divided_by_255_twice", fixed_of(sprite_ae),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val reconstruction RMSE", higher=False)
