"""Set h, family 'targets': what the loss is asked to fit."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_h.registry import case, fix, gen, loader, seed, val_acc

# --------------------------------------------------------------------------------------------------------------
# T1: Hadsell contrastive loss written for y=1 'dissimilar', dataset y=1 'same product'


def product_pairs(n, s):
    g = gen(s)
    protos = torch.randn(30, 24, generator=gen(31))
    a_id = torch.randint(0, 30, (n,), generator=g)
    same = torch.rand(n, generator=g) < 0.5
    b_id = torch.where(same, a_id, (a_id + torch.randint(1, 30, (n,), generator=g)) % 30)
    a = protos[a_id] + 0.8 * torch.randn(n, 24, generator=g)
    b = protos[b_id] + 0.8 * torch.randn(n, 24, generator=g)
    return a, b, same.float()                             # 1 = the same product


def hadsell(tutorial_convention: bool, margin: float = 2.0):
    def loss_fn(model, batch):
        a, b, y = batch
        d = F.pairwise_distance(model(a), model(b))
        if tutorial_convention:                           # tutorial: y = 1 means 'dissimilar'
            return ((1 - y) * d.pow(2) + y * (margin - d).clamp(min=0).pow(2)).mean()
        return (y * d.pow(2) + (1 - y) * (margin - d).clamp(min=0).pow(2)).mean()
    return loss_fn


def _pairs(tutorial=True):
    seed(0)
    a, b, y = product_pairs(2048, 32)
    va, vb, vy = product_pairs(512, 33)
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 8))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(a, b, y), 64), val_loader=loader(TensorDataset(va, vb, vy), 128, shuffle=False),
                loss_fn=hadsell(tutorial), max_steps=300)


@torch.no_grad()
def pair_acc(model, kw):
    a, b, y = product_pairs(512, 33)
    return ((F.pairwise_distance(model(a), model(b)) < 1.0).float() == y).float().mean().item()


@case("product_pairs_contrastive_loss_label_convention_inverted", "targets",
      bug="the contrastive loss is copied from a tutorial where y = 1 marks a DISSIMILAR pair "
          "((1 - y) * d^2 + y * max(0, m - d)^2), but this dataset's y = 1 means 'same product': matching pairs are "
          "pushed beyond the margin and different products pulled together, the similarity learned backwards",
      cause_pattern=(r"(label|target|y)s?.{0,40}(convention|meaning|semantic|inverted|flipped|swapped|reversed|opposite)|"
                    r"(1|one) (means|marks|for) (a )?(dis)?similar|(similar|same|dissimilar|matching) pairs?.{0,60}"
                    r"(pushed|pulled|apart|together)"))
def product_pairs_contrastive_loss_label_convention_inverted():
    return _pairs(True)


fix("product_pairs_contrastive_loss_label_convention_inverted", lambda: _pairs(False), pair_acc,
    "val pair verification accuracy")

# --------------------------------------------------------------------------------------------------------------
# T2: BCEWithLogitsLoss(pos_weight = n_pos / n_neg)


def transactions(n, s):
    g = gen(s)
    x = torch.randn(n, 12, generator=g)
    w = torch.randn(12, generator=gen(41))
    score = x @ w / 12 ** 0.5 + 0.6 * torch.randn(n, generator=g)
    return x, (score > 1.75).float()                   # ~4% fraud


def _fraud(inverted=True):
    seed(0)
    x, y = transactions(4096, 42)
    vx, vy = transactions(1024, 43)
    n_pos, n_neg = y.sum(), (1 - y).sum()
    pos_weight = n_pos / n_neg if inverted else n_neg / n_pos
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=pos_weight.reshape(1)), max_steps=300)


@torch.no_grad()
def balanced_acc(model, kw):
    x, y = transactions(1024, 43)
    pred = (model(x) > 0).float()
    return 0.5 * ((pred[y == 1] == 1).float().mean() + (pred[y == 0] == 0).float().mean()).item()


@case("fraud_bce_pos_weight_ratio_inverted", "targets",
      bug="the class-imbalance correction is BCEWithLogitsLoss(pos_weight=n_pos / n_neg), the ratio upside down: "
          "the ~4% fraud rows get weight ~0.04 instead of ~24, so the rare class is down-weighted further and the "
          "model learns to call everything legitimate; pos_weight must be n_negative / n_positive",
      cause_pattern=r"pos_weight|n_neg\w* ?/ ?n_pos|neg(ative)?s? ?/ ?pos(itive)?s?|(ratio|weight)s?.{0,40}(invert|upside|"
                    r"reciprocal|backwards|wrong way)|down-?weigh\w*.{0,40}(minority|rare|positive)")
def fraud_bce_pos_weight_ratio_inverted():
    return _fraud(True)


fix("fraud_bce_pos_weight_ratio_inverted", lambda: _fraud(False), balanced_acc, "val balanced accuracy",
    fact=lambda: print("  fact: train positives", int(transactions(4096, 42)[1].sum()), "of 4096"))

# --------------------------------------------------------------------------------------------------------------
# T3: per-sample weights multiplied onto an already-averaged loss


def annotated(n, s):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    true = (x @ torch.randn(10, 4, generator=gen(51))).argmax(1)
    weak = torch.rand(n, generator=g) < 0.6            # annotator 7's rows: label map off by one
    y = torch.where(weak, (true + 1) % 4, true)
    return x, y, (~weak).float(), true


def weighted_ce(per_sample: bool):
    ce = nn.CrossEntropyLoss(reduction="none" if per_sample else "mean")

    def loss_fn(model, batch):
        x, y, w = batch
        loss = ce(model(x), y)
        if per_sample:
            return (loss * w).sum() / w.sum().clamp(min=1.0)
        return (loss * w).mean()
    return loss_fn


def _weak(per_sample=False):
    seed(0)
    x, y, w, _ = annotated(4096, 52)
    vx, _, _, vt = annotated(512, 53)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y, w), 64),
                val_loader=loader(TensorDataset(vx, vt), 256, shuffle=False), loss_fn=weighted_ce(per_sample),
                max_steps=300)


@case("annotations_sample_weights_applied_to_mean_reduced_loss", "targets",
      bug="the per-sample weights (0 for the rows of an annotator with an off-by-one label map) multiply the "
          "output of CrossEntropyLoss() with its default reduction='mean', a scalar: (loss * w).mean() is just the "
          "batch loss times the mean weight, so the zero-weighted rows (60% of the data) are trained on as much as "
          "the others and the model learns their shifted labels; reduction='none' is needed before weighting",
      cause_pattern=(r"reduction ?= ?['\"]?none|(sample|per-sample|instance)[ -]?weights?.{0,80}(ignored|no effect|"
                    r"scalar|already (averaged|reduced)|mean)|(already|mean-)(averaged|reduced)|weights? (are|is) "
                    r"(silently )?(ignored|lost)"))
def annotations_sample_weights_applied_to_mean_reduced_loss():
    return _weak(False)


fix("annotations_sample_weights_applied_to_mean_reduced_loss", lambda: _weak(True), val_acc,
    "val accuracy (true labels)")

# --------------------------------------------------------------------------------------------------------------
# T4: two review sources with opposite label coding concatenated


def reviews(n, s, flip_b: bool):
    g = gen(s)
    pos_words, neg_words = torch.arange(2, 12), torch.arange(12, 22)
    sentiment = torch.randint(0, 2, (n,), generator=g)        # 1 = positive
    x = torch.randint(22, 200, (n, 20), generator=g)
    for k in range(3):
        word = torch.where(sentiment == 1, pos_words[torch.randint(0, 10, (n,), generator=g)],
                           neg_words[torch.randint(0, 10, (n,), generator=g)])
        x[torch.arange(n), torch.randint(0, 20, (n,), generator=g)] = word
    from_b = torch.arange(n) % 2 == 1                          # source B: 'is_complaint' (1 = negative)
    y = torch.where(from_b & flip_b, 1 - sentiment, sentiment)
    return x, y


class BagOfWords(nn.Module):
    def __init__(self, vocab=200):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, 32, mode="mean")
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x):
        return self.head(self.bag(x))


def _merged(flip=True):
    seed(0)
    xa, ya = reviews(1024, 61, flip_b=False)[0][::2], reviews(1024, 61, flip_b=False)[1][::2]
    xb, yb_raw = reviews(1024, 61, flip_b=True)[0][1::2], reviews(1024, 61, flip_b=True)[1][1::2]
    yb = yb_raw if flip else 1 - yb_raw           # the fix: recode source B to 1 = positive
    x, y = torch.cat([xa, xb]), torch.cat([ya, yb])
    vx, vy = reviews(512, 62, flip_b=False)
    model = BagOfWords()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("reviews_two_sources_with_opposite_label_coding_merged", "targets",
      bug="the training set concatenates two review exports whose binary labels mean opposite things (source A: "
          "1 = positive; source B's 'is_complaint': 1 = negative) without recoding one of them: the same sentiment "
          "words carry label 1 in half the rows and 0 in the other half, so the labels cancel out",
      cause_pattern=(r"(two|both|second|different|merged|concatenat\w*) (sources|exports|datasets)|label (coding|encoding|"
                    r"convention|meaning|polarit)|(labels?|polarity|coding).{0,40}(opposite|flipped|inverted)|"
                    r"opposite (label|meaning|coding|polarity)|is_complaint|recod|contradict\w* labels|"
                    r"(same|identical) (inputs?|words?|features?).{0,60}(different|opposite|both) labels"))
def reviews_two_sources_with_opposite_label_coding_merged():
    return _merged(True)


fix("reviews_two_sources_with_opposite_label_coding_merged", lambda: _merged(False), val_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# T5: COCO-style xywh box targets for an xyxy head


def sprites(n, s):
    g = gen(s)
    x1 = torch.randint(0, 8, (n,), generator=g)
    y1 = torch.randint(0, 8, (n,), generator=g)
    w = torch.randint(4, 9, (n,), generator=g)
    h = torch.randint(4, 9, (n,), generator=g)
    img = torch.zeros(n, 1, 16, 16)
    for i in range(n):
        img[i, 0, y1[i]:y1[i] + h[i], x1[i]:x1[i] + w[i]] = 1.0
    img += 0.1 * torch.randn(n, 1, 16, 16, generator=g)
    xywh = torch.stack([x1, y1, w, h], 1).float() / 16
    return img, xywh


class BoxNet(nn.Module):
    """Predicts (x1, y1, x2, y2) in [0, 1]: decode_boxes() and the IoU evaluation read it that way."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                 nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return self.net(x)


