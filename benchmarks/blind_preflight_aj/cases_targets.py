"""Set aj, family ``targets``: the labels or the target convention do not say what the user means."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aj.registry import acc_of, auc, case, fix, fixed_of, gen, loader, mean_over, seed

# --------------------------------------------------------------------------------------------------------------------
# 1. multi-label sound-event tagging trained with CrossEntropyLoss on multi-hot targets

def tagged_clips(n: int, s: int, d: int = 24, n_tags: int = 8):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, n_tags, generator=g) / d ** 0.5
    y = ((x @ w) * 2.5 + 0.3 * torch.randn(n, n_tags, generator=g) > 1.2).float()
    return x, y


def micro_f1(model, kw) -> float:
    was = model.training
    model.eval()
    tp = fp = fn = 0.0
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            pred = (model(x.to(next(model.parameters()).device)).float().cpu() > 0).float()
            tp += (pred * y).sum().item()
            fp += (pred * (1 - y)).sum().item()
            fn += ((1 - pred) * y).sum().item()
    model.train(was)
    return 2 * tp / max(2 * tp + fp + fn, 1.0)


@case("aj_tagging_ce_on_multihot", "targets",
      bug="A multi-label sound-event tagger (several tags per clip, read with sigmoid > 0.5) is trained with "
          "nn.CrossEntropyLoss on float multi-hot targets: torch takes them as class probabilities, so a softmax "
          "makes the 8 tags compete for one unit of mass and the logits are never calibrated per tag "
          "(BCEWithLogitsLoss is the multi-label loss).",
      cause_pattern=r"multi[- ]?(label|hot)|BCEWithLogits\w*\W.{0,40}(multi|instead|rather|per[- ](tag|label))|"
                    r"(instead of|rather than|not) (nn\.)?CrossEntropy|(class )?probabilit\w+ (targets?|distribution)|"
                    r"soft (labels?|targets?)|(targets?|labels?)\W.{0,60}(sum to|do not sum|more than one|several) "
                    r"(1|one|positive|class|tags?)|sigmoid\W.{0,40}(per|each) (tag|label)|(tags?|labels?) compete")
def tagging_ce_multihot(fixed: bool = False):
    seed(0)
    x, y = tagged_clips(1500, 1)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 8))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(), max_steps=600)


fix("aj_tagging_ce_on_multihot", fixed_of(tagging_ce_multihot), micro_f1, "val micro-F1 (sigmoid > 0.5)", steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 2. siamese device verification: dataset says 1 = same device, the Hadsell contrastive loss says 1 = dissimilar

def device_pairs(n_pairs: int, s: int, n_devices: int = 8, d: int = 16, noise: float = 1.0):
    """Pairs of vibration fingerprints and same_device (1 = same device, 0 = different), half and half."""
    g = gen(s)
    proto = torch.randn(n_devices, d, generator=g) * 1.2
    a = torch.randint(0, n_devices, (n_pairs,), generator=g)
    same = torch.randint(0, 2, (n_pairs,), generator=g)
    other = (a + torch.randint(1, n_devices, (n_pairs,), generator=g)) % n_devices
    b = torch.where(same == 1, a, other)
    x1 = proto[a] + noise * torch.randn(n_pairs, d, generator=g)
    x2 = proto[b] + noise * torch.randn(n_pairs, d, generator=g)
    return x1, x2, same.float()


class FingerprintNet(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x):
        return self.net(x)


def contrastive_loss(flip: bool, margin: float = 2.0):
    def loss_fn(model, batch):
        x1, x2, label = batch
        y = 1 - label if flip else label          # Hadsell et al.: y = 1 for DISSIMILAR pairs
        d = F.pairwise_distance(model(x1), model(x2))
        return ((1 - y) * d.pow(2) + y * (margin - d).clamp(min=0).pow(2)).mean() / 2
    return loss_fn


def verification_auc(model, kw) -> float:
    """ROC AUC of -distance for 'same device' on the validation pairs."""
    was = model.training
    model.eval()
    scores, labels = [], []
    with torch.no_grad():
        for x1, x2, same in kw["val_loader"]:
            dev = next(model.parameters()).device
            scores.append(-F.pairwise_distance(model(x1.to(dev)), model(x2.to(dev))).float().cpu())
            labels.append(same)
    model.train(was)
    return auc(torch.cat(scores), torch.cat(labels))


@case("aj_siamese_label_convention_flipped", "targets",
      bug="The pair Dataset labels same-device pairs 1 and different-device pairs 0, but the contrastive loss is "
          "written as in Hadsell et al., (1 - y) * d^2 + y * max(0, m - d)^2, where y = 1 means DISSIMILAR: same "
          "pairs are pushed apart and different pairs pulled together, an inverted verifier.",
      cause_pattern=r"(label|convention)\w*\W.{0,80}(invert|flip|swap|revers|opposite|1\s*-\s*(y|label))|"
                    r"(invert|flip|swap|revers)\w*\W.{0,60}(label|pair|similar)|1 (means|=|for) (dis)?similar|"
                    r"(dis)?similar pairs?\W.{0,60}(labell?ed|marked|encoded) (as )?[01]|"
                    r"(pushed apart|pulled together)\W.{0,80}(pulled together|pushed apart)")
def siamese_label_flipped(fixed: bool = False):
    seed(0)
    x1, x2, same = device_pairs(2400, 2)
    model = FingerprintNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x1[:2000], x2[:2000], same[:2000]), 32),
                val_loader=loader(TensorDataset(x1[2000:], x2[2000:], same[2000:]), 100, shuffle=False),
                loss_fn=contrastive_loss(flip=fixed), max_steps=600)


fix("aj_siamese_label_convention_flipped", fixed_of(siamese_label_flipped), verification_auc,
    "val verification AUC", steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 3. implicit-feedback recommender trained on the observed clicks only: every label is 1

N_USERS, N_ITEMS = 120, 100


def click_log(s: int, per_user: int = 12):
    """Each user clicks the items closest to their taste (4 latent factors); returns (train, held-out) click pairs."""
    g = gen(s)
    u = torch.randn(N_USERS, 4, generator=g)
    v = torch.randn(N_ITEMS, 4, generator=g)
    score = u @ v.T + 0.5 * torch.randn(N_USERS, N_ITEMS, generator=g)
    top = score.topk(per_user + 3, dim=1).indices
    train = [(a, int(i)) for a in range(N_USERS) for i in top[a, :per_user]]
    held = [(a, int(i)) for a in range(N_USERS) for i in top[a, per_user:]]
    clicked = torch.zeros(N_USERS, N_ITEMS, dtype=torch.bool)
    clicked[torch.arange(N_USERS)[:, None], top] = True
    return train, held, clicked


class GMF(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.user, self.item = nn.Embedding(N_USERS, d), nn.Embedding(N_ITEMS, d)
        self.item_bias, self.bias = nn.Embedding(N_ITEMS, 1), nn.Parameter(torch.zeros(1))
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)
        nn.init.zeros_(self.item_bias.weight)

    def forward(self, users, items):
        return (self.user(users) * self.item(items)).sum(-1) + self.item_bias(items).squeeze(-1) + self.bias


def click_loss(model, batch):
    users, items, label = batch
    return F.binary_cross_entropy_with_logits(model(users, items), label)


_TRAIN_CLICKS, _HELD, _CLICKED = click_log(3)


def heldout_auc(model, kw) -> float:
    """AUC of held-out clicked items against never-clicked items, per user, averaged."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    with torch.no_grad():
        scores = model(torch.arange(N_USERS, device=dev)[:, None], torch.arange(N_ITEMS, device=dev)[None, :]).cpu()
    model.train(was)
    held = torch.zeros(N_USERS, N_ITEMS, dtype=torch.bool)
    for a, i in _HELD:
        held[a, i] = True
    return sum(auc(scores[a][held[a] | ~_CLICKED[a]], held[a][held[a] | ~_CLICKED[a]].float())
               for a in range(N_USERS)) / N_USERS


