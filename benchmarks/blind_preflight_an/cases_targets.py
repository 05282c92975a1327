"""Set an, family targets: label encodings and loss targets that do not say what the user means."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_an.registry import (
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    seed,
)


def _dev(m):
    return next(m.parameters()).device


# ----------------------------------------------------------------------------------------------------------------
# Multi-label tags (multi-hot float targets) trained with CrossEntropyLoss: softmax over tags, evaluated with sigmoid.

def multihot(n: int, s: int, d: int = 32, tags: int = 8):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, tags, generator=g) / d ** 0.5
    y = (x @ w > 0.4).float()
    return x, y


def tag_mlp(d: int = 32, tags: int = 8):
    return nn.Sequential(nn.Linear(d, 128), nn.ReLU(), nn.Linear(128, tags))


def build_multihot_ce(fixed: bool = False) -> dict:
    seed(0)
    x, y = multihot(2400, 11)
    model = tag_mlp()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(), max_steps=2000)


def tag_f1(model, kw):
    """Micro F1 of the tags at sigmoid > 0.5 (logit > 0), as the user's tagger thresholds them."""
    tp = fp = fn_ = 0.0
    model.eval()
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            p = (model(x.to(_dev(model))).float().cpu() > 0).float()
            tp += (p * y).sum().item()
            fp += (p * (1 - y)).sum().item()
            fn_ += ((1 - p) * y).sum().item()
    model.train()
    return 2 * tp / max(2 * tp + fp + fn_, 1.0)


case("an_targets_multihot_ce", "targets",
     "A multi-label tagger's multi-hot float targets (several tags per sample, some none) go to nn.CrossEntropyLoss, "
     "which reads them as one probability distribution over a softmax of the tags, instead of "
     "nn.BCEWithLogitsLoss with an independent sigmoid per tag; the tags are then thresholded at sigmoid > 0.5.",
     r"multi-?label.{0,80}(CrossEntropy|cross[- ]entropy|softmax|BCE|sigmoid)|"
     r"(CrossEntropy|cross[- ]entropy|softmax).{0,80}multi-?(label|hot)|multi-?hot|independent (sigmoid|binary)|"
     r"(softmax|CrossEntropyLoss|cross[- ]entropy).{0,80}(several|multiple|more than one) (labels|tags|classes|ones)|"
     r"(several|multiple|more than one) (labels|tags|classes|ones|1s).{0,80}(softmax|CrossEntropyLoss|cross[- ]entropy)|"
     r"(targets?|labels?) (rows )?(do not|don't) sum to (one|1)|sum to (more|other) than (one|1)")(build_multihot_ce)
fix("an_targets_multihot_ce", fixed_of(build_multihot_ce), tag_f1, "val micro F1 (sigmoid > 0.5)")


# ----------------------------------------------------------------------------------------------------------------
# Binary masks read from PNGs as 0 / 255 and handed to BCEWithLogitsLoss as they are.