def _boxes(convert=False):
    seed(0)
    img, xywh = sprites(1536, 71)
    target = torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1) if convert else xywh
    vimg, vxywh = sprites(256, 72)
    model = BoxNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(img, target), 32),
                val_loader=loader(TensorDataset(vimg, vxywh), 64, shuffle=False), loss_fn=nn.SmoothL1Loss(beta=0.05),
                max_steps=300)


@torch.no_grad()
def mean_iou(model, kw):
    img, xywh = sprites(256, 72)
    gt = torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1)
    p = model(img)
    ix = (torch.minimum(p[:, 2], gt[:, 2]) - torch.maximum(p[:, 0], gt[:, 0])).clamp(min=0)
    iy = (torch.minimum(p[:, 3], gt[:, 3]) - torch.maximum(p[:, 1], gt[:, 1])).clamp(min=0)
    inter = ix * iy
    area = lambda b: (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)  # noqa: E731
    return (inter / (area(p) + area(gt) - inter + 1e-6)).mean().item()


@case("sprite_boxes_coco_xywh_targets_for_xyxy_head", "targets",
      bug="the box targets are taken from COCO-style annotations in (x, y, width, height) while the head, its "
          "decoding and the IoU evaluation use (x1, y1, x2, y2): the regression is asked to put width and height "
          "where the far corner belongs, so the decoded boxes are degenerate (x2 < x1 for most sprites)",
      cause_pattern=r"xywh|xyxy|x1, ?y1, ?x2, ?y2|\(x, ?y, ?w(idth)?, ?h(eight)?\)|box (format|convention|encoding|"
                    r"coordinates)|width and height|corner|cxcywh|x2 ?< ?x1")
