"""Data family: five real user bugs in how the examples are prepared, augmented, encoded or split (no crash)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.blind_preflight_p.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------------
# 1. Ball localisation: random horizontal flip of the image without flipping the box centre.

IMG = 24


def _balls(n: int, s: int):
    g = gen(s)
    img = 0.2 * torch.rand(n, 1, IMG, IMG, generator=g)
    cx = torch.randint(2, IMG - 2, (n,), generator=g)
    cy = torch.randint(2, IMG - 2, (n,), generator=g)
    for i in range(n):
        img[i, 0, cy[i] - 2:cy[i] + 3, cx[i] - 2:cx[i] + 3] += 0.8
    return img, torch.stack([cx, cy], 1).float()


class BallDataset(Dataset):
    """Image and (x, y) ball centre in pixels; training images are flipped left-right with p=0.5."""

    def __init__(self, img, centre, augment: bool, flip_box: bool):
        self.img, self.centre, self.augment, self.flip_box = img, centre, augment, flip_box

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        img, (x, y) = self.img[i], self.centre[i].tolist()
        if self.augment and torch.rand(()) < 0.5:
            img = img.flip(-1)                                     # np.fliplr(img)
            if self.flip_box:
                x = IMG - 1 - x
        return img, torch.tensor([x, y]) / IMG


def ball_cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 6 * 6, 64), nn.ReLU(),
                         nn.Linear(64, 2))


@case("data_ball_flip_without_box", "data",
      bug="The training Dataset flips each image left-right with probability 0.5 but returns the original box centre, "
          "so for half the samples the x target points at the mirror position of the ball and the regressor learns to "
          "hedge x towards the image centre.",
      fix_line="Flip the annotation with the image: x = W - 1 - x whenever the image is flipped.",
      source="https://blog.roboflow.com/how-flip-augmentation-improves-model-performance",
      cause_pattern=r"(flip|mirror)\w*.{0,140}(box|bbox|coordinates?|annotations?|targets?|labels?|\bx\b|centre|center)"
                    r".{0,60}(not|never|unchanged|without|isn't|aren't|as well|too|also|same)|(box|bbox|coordinates?|"
                    r"annotations?|targets?|centre|center)s?.{0,100}(not|never|aren't|are not|isn't|is not)\s+(flipped|"
                    r"mirrored|updated|transformed)|W\s*-\s*1?\s*-\s*x|(flip|mirror)\w*.{0,140}(original|unflipped|"
                    r"unchanged|un-?mirrored) (box|bbox|coordinates?|annotations?|targets?|centre|center)",
      paraphrases=("Horizontal flip augmentation mirrors the image, but the box coordinates are not flipped, so half "
                   "of the targets point at the wrong x.",
                   "The bounding-box centre is not mirrored when the image is flipped: update x to W - 1 - x in the "
                   "same branch."))
def ball_flip_without_box(fixed: bool = False) -> dict:
    seed(0)
    img, centre = _balls(2000, 24)
    model = ball_cnn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(BallDataset(img[:1700], centre[:1700], True, flip_box=fixed), 32),
                val_loader=loader(BallDataset(img[1700:], centre[1700:], False, flip_box=fixed), 150, False),
                loss_fn=nn.SmoothL1Loss(beta=0.05), max_steps=2000)


fix("data_ball_flip_without_box", fixed_of(ball_flip_without_box),
    rmse_of(lambda m, b: (m(b[0]) * IMG, b[1] * IMG)), "val RMSE of the ball centre (pixels)", steps=300,
    higher=False)

# --------------------------------------------------------------------------------------------------------------------
# 2. Insurance claims: categorical columns factorized separately for the train and validation frames.


def factorize(values, uniques=None):
    """pd.factorize(values) (codes by order of first appearance), or codes against given uniques."""
    values = list(values)
    if uniques is None:
        uniques = list(dict.fromkeys(values))
    index = {v: i for i, v in enumerate(uniques)}
    return np.array([index[v] for v in values]), uniques


CATEGORIES = {"vehicle": [f"veh_{i}" for i in range(8)], "region": [f"reg_{i}" for i in range(12)],
              "occupation": [f"occ_{i}" for i in range(10)]}


def _claims_frame(n: int, s: int) -> dict:
    g = np.random.default_rng(s)
    risk = {c: np.random.default_rng(200 + k).normal(size=len(v)) for k, (c, v) in enumerate(CATEGORIES.items())}
    frame = {c: g.choice(v, size=n) for c, v in CATEGORIES.items()}
    frame["age"] = g.normal(size=n)
    score = sum(risk[c][[CATEGORIES[c].index(x) for x in frame[c]]] for c in CATEGORIES) + 0.5 * frame["age"]
    frame["claim"] = (score + 0.3 * g.normal(size=n) > 0).astype(np.int64)
    return frame


class ClaimsNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.ModuleList([nn.Embedding(len(v), 6) for v in CATEGORIES.values()])
        self.mlp = nn.Sequential(nn.Linear(6 * 3 + 1, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, codes, age):
        return self.mlp(torch.cat([e(codes[:, k]) for k, e in enumerate(self.emb)] + [age], 1))


def _encode(frame: dict, uniques: dict | None):
    codes, found = [], {}
    for c in CATEGORIES:
        col, found[c] = factorize(frame[c], None if uniques is None else uniques[c])
        codes.append(col)
    return (TensorDataset(torch.tensor(np.stack(codes, 1)), torch.tensor(frame["age"], dtype=torch.float32)[:, None],
                          torch.tensor(frame["claim"])), found)


def claims_loss(model, batch):
    codes, age, y = batch
    return F.cross_entropy(model(codes, age), y)


@case("data_claims_factorize_separately", "data",
      bug="The categorical columns are integer-encoded with factorize() run separately on the training and the "
          "validation frames; factorize numbers categories by order of first appearance, so the same vehicle, region "
          "or occupation gets a different code (and a different embedding row) in validation than in training.",
      fix_line="Encode validation with the training categories: factorize(val[col], uniques=train_uniques[col]).",
      source="https://medium.com/@vaibhavshukla182/how-to-solve-mismatch-in-train-and-test-set-after-categorical-"
             "encoding-8320ed03552f",
      cause_pattern=r"factori[sz]\w*.{0,160}(separately|independently|own|each (split|frame|set)|(train|training) and "
                    r"(the )?(val|validation|test))|\b(categor\w*|codes?|encod(ing|ings|ed|er)|mapping|vocab\w*|label ?encoder)\b.{0,140}"
                    r"(differ|inconsistent|mismatch\w*|not the same|permuted|shuffled|re-?fit|fit(ted)? (separately|"
                    r"independently|on (the )?(val|validation)))|(separately|independently).{0,80}(encod|factori[sz]|"
                    r"map)",
      paraphrases=("factorize() is applied separately to train and validation, so category codes differ between the "
                   "two: veh_3 may be code 5 in training and code 0 in validation.",
                   "The validation categorical encoding is inconsistent with training (the mapping was re-fit on the "
                   "validation frame); reuse the training uniques."))
def claims_factorize_separately(fixed: bool = False) -> dict:
    seed(0)
    train_ds, uniques = _encode(_claims_frame(3000, 25), None)
    val_ds, _ = _encode(_claims_frame(600, 26), uniques if fixed else None)
    model = ClaimsNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train_ds, 64), val_loader=loader(val_ds, 200, False), loss_fn=claims_loss,
                max_steps=2000)


fix("data_claims_factorize_separately", fixed_of(claims_factorize_separately),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# 3. Paper topics on a citation graph: the GCN's normalised adjacency is built without self-loops.

N_NODES, N_TOPICS = 800, 4


def _citation_graph(s: int):
    g = gen(s)
    y = torch.randint(0, N_TOPICS, (N_NODES,), generator=g)
    means = torch.randn(N_TOPICS, 32, generator=g)
    x = means[y] * 0.4 + torch.randn(N_NODES, 32, generator=g)
    a = torch.zeros(N_NODES, N_NODES)
    for i in range(N_NODES):
        for _ in range(2):
            same = torch.rand((), generator=g) < 0.5          # half the citations stay in-topic
            pool = (y == y[i]).nonzero().view(-1) if same else (y != y[i]).nonzero().view(-1)
            j = pool[torch.randint(0, len(pool), (1,), generator=g)].item()
            if j != i:
                a[i, j] = a[j, i] = 1.0
    split = torch.rand(N_NODES, generator=g)
    return x, a, y, split < 0.6, split >= 0.8


def normalize_adjacency(a: torch.Tensor, self_loops: bool) -> torch.Tensor:
    if self_loops:
        a = a + torch.eye(a.size(0))
    d = a.sum(1).clamp(min=1).pow(-0.5)
    return d[:, None] * a * d[None, :]


class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(32, 32), nn.Linear(32, N_TOPICS)

    def forward(self, x, a_hat):
        h = torch.relu(a_hat @ self.w1(x))
        return a_hat @ self.w2(h)


class WholeGraph(Dataset):
    def __init__(self, *tensors):
        self.tensors = tensors

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return self.tensors


def gcn_loss(model, batch):
    x, a_hat, y, mask = batch
    return F.cross_entropy(model(x, a_hat)[mask], y[mask])


@case("data_citations_gcn_no_self_loops", "data",
      bug="The normalised adjacency D^-1/2 A D^-1/2 is built from A without self-loops, so each GCN layer replaces a "
          "paper's features by the average of its neighbours' only; as half the citations cross topics, the paper's "
          "own (informative) features are dropped.",
      fix_line="Add self-loops before normalising: a = a + torch.eye(n) (A + I, as in Kipf & Welling).",
      source="https://github.com/pmernyei/wiki-cs-dataset/issues/4",
      cause_pattern=r"self[- ]?loops?|A\s*\+\s*I\b|\+\s*torch\.eye|identity.{0,60}adjacen|adjacen\w*.{0,100}(identity|"
                    r"diagonal|own (node|features))|own (node )?features.{0,100}(excluded|dropped|ignored|missing|never|"
                    r"not included|lost)|add_self_loops",
      paraphrases=("The GCN adjacency has no self-loops: add the identity (A + I) before the symmetric normalisation "
                   "so each node keeps its own features.",
                   "Each node's own features are excluded from the aggregation because the adjacency diagonal is "
                   "zero."))
def citations_gcn_no_self_loops(fixed: bool = False) -> dict:
    seed(0)
    x, a, y, train_mask, val_mask = _citation_graph(27)
    a_hat = normalize_adjacency(a, self_loops=fixed)
    model = GCN()
    one = lambda mask: DataLoader(WholeGraph(x, a_hat, y, mask), batch_size=None)   # noqa: E731
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4),
                train_loader=one(train_mask), val_loader=one(val_mask), loss_fn=gcn_loss, max_steps=300)


def _gcn_fwd(m, b):
    x, a_hat, y, mask = b
    return m(x, a_hat).argmax(-1)[mask], y[mask]


fix("data_citations_gcn_no_self_loops", fixed_of(citations_gcn_no_self_loops), acc_of(_gcn_fwd),
    "val node accuracy", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# 4. Fruit ripeness: training images read with OpenCV (BGR), validation images with PIL (RGB).

FRUIT_RGB = np.array([[200, 40, 40], [40, 50, 200], [230, 140, 30], [30, 150, 190], [60, 180, 60]], dtype=np.float32)


def _fruit_rgb(n: int, s: int):
    """uint8 HWC RGB photos (16x16) of five colour classes: red, blue, orange, teal, green."""
    g = np.random.default_rng(s)
    y = g.integers(0, 5, size=n)
    img = FRUIT_RGB[y][:, None, None, :] + g.normal(0, 25, size=(n, 16, 16, 3))
    return np.clip(img, 0, 255).astype(np.uint8), y


def to_tensor(hwc_uint8: np.ndarray) -> torch.Tensor:         # transforms.ToTensor on a batch
    return torch.tensor(np.ascontiguousarray(hwc_uint8), dtype=torch.float32).permute(0, 3, 1, 2) / 255.0


def fruit_cnn():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))


@case("data_fruit_bgr_train_rgb_val", "data",
      bug="The training images are loaded with cv2.imread, which returns BGR, while the validation images are loaded "
          "with PIL in RGB, so the model learns red and blue swapped: red fruit look like blue ones and orange like "
          "teal at validation time.",
      fix_line="Convert the OpenCV images to RGB: img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB) (img[..., ::-1]).",
      source="https://troubles-factory.com/cases/2026-06-18-01-rgb-bgr-normalization-train-inference-mismatch/",
      cause_pattern=r"\bBGR\b|cvtColor|COLOR_BGR2RGB|channel order.{0,100}(differ|swap|revers|mismatch|inconsistent)|"
                    r"(red|\bR\b) and (blue|\bB\b) (channels )?(are )?(swapped|reversed)|(swap|revers)\w*.{0,60}"
                    r"(colou?r )?channels",
      paraphrases=("Training images come from cv2.imread in BGR order but validation images are RGB from PIL; convert "
                   "with cv2.cvtColor(img, cv2.COLOR_BGR2RGB).",
                   "The colour channel order differs between the training and validation pipelines: red and blue are "
                   "swapped in one of them."))
def fruit_bgr_train_rgb_val(fixed: bool = False) -> dict:
    seed(0)
    rgb_train, yt = _fruit_rgb(1500, 28)
    rgb_val, yv = _fruit_rgb(400, 29)
    cv2_train = rgb_train[..., ::-1]                   # what cv2.imread gives for the training folder
    train_imgs = cv2_train[..., ::-1] if fixed else cv2_train
    model = fruit_cnn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(to_tensor(train_imgs), torch.tensor(yt)), 32),
                val_loader=loader(TensorDataset(to_tensor(rgb_val), torch.tensor(yv)), 100, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("data_fruit_bgr_train_rgb_val", fixed_of(fruit_bgr_train_rgb_val),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# 5. Land cover: a table exported class by class, split 80/20 by row order without shuffling first.

COVER_SIZES = [900, 700, 500, 250, 150]                # water, forest, crop, urban, bare


def _landcover_sorted(s: int):
    g = gen(s)
    means = torch.randn(5, 10, generator=g)
    x = torch.cat([means[c] + 0.6 * torch.randn(k, 10, generator=g) for c, k in enumerate(COVER_SIZES)])
    y = torch.cat([torch.full((k,), c) for c, k in enumerate(COVER_SIZES)])
    return x, y                                          # rows in class order, as exported


@case("data_landcover_sorted_split", "data",
      bug="The pixel table is sorted by class (exported class by class) and split 80/20 by row position without "
          "shuffling first, so the training part holds only water, forest and most of crop, and urban and bare soil "
          "appear only in validation.",
      fix_line="Shuffle (or stratify) before splitting: perm = torch.randperm(n); x, y = x[perm], y[perm].",
      source="https://datasciencediagnostics.com/diagnostics/procedure/background/shuffle",
      cause_pattern=r"(sorted|ordered|grouped) by (class|label|target).{0,160}(split|first|last|head|tail|rows?)|"
                    r"split\w*.{0,100}\b(before|without)\b.{0,20}shuffl|(shuffl|stratif)\w*.{0,40}before (the )?"
                    r"split|\bclass(es)?\b.{0,80}\b(never|absent|missing)\b.{0,40}\b(in|from)\b.{0,20}\btrain|"
                    r"(absent|missing) from (the )?train|(only|exclusively) in (the )?validation",
      paraphrases=("The data are sorted by class and the split takes the first 80% of rows without shuffling, so "
                   "classes 3 and 4 are missing from the training set.",
                   "Urban and bare soil appear only in validation: shuffle or stratify before splitting."))
def landcover_sorted_split(fixed: bool = False) -> dict:
    seed(0)
    x, y = _landcover_sorted(30)
    if fixed:
        perm = torch.randperm(len(y), generator=gen(31))
        x, y = x[perm], y[perm]
    n_train = int(0.8 * len(y))
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:n_train], y[:n_train]), 64),
                val_loader=loader(TensorDataset(x[n_train:], y[n_train:]), 100, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("data_landcover_sorted_split", fixed_of(landcover_sorted_split),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)
