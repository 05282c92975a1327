"""Set ab, family "data": the pipeline hands the model rows whose meaning is not what training assumes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_ab.registry import (
    auc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
)

# --------------------------------------------------------------------------------------------------------------
# 1. Category codes for the validation rows built from the validation rows' own values (a second "LabelEncoder").
# --------------------------------------------------------------------------------------------------------------

CITIES = [f"city_{c}" for c in "abcdefghijklmnopqrstuvwxy"]


def _rentals(n, s):
    g = gen(s)
    city = [CITIES[i] for i in torch.randint(0, len(CITIES), (n,), generator=g).tolist()]
    level = {c: v for c, v in zip(CITIES, (torch.rand(len(CITIES), generator=g) * 4 - 2).tolist())}
    x = torch.randn(n, 6, generator=g)
    rent = torch.tensor([level[c] for c in city]) + 0.5 * x[:, 0] - 0.3 * x[:, 1] + 0.1 * torch.randn(n, generator=g)
    return city, x, rent


class RentNet(nn.Module):
    def __init__(self, n_cities):
        super().__init__()
        self.city = nn.Embedding(n_cities, 8)
        self.mlp = nn.Sequential(nn.Linear(8 + 6, 48), nn.ReLU(), nn.Linear(48, 1))

    def forward(self, code, x):
        return self.mlp(torch.cat([self.city(code), x], 1))[:, 0]


def category_codes_refit_on_val(fixed=False):
    seed(0)
    city, x, rent = _rentals(3000, 23)
    tr, va = slice(0, 2500), slice(2500, 3000)
    train_vocab = {c: i for i, c in enumerate(sorted(set(city[tr])))}
    if fixed:
        val_vocab = train_vocab
    else:   # the validation frame encoded on its own, in order of first appearance
        val_vocab = {c: i for i, c in enumerate(dict.fromkeys(city[va]))}
    code_tr = torch.tensor([train_vocab[c] for c in city[tr]])
    code_va = torch.tensor([val_vocab[c] for c in city[va]])
    model = RentNet(len(CITIES))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(code_tr, x[tr], rent[tr]), 32),
                val_loader=loader(TensorDataset(code_va, x[va], rent[va]), 100, shuffle=False),
                loss_fn=lambda m, b: F.mse_loss(m(b[0], b[1]), b[2]), max_steps=300)


case("data_category_codes_refit_on_val", "data",
     "The city column of the validation rows is integer-encoded with its own mapping (codes in order of first "
     "appearance in the validation frame) instead of the training vocabulary, so code 3 means one city in training "
     "and another in validation and the learned city embeddings are applied to the wrong cities; encode validation "
     "with the training mapping (fit the encoder once, on train).",
     r"(mapping|vocab\w*|encod\w*|label ?encoder|category codes?) .{0,60}(differ|mismatch|inconsistent|not the same)|"
     r"(fit|built|refit|re-fit|recomput)\w* (separately|on its own|again|independently)|"
     r"(own|separate|second|different|another) (mapping|vocab\w*|encod\w*|label ?encoder)|"
     r"(same|one|single|training) (mapping|vocab\w*|encoder|label ?encoder) for (both|train and val|validation)|"
     r"(train|training) (mapping|vocab\w*|encoder) .{0,40}(val|validation)")(category_codes_refit_on_val)

fix("data_category_codes_refit_on_val", fixed_of(category_codes_refit_on_val),
    rmse_of(lambda m, b: (m(b[0], b[1]), b[2])), "val rent RMSE", steps=300, higher=False)


# --------------------------------------------------------------------------------------------------------------
# 2. An implicit-feedback click model trained on the observed clicks only: every training label is 1.
# --------------------------------------------------------------------------------------------------------------

def _clicks(s):
    g = gen(s)
    taste, style = torch.randn(120, 4, generator=g), torch.randn(150, 4, generator=g)
    affinity = taste @ style.T                                     # (users, items)
    clicked = affinity > 1.2
    return clicked, g


class ClickMF(nn.Module):
    def __init__(self, n_users=120, n_items=150, dim=16):
        super().__init__()
        self.user = nn.Embedding(n_users, dim)
        self.item = nn.Embedding(n_items, dim)
        self.item_b = nn.Embedding(n_items, 1)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)
        nn.init.zeros_(self.item_b.weight)

    def forward(self, pairs):
        u, i = pairs[:, 0], pairs[:, 1]
        return (self.user(u) * self.item(i)).sum(1) + self.item_b(i)[:, 0]


def implicit_positives_only(fixed=False):
    seed(0)
    clicked, g = _clicks(24)
    pos = clicked.nonzero()
    neg = (~clicked).nonzero()
    perm_p = torch.randperm(len(pos), generator=g)
    perm_n = torch.randperm(len(neg), generator=g)
    n_val = len(pos) // 6
    val_pos, tr_pos = pos[perm_p[:n_val]], pos[perm_p[n_val:]]
    val_neg, tr_neg = neg[perm_n[:n_val * 4]], neg[perm_n[n_val * 4:n_val * 4 + len(tr_pos) * 4]]
    if fixed:   # four sampled non-clicks per click
        pairs = torch.cat([tr_pos, tr_neg])
        labels = torch.cat([torch.ones(len(tr_pos)), torch.zeros(len(tr_neg))])
    else:       # "the interaction log": every row is a click
        pairs, labels = tr_pos, torch.ones(len(tr_pos))
    val_pairs = torch.cat([val_pos, val_neg])
    val_labels = torch.cat([torch.ones(len(val_pos)), torch.zeros(len(val_neg))])
    model = ClickMF()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(pairs, labels), 64),
                val_loader=loader(TensorDataset(val_pairs, val_labels), 256, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


case("data_implicit_positives_only", "data",
     "The click model is trained on the interaction log alone, so every training label is 1 (no negative sampling "
     "of non-clicked user-item pairs): BCEWithLogitsLoss is minimised by calling everything a click and the "
     "embeddings never learn which items a user skips; sample non-interacted pairs as 0-labelled negatives.",
     r"negative (sampl|exampl|pair|label)\w*|(only|all) positives?\b|positives?[- ]only|"
     r"(all|every) (training )?(label|target)s? (is|are|equal|==) ?1\b|(no|zero|without) (negative|0|zero)[- ]?"
     r"(label|example|sample|pair)s?|non[- ]?(click|interact)\w*|unobserved (pair|item|interaction)s?|"
     r"interaction log")(implicit_positives_only)

fix("data_implicit_positives_only", fixed_of(implicit_positives_only), auc_of(lambda m, b: (m(b[0]), b[1])),
    "val AUC", steps=300)


# --------------------------------------------------------------------------------------------------------------
# 3. Random horizontal flip on the image, the keypoint's x coordinate left as it was.
# --------------------------------------------------------------------------------------------------------------

W = 16


def _blobs(n, s):
    g = gen(s)
    cx = torch.randint(1, W - 1, (n,), generator=g).float()
    cy = torch.randint(1, W - 1, (n,), generator=g).float()
    grid = torch.arange(W).float()
    img = torch.exp(-((grid[None, None, :] - cx[:, None, None]) ** 2 + (grid[None, :, None] - cy[:, None, None]) ** 2)
                    / 3.0)
    img = img + 0.05 * torch.randn(n, W, W, generator=g)
    return img[:, None], cx


class FlipAugmented(Dataset):
    def __init__(self, images, xs, flip_target: bool):
        self.images, self.xs, self.flip_target = images, xs, flip_target

    def __len__(self):
        return len(self.xs)

    def __getitem__(self, i):
        img, x = self.images[i], self.xs[i]
        if torch.rand(()) < 0.5:
            img = torch.flip(img, dims=[-1])
            if self.flip_target:
                x = (W - 1) - x
        return img, x


class KeypointCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.out = nn.Linear(8 * W * W, 1)

    def forward(self, img):
        return self.out(self.conv(img).flatten(1))[:, 0]


def flip_without_target(fixed=False):
    seed(0)
    img, cx = _blobs(1800, 25)
    model = KeypointCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(FlipAugmented(img[:1500], cx[:1500], flip_target=fixed), 32),
                val_loader=loader(TensorDataset(img[1500:], cx[1500:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


case("data_flip_without_target", "data",
     "The training Dataset flips half the images horizontally (torch.flip on the width axis) but leaves the "
     "keypoint's x coordinate unchanged, so for the same picture the label says x on one draw and the mirrored image "
     "says W-1-x on another: the net learns to predict the middle; mirror the target too (x -> W - 1 - x).",
     r"(flip|mirror)\w*.{0,80}(target|label|coordinate|keypoint|x\b)|(target|label|coordinate|keypoint)s?.{0,60}"
     r"(not|never|un)[- ]?(flipped|mirrored|transformed|updated)|w ?- ?1 ?- ?x|augment\w*.{0,60}(target|label)s? "
     r"(unchanged|not (changed|adjusted|updated))")(flip_without_target)

fix("data_flip_without_target", fixed_of(flip_without_target), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val x RMSE (pixels)", steps=300, higher=False)


# --------------------------------------------------------------------------------------------------------------
# 4. Feature scaling with a row-wise L2 normalize (sklearn.preprocessing.normalize's default axis=1).
# --------------------------------------------------------------------------------------------------------------

def normalize(x, axis=1):
    """What sklearn.preprocessing.normalize(x) does by default: each ROW scaled to unit L2 norm."""
    return x / x.norm(dim=axis, keepdim=True).clamp_min(1e-12)


def _invoices(n, s):
    g = gen(s)
    amounts = torch.rand(n, 8, generator=g) * torch.tensor([100, 50, 20, 10, 5, 300, 80, 40.0])
    fee = 0.01 * amounts[:, 0] + 0.03 * amounts[:, 5] + 0.05 * amounts[:, 2] + 0.1 * torch.randn(n, generator=g)
    return amounts, fee


def rowwise_normalize(fixed=False):
    seed(0)
    x, y = _invoices(2500, 26)
    if fixed:   # StandardScaler: per column, statistics from the training rows
        mu, sd = x[:2000].mean(0), x[:2000].std(0)
        xs = (x - mu) / sd
    else:
        xs = normalize(x)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xs[:2000], y[:2000, None]), 32),
                val_loader=loader(TensorDataset(xs[2000:], y[2000:, None]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


case("data_rowwise_normalize", "data",
     "The features are 'scaled' with sklearn.preprocessing.normalize, which by default (axis=1) divides each ROW by "
     "its L2 norm, so every invoice becomes a unit vector and the absolute amounts the fee depends on are erased; "
     "standardise per column (StandardScaler: mean and std per feature over the training rows).",
     r"row[- ]?wise (l2 )?(normali|scal)\w*|(normali[sz]\w*|scal\w*) (each|every|per) (row|sample|example)|"
     r"each (row|sample|example|invoice) (is )?(scaled|normali[sz]ed|divided)|axis ?= ?1|unit (l2 )?norm|"
     r"(l2|euclidean)[- ]norm\w* (of |per |each )(row|sample)|\bnormalize\(|"
     r"(row|sample) norms? (are |is )?(all )?(1|one|constant)")(rowwise_normalize)

fix("data_rowwise_normalize", fixed_of(rowwise_normalize), rmse_of(lambda m, b: (m(b[0]), b[1])), "val fee RMSE",
    steps=300, higher=False)


# --------------------------------------------------------------------------------------------------------------
# 5. Multi-task assay labels with most entries missing: NaN filled with 0 and trained as negatives.
# --------------------------------------------------------------------------------------------------------------

def _assays(n, s):
    g = gen(s)
    x = torch.randn(n, 24, generator=g)
    w = torch.randn(24, 5, generator=g)
    y = ((x @ w) > 0).float()                        # 5 assays, about half positive each
    missing = torch.rand(n, 5, generator=g) < 0.7    # 70% of the measurements were never run
    return x, torch.where(missing, torch.full_like(y, float("nan")), y)


def missing_labels_as_zero(fixed=False):
    seed(0)
    x, y = _assays(3000, 27)
    y_train = y[:2500] if fixed else torch.nan_to_num(y[:2500], nan=0.0)    # "fillna(0)"
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 5))

    def loss_fn(model, batch):
        xb, yb = batch
        logits = model(xb)
        known = ~torch.isnan(yb)
        return F.binary_cross_entropy_with_logits(logits[known], yb[known])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2500], y_train), 32),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 100, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


case("data_missing_labels_as_zero", "data",
     "70% of the multi-task assay labels are missing (NaN) and were filled with 0 before training, so every "
     "unmeasured assay is taught as a confirmed negative: the heads learn that positives are rare and call most real "
     "positives negative; keep the NaNs and mask missing entries out of the loss.",
     r"missing (label|target|entr|measurement|assay)|nan (label|target)s?|(label|target)s? .{0,20}\bnan\b|fillna|"
     r"nan_to_num|(mask|ignore|exclude|skip)\w* .{0,40}"
     r"(missing|unknown|unlabell?ed|unmeasured)|(unmeasured|unknown|unlabell?ed) .{0,40}(as|treated as) "
     r"(negative|0|zero)|(filled|imputed|replaced) (with|by) (0|zero)")(missing_labels_as_zero)


@torch.no_grad()
def _known_acc(model, kw):
    def fn(m, b):
        xb, yb = b
        known = ~torch.isnan(yb)
        return (((m(xb) > 0).float() == yb) & known).sum().item(), known.sum().item()
    return mean_over(model, kw["val_loader"], fn)


fix("data_missing_labels_as_zero", fixed_of(missing_labels_as_zero), _known_acc,
    "val accuracy on measured assays", steps=300)
