"""Set l, family targets: labels or targets that do not mean what the loss takes them to mean."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from transformers import BertConfig, BertForTokenClassification

from benchmarks.blind_preflight_l.registry import (
    acc_of,
    auc,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
)

# --------------------------------------------------------------------------------------------------------------------
# A siamese speaker-verification net with a contrastive loss written as in Hadsell et al.


def _speaker_pairs(n: int, s: int, similar_label: int, protos: torch.Tensor):
    g = gen(s)
    spk = protos.size(0)
    a = torch.randint(0, spk, (n,), generator=g)
    same = torch.rand(n, generator=g) < 0.5
    b = torch.where(same, a, (a + torch.randint(1, spk, (n,), generator=g)) % spk)
    noise = lambda: 0.8 * torch.randn(n, protos.size(1), generator=g)  # noqa: E731
    x1, x2 = protos[a] + noise(), protos[b] + noise()
    label = torch.where(same, torch.full((n,), similar_label), torch.full((n,), 1 - similar_label)).float()
    return x1, x2, label


def contrastive_loss(model, batch, margin: float = 2.0):
    x1, x2, y = batch
    d = F.pairwise_distance(model(x1), model(x2))
    # Hadsell, Chopra & LeCun (2006): y = 0 for a similar pair, y = 1 for a dissimilar one
    return ((1 - y) * d.pow(2) + y * F.relu(margin - d).pow(2)).mean() / 2


@case("targets_contrastive_pair_labels_inverted", "targets",
      bug="The pairs are labelled 1 for the same speaker and 0 for different speakers (the Keras siamese example's "
          "convention), but the contrastive loss follows Hadsell et al., where y = 0 marks a similar pair: the loss "
          "pulls different speakers together and pushes recordings of the same speaker apart.",
      cause_pattern=r"(label|y)\w* .{0,40}(invert|flip|swap|revers|opposite)|(invert|flip|swap|revers)\w* .{0,40}"
                    r"(label|pair|convention)|y ?= ?0 .{0,40}(similar|same)|(similar|same)[\w ]{0,20}(pairs? )?"
                    r"(should be|must be|are|is) (labell?ed )?0|1 ?- ?(y|label)|convention")
def contrastive(fixed: bool = False):
    seed(0)
    protos = 1.2 * torch.randn(40, 24, generator=gen(10))
    similar = 0 if fixed else 1
    x1, x2, y = _speaker_pairs(4096, 11, similar, protos)
    vx1, vx2, vy = _speaker_pairs(1024, 12, similar, protos)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x1, x2, y), 64),
                val_loader=DataLoader(TensorDataset(vx1, vx2, vy), 1024), loss_fn=contrastive_loss, max_steps=2000)


def _verification_auc(model, kw):
    protos = 1.2 * torch.randn(40, 24, generator=gen(10))
    x1, x2, y = _speaker_pairs(1024, 12, 1, protos)  # 1: same speaker, whatever the training convention
    with torch.no_grad():
        d = F.pairwise_distance(model(x1), model(x2))
    return auc(-d, y.bool())


fix("targets_contrastive_pair_labels_inverted", fixed_of(contrastive), _verification_auc,
    "verification ROC AUC (closer = same speaker)")

# --------------------------------------------------------------------------------------------------------------------
# Multi-label audio tagging trained with CrossEntropyLoss on multi-hot targets.


def _tags(n: int, s: int):
    g = gen(s)
    w = torch.randn(40, 6, generator=gen(13))
    x = torch.randn(n, 40, generator=g)
    y = ((x @ w) / 40 ** 0.5 + 0.25 * torch.randn(n, 6, generator=g) > 0.55).float()  # 0 to 6 tags a clip
    return x, y


def _micro_f1(model, kw):
    tp = fp = fn_ = 0.0
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            p = (torch.sigmoid(model(x)) > 0.5).float()
            tp += (p * y).sum().item()
            fp += (p * (1 - y)).sum().item()
            fn_ += ((1 - p) * y).sum().item()
    return 2 * tp / max(2 * tp + fp + fn_, 1.0)


@case("targets_multilabel_with_cross_entropy", "targets",
      bug="The tagger is multi-label (a clip has zero to six tags, multi-hot float targets) but is trained with "
          "nn.CrossEntropyLoss, which reads the multi-hot rows as one class-probability distribution over a softmax: "
          "the tags compete with each other, a clip with no tag gives no signal, and the independent per-tag "
          "probabilities the sigmoid thresholding needs are never learned (use BCEWithLogitsLoss).",
      cause_pattern=r"multi-?label|multi-?hot|softmax.{0,60}(compet|mutually|sum to one|one class)|"
                    r"(mutually exclusive|single-label|one class per)")
def multilabel_ce(fixed: bool = False):
    seed(0)
    x, y = _tags(3072, 14)
    vx, vy = _tags(768, 15)
    model = nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=DataLoader(TensorDataset(vx, vy), 256),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(), max_steps=1500)


fix("targets_multilabel_with_cross_entropy", fixed_of(multilabel_ce), _micro_f1, "val micro-F1 (sigmoid > 0.5)")

# --------------------------------------------------------------------------------------------------------------------
# Nominal land-use classes regressed as numbers with MSELoss.


@case("targets_nominal_classes_regressed_with_mse", "targets",
      bug="The five land-use classes are nominal (no order) but the model has a single output trained with "
          "nn.MSELoss on the class index as a float and rounded at prediction time: it learns a weighted average "
          "of unrelated class ids and lands between classes (use 5 logits and CrossEntropyLoss).",
      cause_pattern=r"nominal|categor\w+ .{0,40}(as|like) (a )?(number|regression|continuous)|"
                    r"(class|label) (ind(ex|ices)|ids?) .{0,60}(regress|mse|continuous|float|ordinal)|"
                    r"(regress|mse)\w* .{0,60}(class|label) (ind(ex|ices)|ids?)|round\w*.{0,40}(class|prediction)|"
                    r"single output .{0,60}(class|classification)")
def class_regression(fixed: bool = False):
    seed(0)
    g = gen(16)
    x = torch.randn(3072, 12, generator=g)
    y = (x @ torch.randn(12, 5, generator=g)).argmax(1)
    if fixed:
        model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 5))
        train, lf = TensorDataset(x[:2560], y[:2560]), nn.CrossEntropyLoss()
    else:
        model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 1))
        train, lf = TensorDataset(x[:2560], y[:2560].float().unsqueeze(1)), nn.MSELoss()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3), train_loader=loader(train, 64),
                val_loader=DataLoader(TensorDataset(x[2560:], y[2560:]), 512), loss_fn=lf, max_steps=1500)


def _class_pred(m, b):
    out = m(b[0])
    pred = out.argmax(-1) if out.size(-1) > 1 else out.squeeze(-1).round().clamp(0, 4).long()
    return pred, b[1]


fix("targets_nominal_classes_regressed_with_mse", fixed_of(class_regression), acc_of(_class_pred), "val accuracy")

# --------------------------------------------------------------------------------------------------------------------
# NER with a tiny BERT built from a config: word labels not re-aligned to the word pieces.

_PIECES = {w: [3 + 3 * w + k for k in range(1 + w % 3)] for w in range(40)}  # word id -> its word-piece ids
_TAG = {w: (w * 7) % 5 for w in range(40)}


def _ner(n: int, s: int, aligned: bool, T: int = 32):
    g = gen(s)
    rows = []
    for _ in range(n):
        words = torch.randint(0, 40, (int(torch.randint(4, 9, (1,), generator=g)),), generator=g).tolist()
        ids, labels = [1], [-100]  # [CLS]
        for w in words:
            ids += _PIECES[w]
            labels += [_TAG[w]] + [-100] * (len(_PIECES[w]) - 1)
        ids.append(2)  # [SEP]
        labels.append(-100)
        if not aligned:  # word labels padded to the sequence length, one per position after [CLS]
            labels = [-100] + [_TAG[w] for w in words] + [-100] * (len(ids) - 1 - len(words))
        pad = T - len(ids)
        rows.append({"input_ids": torch.tensor(ids + [0] * pad), "attention_mask": torch.tensor([1] * len(ids) + [0] * pad),
                     "labels": torch.tensor(labels + [-100] * pad)})
    return rows


def _bert_tagger():
    config = BertConfig(vocab_size=130, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=32, num_labels=5, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return BertForTokenClassification(config)


@case("targets_word_labels_not_aligned_to_subwords", "targets",
      bug="The word-level NER tags are laid on the word-piece sequence one per position after [CLS] without "
          "re-aligning them through word_ids(): as soon as a word is split into several pieces, every later tag "
          "sits on the wrong token, so the tiny BERT is trained on labels shifted against its inputs.",
      cause_pattern=r"word_ids|align\w*|(sub-?word|word-?piece|piece)s?.{0,80}(label|tag)|(label|tag)s?.{0,80}"
                    r"(sub-?word|word-?piece|pieces|tokeni[sz])|shift\w* .{0,40}(label|tag)")
def ner_alignment(fixed: bool = False):
    seed(0)
    model = _bert_tagger()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(_ner(2048, 17, aligned=fixed), 32),
                val_loader=DataLoader(_ner(512, 18, aligned=fixed), 128), loss_fn=None, max_steps=1500)


_NER_VAL = None


def _ner_accuracy(model, kw):
    global _NER_VAL
    if _NER_VAL is None:
        _NER_VAL = list(DataLoader(_ner(512, 18, aligned=True), 128))

    def fn(m, b):
        logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        keep = b["labels"] != -100
        return (logits.argmax(-1)[keep] == b["labels"][keep]).sum().item(), keep.sum().item()
    return mean_over(model, _NER_VAL, fn)


fix("targets_word_labels_not_aligned_to_subwords", fixed_of(ner_alignment), _ner_accuracy,
    "val tag accuracy on each word's first piece")

# --------------------------------------------------------------------------------------------------------------------
# House prices in $100k regressed through a Sigmoid output copied from a classifier.


def _prices(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, generator=gen(19)) / 8 ** 0.5
    y = 2.6 + 1.3 * torch.tanh(x @ w) + 0.4 * (x[:, 0] * x[:, 1]).clamp(-1, 1) + 0.1 * torch.randn(n, generator=g)
    return x, y.unsqueeze(1)


@case("targets_sigmoid_output_for_unbounded_regression", "targets",
      bug="The price regressor (targets 0.8 to 4.5, in $100k) ends in nn.Sigmoid(), left over from a binary "
          "classifier, so its predictions can never exceed 1: MSELoss pushes the output into saturation at 1 and the "
          "gradient vanishes there (drop the Sigmoid or scale the targets into (0, 1)).",
      cause_pattern=r"sigmoid|\(0, ?1\)|\[0, ?1\]|bounded (output|activation)|output (activation|range)|"
                    r"satur\w+|(never|cannot|can't) (exceed|reach|go above) 1")
def sigmoid_regression(fixed: bool = False):
    seed(0)
    x, y = _prices(2560, 20)
    vx, vy = _prices(512, 21)
    layers = [nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1)] + ([] if fixed else [nn.Sigmoid()])
    model = nn.Sequential(*layers)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=DataLoader(TensorDataset(vx, vy), 512),
                loss_fn=nn.MSELoss(), max_steps=1500)


fix("targets_sigmoid_output_for_unbounded_regression", fixed_of(sigmoid_regression),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE ($100k)", higher=False)
