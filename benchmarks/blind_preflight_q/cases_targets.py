"""Set q, family "targets": the objective does not measure what the user thinks (label encoding, loss form)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_q.registry import broken, loader, rng, seed

# ---------------------------------------------------------------------------------------------------------------
# 1. Skin-lesion segmentation: 0/255 PNG masks fed to BCEWithLogitsLoss.


def lesion_scans(n: int, s: int, size: int = 16):
    """Grey dermoscopy crops (n, 1, 16, 16) with one round lesion; masks as loaded from PNG: uint8 0 / 255."""
    g = rng(s)
    yy, xx = np.mgrid[:size, :size]
    imgs = g.normal(0.25, 0.1, size=(n, 1, size, size)).astype(np.float32)
    masks = np.zeros((n, 1, size, size), np.uint8)
    for i in range(n):
        cy, cx, r = g.uniform(3, size - 3), g.uniform(3, size - 3), g.uniform(1.8, 4.0)
        disk = (yy - cy) ** 2 + (xx - cx) ** 2 <= r ** 2
        imgs[i, 0][disk] += 0.45
        masks[i, 0][disk] = 255
    return torch.from_numpy(imgs), torch.from_numpy(masks)


class TinyFCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                 nn.ReLU(), nn.Conv2d(16, 1, 1))

    def forward(self, x):
        return self.net(x)  # logits


@broken("lesion_mask_255_bce", "targets",
        "The binary lesion masks are read from PNG as 0/255 and passed to BCEWithLogitsLoss unscaled: a target of "
        "255 makes the loss unbounded below (it goes negative) and drives every logit up, so the model paints the "
        "whole crop as lesion.",
        "mask = mask.float() / 255.0",
        "https://github.com/milesial/Pytorch-UNet/issues/84",
        r"255|targets? .{0,40}(outside|out of|above|beyond|not in|exceed\w*) .{0,20}\[0, ?1\]|(mask|target)s? "
        r"(values )?(are |is )?(not |aren't )?(binary|in \{0, ?1\}|0/1)|(mask|target)s? .{0,30}(not|never) "
        r"(scaled|normali[sz]ed|divided)")
def lesion_mask_255_bce(fixed: bool = False):
    seed(10)
    imgs, masks = lesion_scans(900, 61)
    masks = masks.float() / 255.0 if fixed else masks.float()
    model = TinyFCN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(imgs[:700], masks[:700]), 32),
                val_loader=loader(TensorDataset(imgs[700:], masks[700:]), 100, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=250)


# ---------------------------------------------------------------------------------------------------------------
# 2. News topic classifier: nn.NLLLoss on raw logits.


def news_bow(n: int, s: int, vocab: int = 300, topics: int = 4):
    """Term-frequency bag-of-words (n, 300) for 4 topics of unequal size (45/30/15/10 %)."""
    g = rng(s)
    labels = g.choice(topics, size=n, p=[0.45, 0.30, 0.15, 0.10])
    topic_words = g.permutation(vocab)[:topics * 25].reshape(topics, 25)
    x = np.zeros((n, vocab), np.float32)
    for i in range(n):
        words = np.where(g.random(40) < 0.3, g.choice(topic_words[labels[i]], 40), g.integers(0, vocab, 40))
        np.add.at(x[i], words, 1.0)
    return torch.from_numpy(x / 40.0), torch.from_numpy(labels)


@broken("news_nllloss_raw_logits", "targets",
        "nn.NLLLoss is given the classifier's raw logits (the model has no log_softmax), so the loss is just minus "
        "the true-class logit: it goes negative without bound, the logits blow up and the predicted probabilities "
        "are meaningless.",
        "loss_fn=nn.CrossEntropyLoss()",
        "https://runebook.dev/en/docs/pytorch/generated/torch.nn.nllloss/torch.nn.NLLLoss",
        r"nllloss|nll_loss|log_?softmax|log[- ]probabilit|cross_?entropy ?loss.{0,60}(instead|rather)|(expects|wants|"
        r"needs|takes) log[- ]?prob")
def news_nllloss_raw_logits(fixed: bool = False):
    seed(11)
    x, y = news_bow(2400, 71)
    model = nn.Sequential(nn.Linear(300, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:1800], y[:1800]), 32),
                val_loader=loader(TensorDataset(x[1800:], y[1800:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss() if fixed else nn.NLLLoss(), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 3. Signature verification (Siamese): contrastive loss written for y=0 'similar', pairs labelled 1 'genuine'.


def signature_pairs(n: int, s: int, writers: int = 40, dim: int = 20):
    """Pairs of pen-trajectory feature vectors; y = 1 for two signatures of the same writer, 0 otherwise."""
    g = rng(s)
    protos = g.normal(size=(writers, dim))
    a = g.integers(0, writers, size=n)
    same = g.random(n) < 0.5
    b = np.where(same, a, (a + g.integers(1, writers, size=n)) % writers)
    x1 = protos[a] + 0.45 * g.normal(size=(n, dim))
    x2 = protos[b] + 0.45 * g.normal(size=(n, dim))
    t = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    return t(x1), t(x2), t(same.astype(np.float32))


class SignatureEmbedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x):
        return self.net(x)


class ContrastiveLoss:
    """Hadsell, Chopra & LeCun (2006): L = (1 - Y) * D^2 + Y * max(0, m - D)^2, with Y = 0 for similar pairs."""

    def __init__(self, margin: float = 1.0, fixed: bool = False):
        self.margin, self.fixed = margin, fixed

    def __call__(self, model, batch):
        x1, x2, y = batch
        if self.fixed:
            y = 1 - y  # our pairs: 1 = genuine
        d = F.pairwise_distance(model(x1), model(x2))
        return ((1 - y) * d.pow(2) + y * F.relu(self.margin - d).pow(2)).mean()


@broken("signature_contrastive_label_flipped", "targets",
        "The contrastive loss is the paper's (1 - y) * d^2 + y * max(0, m - d)^2, which expects y = 0 for a "
        "similar pair, but the pair dataset labels genuine pairs y = 1: genuine pairs are pushed apart and pairs of "
        "different writers pulled together.",
        "y = 1 - y  # paper convention: 0 = similar pair",
        "https://github.com/keras-team/keras/issues/16935",
        r"(label|y)s? (convention|meaning|semantics|encoding) (is |are )?(inverted|reversed|flipped|swapped|"
        r"opposite)|(similar|genuine|matching|same[- ]writer|positive) (pairs? )?.{0,60}(pushed apart|repelled|"
        r"separated|far apart|label(l)?ed (1|one)|y ?= ?1)|1 ?- ?y|y ?= ?0 (for|means) (a )?(similar|genuine|"
        r"matching|same)|(swap|flip|invert) (the )?(pair )?labels|(dissimilar|different|negative) (pairs? )?.{0,40}"
        r"(pulled together|attracted)")
def signature_contrastive_label_flipped(fixed: bool = False):
    seed(12)
    x1, x2, y = signature_pairs(4000, 81)
    model = SignatureEmbedder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x1[:3000], x2[:3000], y[:3000]), 64),
                val_loader=loader(TensorDataset(x1[3000:], x2[3000:], y[3000:]), 250, shuffle=False),
                loss_fn=ContrastiveLoss(margin=1.0, fixed=fixed), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 4. Building heating load: a ReLU on the output of a regression on standardized targets.


def heating_load(n: int, s: int):
    """8 building descriptors (standardized) -> heating load, standardized (about half the targets negative)."""
    g = rng(s)
    x = g.normal(size=(n, 8))
    w = g.normal(size=8) / np.sqrt(8)
    y = 2.0 * np.tanh(x @ w) + 0.4 * x[:, 0] * x[:, 1] + 0.1 * g.normal(size=n)
    y = (y - y.mean()) / y.std()
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y[:, None], dtype=torch.float32)


def heating_mlp(output_relu: bool) -> nn.Module:
    layers = [nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)]
    if output_relu:
        layers.append(nn.ReLU())  # "a load is never negative"
    return nn.Sequential(*layers)


@broken("heat_load_relu_output", "targets",
        "The regression network ends in nn.ReLU() ('a load is never negative') but it is trained on standardized "
        "targets, about half of them negative: the model cannot output a negative value and the output units with "
        "negative pre-activation receive no gradient.",
        "drop the final nn.ReLU() from the nn.Sequential",
        "https://math.techqa.club/are-relu-a-very-bad-choice-as-last-layer-for-regression-4483706",
        r"relu.{0,80}(output|final|last|head)|(output|final|last|head).{0,80}relu|(cannot|can't|never|unable to) "
        r"(output|predict|produce|reach) (a |any )?negative|negative (targets|values|labels).{0,80}(relu|"
        r"non-?negative)|non-?negative (outputs?|predictions?).{0,80}negative")
def heat_load_relu_output(fixed: bool = False):
    seed(13)
    x, y = heating_load(2000, 91)
    model = heating_mlp(output_relu=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 64),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 250, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 5. Music auto-tagging: multi-hot tags trained with CrossEntropyLoss, read with sigmoid > 0.5.


def music_clips(n: int, s: int, dim: int = 40, tags: int = 8):
    """Clip embeddings (n, 40) and multi-hot tag vectors (0 to 3 tags per clip, e.g. 'guitar', 'vocals', 'live';
    about a third of the clips carry none of the 8 tags)."""
    g = rng(s)
    protos = g.normal(size=(tags, dim))
    y = np.zeros((n, tags), np.float32)
    for i in range(n):
        k = 0 if g.random() < 0.35 else g.integers(1, 4)
        y[i, g.choice(tags, size=k, replace=False)] = 1.0
    x = y @ protos + 0.8 * g.normal(size=(n, dim))
    return torch.tensor(x, dtype=torch.float32), torch.from_numpy(y)


def tagger() -> nn.Module:
    return nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 8))


@broken("music_tags_multilabel_ce", "targets",
        "Multi-hot tag vectors (0 to 3 tags per clip) are trained with nn.CrossEntropyLoss, a softmax over the 8 tags "
        "that makes them compete as one distribution, while tags are read as independent sigmoid(logit) > 0.5: "
        "multi-label targets need BCEWithLogitsLoss.",
        "loss_fn=nn.BCEWithLogitsLoss()",
        "https://discuss.pytorch.org/t/using-bcewithlogisloss-for-multi-label-classification/67011",
        r"multi-?label|multi-?hot|(independent|per-?(label|tag|class)) (sigmoid|binary)|softmax .{0,60}(tags|labels|"
        r"classes) (compete|sum to (1|one)|are (mutually )?exclusive)|(more than one|several|multiple) (labels|tags|"
        r"classes|positives) per (sample|clip|row|example)|(targets?|rows) (that )?sum to (more than|>) ?(1|one)")
def music_tags_multilabel_ce(fixed: bool = False):
    seed(14)
    x, y = music_clips(2400, 101)
    model = tagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1800], y[:1800]), 64),
                val_loader=loader(TensorDataset(x[1800:], y[1800:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(), max_steps=300)