def png_masks(n: int, s: int, size: int = 16):
    g = gen(s)
    x = 0.4 * torch.randn(n, 1, size, size, generator=g)
    m = torch.zeros(n, 1, size, size, dtype=torch.uint8)
    for i in range(n):
        r = int(torch.randint(2, 5, (1,), generator=g))
        cy, cx = (int(v) for v in torch.randint(r, size - r, (2,), generator=g))
        yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        blob = ((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r
        m[i, 0][blob] = 255
    x = x + (m > 0).float() * 0.8
    return x, m


class MaskNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                  nn.ReLU(), nn.Conv2d(16, 1, 1))

    def forward(self, x):
        return self.body(x)


class PngMaskSet(Dataset):
    def __init__(self, x, m, fixed):
        self.x, self.m, self.fixed = x, m, fixed

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        mask = self.m[i].float()
        return self.x[i], (mask / 255.0 if self.fixed else mask)


def build_mask_255_bce(fixed: bool = False) -> dict:
    seed(0)
    x, m = png_masks(1200, 12)
    model = MaskNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(PngMaskSet(x[:1000], m[:1000], fixed), 32),
                val_loader=loader(PngMaskSet(x[1000:], m[1000:], fixed), 100, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=1500)


def mask_acc(model, kw):
    def fn(mdl, b):
        p = mdl(b[0].to(_dev(mdl))).float().cpu() > 0
        return (p == (b[1] > 0)).sum().item(), b[1].numel()
    return mean_over(model, kw["val_loader"], fn)


case("an_targets_mask_255_bce", "targets",
     "The binary segmentation masks are read from PNGs as 0 / 255 and passed to nn.BCEWithLogitsLoss unscaled, so "
     "the target for a foreground pixel is 255 instead of 1: the loss goes negative and pushes every logit up.",
     r"(mask|target|label)s?.{0,60}\b255\b|\b255\b.{0,60}(mask|target|label)|\b0 ?(and|or|/) ?255\b|"
     r"(targets?|masks?|labels?).{0,60}(outside|not in|out of) (the )?(range )?\[?0, ?1\]?|"
     r"(targets?|masks?|labels?).{0,40}(greater|larger|bigger) than (one|1)|"
     r"(scale|divide|normali[sz]e).{0,40}(mask|target)s?.{0,30}(to|into) \[?0, ?1\]?|"
     r"(negative|below zero) (BCE |binary )?loss|loss (is |goes |went )?negative")(build_mask_255_bce)
fix("an_targets_mask_255_bce", fixed_of(build_mask_255_bce), mask_acc, "val pixel accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Class weights for CrossEntropyLoss set to the class frequencies instead of their inverse.

def imbalanced(n: int, s: int, d: int = 24):
    g = gen(s)
    priors = torch.tensor([0.62, 0.2, 0.1, 0.05, 0.03])
    y = torch.multinomial(priors, n, replacement=True, generator=g)
    centres = 1.1 * torch.randn(5, d, generator=g)
    x = centres[y] + torch.randn(n, d, generator=g)
    return x, y


def build_freq_class_weights(fixed: bool = False) -> dict:
    seed(0)
    x, y = imbalanced(3000, 13)
    counts = torch.bincount(y[:2400], minlength=5).float()
    freq = counts / counts.sum()
    weight = (1.0 / freq) / (1.0 / freq).sum() * 5 if fixed else freq * 5  # "weight each class by how common it is"
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2400], y[:2400]), 32),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(weight=weight), max_steps=2000)


def balanced_acc(model, kw):
    preds, ys = [], []
    model.eval()
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            preds.append(model(x.to(_dev(model))).argmax(-1).cpu())
            ys.append(y)
    model.train()
    p, y = torch.cat(preds), torch.cat(ys)
    recalls = [((p == c) & (y == c)).sum().item() / max((y == c).sum().item(), 1) for c in range(5)]
    return sum(recalls) / len(recalls)


case("an_targets_freq_class_weights", "targets",
     "The CrossEntropyLoss weight tensor is the class frequencies (counts / total) instead of their inverse, so the "
     "majority class is weighted 20 times the rarest and the rare classes are never predicted.",
     r"weight.{0,80}(frequenc|proportional to|counts|prevalence|common|majority)|"
     r"(inverse|reciprocal|1 ?/ ?(freq|count)).{0,40}(frequenc|count|weight)|"
     r"(majority|frequent|common) class(es)? (is |are )?(up-?weighted|weighted (more|most|highest))|"
     r"(rare|minority) class(es)? (is |are )?(down-?weighted|weighted (less|least|lowest))")(build_freq_class_weights)