def sprite_boxes_coco_xywh_targets_for_xyxy_head():
    return _boxes(False)


fix("sprite_boxes_coco_xywh_targets_for_xyxy_head", lambda: _boxes(True), mean_iou, "val IoU (as xyxy)")

# --------------------------------------------------------------------------------------------------------------
# T6: discounted returns accumulated forward in time


def episodes(n_ep, s, forward: bool, gamma=0.9, T=20):
    """Each episode: a context c (the machine's settings) observed in every state with the time fraction t/T;
    the reward r_t = (w . c) * (0.5 + t / T) + noise."""
    g = gen(s)
    w = torch.randn(4, generator=gen(82))
    states, targets = [], []
    for _ in range(n_ep):
        c = torch.randn(4, generator=g)
        rs = [(w @ c).item() * (0.5 + t / T) + 0.1 * torch.randn((), generator=g).item() for t in range(T)]
        ret, G = [0.0] * T, 0.0
        order = range(T) if forward else range(T - 1, -1, -1)
        for t in order:
            G = rs[t] + gamma * G
            ret[t] = G
        states += [torch.cat([c, torch.tensor([t / T])]) for t in range(T)]
        targets += ret
    return torch.stack(states), torch.tensor(targets)


def _returns(forward=True):
    seed(0)
    x, y = episodes(150, 83, forward)
    vx, vy = episodes(40, 84, False)
    model = nn.Sequential(nn.Linear(5, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


@torch.no_grad()
def return_mse(model, kw):
    vx, vy = episodes(40, 84, False)
    return F.mse_loss(model(vx), vy).item()


@case("critic_returns_accumulated_forward_in_time", "targets",
      bug="the value targets are computed with G = r[t] + gamma * G iterating t = 0 .. T-1 (forward), which sums "
          "the discounted rewards already received, not the rewards to come: the critic is fitted to the past of "
          "the episode, which the current state does not determine; the loop must run from the last step backwards",
      cause_pattern=(r"(discounted )?returns? (are |is )?(computed|accumulated|summed).{0,60}(forward|backward|revers|past|order)|"
                    r"reward-to-go|rewards? (to come|already received)|discount\w*.{0,60}(forward|backward|revers|order|past)|"
                    r"reversed\(|range\(T ?- ?1|iterat\w* (from the end|backwards)"))
def critic_returns_accumulated_forward_in_time():
    return _returns(True)


fix("critic_returns_accumulated_forward_in_time", lambda: _returns(False), return_mse, "val MSE to true returns",
    higher=False)