@case("aj_implicit_positives_only", "targets",
      bug="The implicit-feedback recommender is trained on the click log alone: every (user, item) row has label 1 "
          "and no unclicked items are sampled as negatives, so BCEWithLogits is minimised by predicting 'click' for "
          "every pair (the biases run to +inf) and the scores no longer rank a user's items.",
      cause_pattern=r"negative (sampl\w+|examples?|items?|pairs?)|(no|without) (sampled )?(negatives?|unclicked|unobserved|"
                    r"non-?clicks?)|unclicked|unobserved (items?|pairs?)|implicit[- ]feedback|(sampled|samples?) as "
                    r"negatives|positives? only|only (the )?(positive|observed|clicked)|click log alone")
def implicit_positives_only(fixed: bool = False):
    seed(0)
    g = gen(33)
    rows = [(a, i, 1.0) for a, i in _TRAIN_CLICKS]
    if fixed:
        for a, _ in _TRAIN_CLICKS:                  # 3 sampled unclicked items per click
            for _ in range(3):
                j = int(torch.randint(0, N_ITEMS, (1,), generator=g))
                while _CLICKED[a, j]:
                    j = int(torch.randint(0, N_ITEMS, (1,), generator=g))
                rows.append((a, j, 0.0))
    users = torch.tensor([r[0] for r in rows])
    items = torch.tensor([r[1] for r in rows])
    labels = torch.tensor([r[2] for r in rows])
    model = GMF()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(users, items, labels), 64),
                loss_fn=click_loss, max_steps=500)