fix("an_targets_freq_class_weights", fixed_of(build_freq_class_weights), balanced_acc, "val balanced accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Token classification with word-level tags padded to the sub-word length, not aligned with word_ids().

WORD_START, CONT = 10, 60   # ids 10..59 start a word, ids 60..89 continue one; 0 pad, 1 [CLS]
TAGS = 4


def word_pieces(word: int) -> list[int]:
    """The deterministic 'tokenizer': word w -> 1 to 3 sub-word ids, the first from the word-start range."""
    n = 1 + (word * 7) % 3
    return [WORD_START + word] + [CONT + (word * 3 + k) % 30 for k in range(n - 1)]


def tag_of_start(token_id: int) -> int:
    return ((token_id - WORD_START) * 5) % TAGS


def ner_batches(n: int, s: int, fixed: bool, words: int = 8, length: int = 28):
    g = gen(s)
    ids = torch.zeros(n, length, dtype=torch.long)
    labels = torch.full((n, length), -100, dtype=torch.long)
    for i in range(n):
        sent = torch.randint(0, 50, (words,), generator=g).tolist()
        toks, word_ids = [1], [None]
        for j, w in enumerate(sent):
            pieces = word_pieces(w)
            toks += pieces
            word_ids += [j] * len(pieces)
        toks = toks[:length]
        ids[i, :len(toks)] = torch.tensor(toks)
        tags = [tag_of_start(WORD_START + w) for w in sent]
        if fixed:  # first piece of each word carries its tag, other pieces and [CLS] -100
            prev = None
            for t, wid in enumerate(word_ids[:length]):
                if wid is not None and wid != prev:
                    labels[i, t] = tags[wid]
                prev = wid
        else:  # "pad the labels to the input length"
            for t, tag in enumerate(tags):
                labels[i, 1 + t] = tag
    return ids, (ids != 0).long(), labels


class NerSet(Dataset):
    def __init__(self, ids, mask, labels):
        self.ids, self.mask, self.labels = ids, mask, labels

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def tiny_bert_tagger():
    from transformers import BertConfig, BertForTokenClassification

    cfg = BertConfig(vocab_size=96, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=96, max_position_embeddings=32, num_labels=TAGS,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForTokenClassification(cfg)


def build_subword_labels(fixed: bool = False) -> dict:
    seed(0)
    tr = ner_batches(1200, 14, fixed)
    va = ner_batches(300, 15, fixed)
    model = tiny_bert_tagger()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(NerSet(*tr), 32), val_loader=loader(NerSet(*va), 100, shuffle=False),
                max_steps=1000)


def word_tag_acc(model, kw):
    """Accuracy on the first piece of every word, the tag recomputed from its id (whatever the loader's labels)."""
    def fn(m, b):
        ids = b["input_ids"]
        logits = m(input_ids=ids.to(_dev(m)), attention_mask=b["attention_mask"].to(_dev(m))).logits.float().cpu()
        starts = (ids >= WORD_START) & (ids < CONT)
        truth = ((ids - WORD_START) * 5) % TAGS
        return (logits.argmax(-1)[starts] == truth[starts]).sum().item(), starts.sum().item()
    return mean_over(model, kw["val_loader"], fn)


case("an_targets_subword_labels", "targets",
     "The token-classification labels are the word-level tags padded with -100 to the sub-word input length, not "
     "aligned with the tokenizer's word_ids(): after the first word split into several pieces, every label sits on "
     "the wrong token.",
     r"word_ids|sub-?word|word ?pieces?|"
     r"(labels?|tags?).{0,60}(not )?align\w* (with|to) (the )?(sub-?word |word-?piece |input )?(tokens?|ids)|"
     r"misalign\w*.{0,40}(tokens?|sub-?words?|words?)|"
     r"(labels?|tags?).{0,60}(wrong token|word level|word-level)|first (sub-?)?token of (each|every) word")(
    build_subword_labels)
fix("an_targets_subword_labels", fixed_of(build_subword_labels), word_tag_acc, "val word-start tag accuracy")


# ----------------------------------------------------------------------------------------------------------------
# A one-logit voice-activity detector trained with CrossEntropyLoss on float (N, 1) targets: the loss is always 0.

def vad_frames(n: int, s: int, d: int = 40):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g) / d ** 0.5
    y = (x @ w + 0.2 * torch.randn(n, generator=g) > 0).float().unsqueeze(1)
    return x, y


def build_ce_single_logit(fixed: bool = False) -> dict:
    seed(0)
    x, y = vad_frames(2000, 16)
    model = nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(), max_steps=1500)


def vad_acc(model, kw):
    def fn(m, b):
        p = (m(b[0].to(_dev(m))).float().cpu() > 0).float()
        return (p == b[1]).sum().item(), b[1].numel()
    return mean_over(model, kw["val_loader"], fn)


case("an_targets_ce_single_logit", "targets",
     "The detector has a single output logit and float (N, 1) 0/1 targets, but the loss is nn.CrossEntropyLoss: a "
     "softmax over one class is always 1, so the loss is exactly 0 and no gradient ever reaches the model.",
     r"(single|one|1)[- ](output )?(logit|unit|neuron|output)\b|"
     r"softmax over (a single|one|1)|log_softmax.{0,40}(single|one|1)|"
     r"loss (is |was |stays |equals? )?(exactly |constant(ly)? |always )?(0|zero)\b|(zero|0\.0) loss|"
     r"(CrossEntropyLoss|cross[- ]entropy).{0,80}(one|single|1) (logit|column|output)")(build_ce_single_logit)
fix("an_targets_ce_single_logit", fixed_of(build_ce_single_logit), vad_acc, "val accuracy")