fix("aj_implicit_positives_only", fixed_of(implicit_positives_only), heldout_auc, "held-out click AUC", steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 4. activity recognition: ignore_index=0 copied from a padded-tagging tutorial, but 0 is the 'walking' class

def har_features(n: int, s: int, d: int = 30):
    g = gen(s)
    y = torch.multinomial(torch.tensor([0.4, 0.2, 0.2, 0.2]), n, replacement=True, generator=g)
    centers = torch.randn(4, d, generator=g) * 0.9
    return centers[y] + torch.randn(n, d, generator=g), y


@case("aj_har_ignore_index_real_class", "targets",
      bug="nn.CrossEntropyLoss(ignore_index=0) was copied from a sequence-tagging tutorial where 0 was the padding "
          "id, but here label 0 is 'walking', 40% of the windows: every walking window is dropped from the loss and "
          "the model never learns to predict class 0.",
      cause_pattern=r"ignore_index\s*=\s*0|(class|label) 0\W.{0,60}(ignored|dropped|excluded|masked|never)|"
                    r"(ignored|dropped|excluded|masked)\W.{0,40}(class|label) 0|"
                    r"never (predicts?|learns?)\W.{0,30}(class|label) 0|(0|zero) is a real (class|label)")
def har_ignore_index(fixed: bool = False):
    seed(0)
    x, y = har_features(1500, 4)
    model = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss() if fixed else nn.CrossEntropyLoss(ignore_index=0), max_steps=600)


fix("aj_har_ignore_index_real_class", fixed_of(har_ignore_index), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=200)


# --------------------------------------------------------------------------------------------------------------------
# 5. denoising autoencoder on sensor traces scored against the noisy input instead of the clean trace

def sensor_traces(n: int, s: int, d: int = 32, noise: float = 0.5):
    g = gen(s)
    t = torch.linspace(0, 1, d)
    basis = torch.stack([torch.sin(2 * torch.pi * f * t + p) for f, p in ((1, 0.0), (2, 1.0), (3, 2.0))])
    clean = torch.randn(n, 3, generator=g) @ basis
    return clean + noise * torch.randn(n, d, generator=g), clean


class TraceDAE(nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, d))

    def forward(self, x):
        return self.net(x)


def dae_loss(target_clean: bool):
    def loss_fn(model, batch):
        noisy, clean = batch
        return F.mse_loss(model(noisy), clean if target_clean else noisy)
    return loss_fn


@case("aj_dae_target_is_noisy_input", "targets",
      bug="The denoising autoencoder's Dataset yields (noisy, clean) but the loss compares the reconstruction with "
          "the noisy input, F.mse_loss(model(noisy), noisy): an over-complete network learns the identity and "
          "reproduces the noise instead of removing it.",
      cause_pattern=r"(target|compar\w+|loss)\W.{0,60}(noisy|corrupted) (input|version|copy|batch)|"
                    r"(noisy|corrupted) (input|version)\W.{0,40}(as|is) (the )?target|"
                    r"clean (target|signal|trace|version)|identity (mapping|function)|"
                    r"(input|target)s? (is|are) (the same|identical)|reconstruct\w* (the )?(noise|noisy)")
def dae_noisy_target(fixed: bool = False):
    seed(0)
    noisy, clean = sensor_traces(1500, 5)
    model = TraceDAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(noisy[:1200], clean[:1200]), 32),
                val_loader=loader(TensorDataset(noisy[1200:], clean[1200:]), 100, shuffle=False),
                loss_fn=dae_loss(target_clean=fixed), max_steps=800)


def clean_rmse(model, kw) -> float:
    def fn(m, b):
        noisy, clean = b
        p = m(noisy.to(next(m.parameters()).device)).float().cpu()
        return ((p - clean) ** 2).sum().item(), clean.numel()
    return mean_over(model, kw["val_loader"], fn) ** 0.5


fix("aj_dae_target_is_noisy_input", fixed_of(dae_noisy_target), clean_rmse, "val RMSE to the clean trace",
    steps=400, higher=False)
