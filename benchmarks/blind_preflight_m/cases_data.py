"""Set m, family data: what the loaders deliver (augmentation, preprocessing, encoding) undermines the task."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_m.registry import acc_of, case, fix, gen, loader, mean_over, seed

# --------------------------------------------------------------------------------------------------------------
# 1. Building-footprint segmentation; the image and the mask each get their own RandomHorizontalFlip.
#    Source: https://github.com/albumentations-team/albumentations/issues/397


def footprint_tiles(n, s, size=24):
    g = gen(s)
    img = 0.15 * torch.randn(n, 1, size, size, generator=g)
    mask = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        h, w = torch.randint(3, 7, (2,), generator=g).tolist()
        r = int(torch.randint(0, size - h, (1,), generator=g))
        c = int(torch.randint(0, size // 2 - w, (1,), generator=g))     # buildings west of the river
        mask[i, r:r + h, c:c + w] = 1
    return img + 0.8 * mask[:, None].float(), mask


class RandomHFlip:
    """torchvision-style RandomHorizontalFlip(p=0.5) on a tensor."""

    def __call__(self, t):
        return t.flip(-1) if torch.rand(1).item() < 0.5 else t


class FootprintSet(Dataset):
    def __init__(self, img, mask, train, joint):
        self.img, self.mask, self.train, self.joint = img, mask, train, joint
        self.img_tf, self.mask_tf = RandomHFlip(), RandomHFlip()

    def __len__(self):
        return len(self.mask)

    def __getitem__(self, i):
        img, mask = self.img[i], self.mask[i]
        if self.train and self.joint:
            if torch.rand(1).item() < 0.5:
                img, mask = img.flip(-1), mask.flip(-1)
        elif self.train:
            img, mask = self.img_tf(img), self.mask_tf(mask)
        return img, mask


def footprint_fcn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 2, 1))


@case("data_seg_flip_not_joint", "data",
      "The image and its mask each go through their own RandomHorizontalFlip, so half of the training pairs have a "
      "mask mirrored relative to its image.",
      r"(image|input)s? and (the |its )?(mask|label|target)s?.{0,80}(separate|independent|different|own|not the same)"
      r"\w*.{0,30}(flip|transform|augment|random)|(flip|transform|augment)\w*.{0,60}(separately|independently|not "
      r"(shared|synchroni[sz]ed|joint))|(mask|label|target)s?.{0,40}(mirrored|misaligned|flipped) (relative|with "
      r"respect|compared) to|same (random )?(flip|transform)\w* (to|on|for) (both|the image and)")
def data_seg_flip_not_joint(fixed=False):
    seed(0)
    img, mask = footprint_tiles(1000, 41)
    model = footprint_fcn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(FootprintSet(img[:800], mask[:800], train=True, joint=fixed), 16),
                val_loader=loader(FootprintSet(img[800:], mask[800:], train=False, joint=fixed), 50, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


def building_iou(model, kw):
    inter = union = 0.0
    was = model.training
    model.eval()
    with torch.no_grad():
        for img, mask in kw["val_loader"]:
            pred = model(img).argmax(1)
            inter += ((pred == 1) & (mask == 1)).sum().item()
            union += ((pred == 1) | (mask == 1)).sum().item()
    model.train(was)
    return inter / max(union, 1.0)


fix("data_seg_flip_not_joint", lambda: data_seg_flip_not_joint(fixed=True), building_iou, "val building IoU")


# --------------------------------------------------------------------------------------------------------------
# 2. Direction-sign classifier (left / right / up / down) trained with RandomHorizontalFlip augmentation.
#    Source: https://crucialexams.com/study/questions/dy0-001/a-data-science-team-is-developing-a-computer-vision-model-to-classify/36604


def arrow_signs(n, s, size=16):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)                      # 0 left, 1 right, 2 up, 3 down
    x = 0.2 * torch.randn(n, 1, size, size, generator=g)
    for i in range(n):
        r, c = torch.randint(3, size - 9, (2,), generator=g).tolist()
        if y[i] < 2:
            x[i, 0, r + 3, c:c + 8] += 1.0                           # shaft
            head = c if y[i] == 0 else c + 6
            x[i, 0, r + 1:r + 6, head:head + 2] += 1.0               # arrow head at the pointing end
        else:
            x[i, 0, r:r + 8, c + 3] += 1.0
            head = r if y[i] == 2 else r + 6
            x[i, 0, head:head + 2, c + 1:c + 6] += 1.0
    return x, y


class SignSet(Dataset):
    def __init__(self, x, y, augment):
        self.x, self.y, self.augment = x, y, augment

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i]
        if self.augment and torch.rand(1).item() < 0.5:               # "flips make the model robust"
            x = x.flip(-1)
        return x, self.y[i]


@case("data_hflip_changes_label", "data",
      "Training images go through RandomHorizontalFlip although the classes are left- and right-pointing signs, so "
      "half of the flipped 'left' signs are right-pointing images still labelled 'left' (and vice versa).",
      r"(horizontal|left[- ]right|mirror)\w* ?(flip|mirror)\w*.{0,80}(label|class|direction|orientation|meaning|"
      r"semantic)|(flip|mirror)\w*.{0,60}(chang|swap|invert|revers|turn)\w* (the )?(label|class|direction|meaning)"
      r"|(label|class)[- ](changing|altering|preserving)|not (label|class)[- ]preserving|(left|right)[- ]pointing")
def data_hflip_changes_label(fixed=False):
    seed(0)
    x, y = arrow_signs(1600, 42)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveMaxPool2d(2), nn.Flatten(), nn.Linear(128, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(SignSet(x[:1300], y[:1300], augment=not fixed), 32),
                val_loader=loader(SignSet(x[1300:], y[1300:], augment=False), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1200)


fix("data_hflip_changes_label", lambda: data_hflip_changes_label(fixed=True),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 3. Loan-default MLP: the training features go through the standard scaler, the validation features are passed
#    raw. Source: http://pullrequest.ru/10248037/cnn-keras-shodyatsya-odnomu-tomu-zhe-znacheniy-nezavisimo-vvoda


def loan_table(n, s):
    g = gen(s)
    scale = torch.tensor([12.0, 15000.0, 3.0, 200.0, 0.2, 8.0])
    centre = torch.tensor([40.0, 50000.0, 10.0, 650.0, 0.35, 24.0])
    z = torch.randn(n, 6, generator=g)
    w = torch.tensor([0.8, -1.5, -0.5, -1.2, 1.6, 0.4])
    logit = z @ w + 0.8 * z[:, 1] * z[:, 4]
    y = (logit + 0.3 * torch.randn(n, generator=g) > 0).long()
    return z * scale + centre, y


@case("data_val_not_standardised", "data",
      "The training features are standardised with the scaler fitted on them, but the validation features are "
      "passed raw (income in the tens of thousands), so validation inputs are on a different scale from training.",
      r"(validation|val|eval|test)\w*.{0,60}(not|never|without|un)[- ]?(standardi[sz]|normali[sz]|scal|transform)"
      r"|(standardi[sz]|normali[sz]|scal|preprocess)\w*.{0,80}(only|just) (to |on |for )?(the )?train"
      r"|(different|inconsistent|mismatch\w*) (scale|preprocessing|normali[sz]ation|standardi[sz]ation)"
      r"|scaler\.transform|(train|training) and (validation|val|test)\w* .{0,40}(scale|distribution|statistics)"
      r"|(validation|val)\w*( set| inputs| features)? (differ|shift)\w*.{0,30}(from|than) (the )?train")
def data_val_not_standardised(fixed=False):
    seed(0)
    x, y = loan_table(2400, 43)
    mean, std = x[:2000].mean(0), x[:2000].std(0)
    x_train = (x[:2000] - mean) / std
    x_val = (x[2000:] - mean) / std if fixed else x[2000:]
    model = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x_train, y[:2000]), 32),
                val_loader=loader(TensorDataset(x_val, y[2000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("data_val_not_standardised", lambda: data_val_not_standardised(fixed=True),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 4. Tiny DistilBERT (from a config) on long support tickets whose resolution code is stated at the end; the
#    collate truncates to 32 tokens keeping the beginning.
#    Source: https://github.com/TheophileBlard/french-sentiment-analysis-with-bert/issues/14


def tickets(n, s, length=64, vocab=200):
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    ids = torch.randint(10, vocab, (n, length), generator=g)
    code_words = torch.tensor([[3, 4], [5, 6], [7, 8]])
    for i in range(n):
        where = length - 16 + torch.randperm(16, generator=g)[:2]    # the closing lines
        ids[i, where] = code_words[y[i]]
    return ids, y


def truncating_collate(max_length, side):
    def collate(items):
        ids = torch.stack([i for i, _ in items])
        ids = ids[:, :max_length] if side == "right" else ids[:, -max_length:]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.stack([y for _, y in items])}
    return collate


def tiny_distilbert():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    cfg = DistilBertConfig(vocab_size=200, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64,
                           num_labels=3, dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0)
    return DistilBertForSequenceClassification(cfg)


@case("data_truncation_drops_signal", "data",
      "Tickets are 64 tokens long with the resolution code in the last 16, but the collate truncates to "
      "max_length=32 from the right (keeping the beginning), so the label-bearing tokens never reach the model.",
      r"truncat\w*|max_length|(keeps?|keeping|only sees?) (only )?the (beginning|start|first)|(end|tail|last \d+ "
      r"tokens) (of the (text|ticket|sequence) )?(is |are )?(cut|dropped|lost|removed)")
def data_truncation_drops_signal(fixed=False):
    seed(0)
    ids, y = tickets(1500, 44)
    model = tiny_distilbert()
    collate = truncating_collate(32, "left" if fixed else "right")
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(ids[:1200], y[:1200]), 32, collate_fn=collate),
                val_loader=loader(TensorDataset(ids[1200:], y[1200:]), 100, shuffle=False, collate_fn=collate),
                loss_fn=None, max_steps=600, clip_grad_norm=1.0)


def ticket_accuracy(model, kw):
    def fn(m, b):
        pred = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1)
        return (pred == b["labels"]).sum().item(), len(b["labels"])
    return mean_over(model, kw["val_loader"], fn)


fix("data_truncation_drops_signal", lambda: data_truncation_drops_signal(fixed=True), ticket_accuracy, "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 5. Churn table whose city column is one-hot encoded per split (get_dummies habit: categories = np.unique of
#    that split). Source: https://techqa.club/v/q/keep-same-dummy-variable-in-training-and-testing-data-41335718


def churn_table(n, s, cities):
    g = gen(s)
    rng = np.random.default_rng(s)
    city = rng.choice(cities, n)
    effect = {c: e for c, e in zip("ABCDEFGHI", [2.0, -2.0, 1.5, -1.5, 1.0, -1.0, 2.5, -2.5, 0.0])}
    num = torch.randn(n, 4, generator=g)
    logit = torch.tensor([effect[c] for c in city]) + num @ torch.tensor([0.5, -0.5, 0.3, 0.0])
    return city, num, (logit > 0).long()


def one_hot(city, categories):
    return torch.from_numpy((city[:, None] == np.asarray(categories)[None, :]).astype(np.float32))


@case("data_onehot_per_split", "data",
      "The city column is one-hot encoded separately per split (categories = np.unique of each split); validation "
      "lacks city C and has a new city I, so its columns shift and mean different cities than in training.",
      r"(one[- ]hot|dumm(y|ies)|get_dummies|categor\w*|encod\w*).{0,80}(separately|per split|independently|each split|"
      r"differ\w* between|not (aligned|the same|consistent))|(column|categor\w*)s? (are )?(shift|misalign|mismatch|"
      r"reorder|permut)\w*|(fit|build|learn)\w* (the )?(encoder|categories|vocabulary|columns) on (the )?train\w* "
      r"(only|split|set)")
def data_onehot_per_split(fixed=False):
    seed(0)
    city, num, y = churn_table(2000, 45, list("ABCDEFGH"))
    vcity, vnum, vy = churn_table(500, 46, list("ABDEFGHI"))
    train_cats = np.unique(city)
    x = torch.cat([one_hot(city, train_cats), num], 1)
    vx = torch.cat([one_hot(vcity, train_cats if fixed else np.unique(vcity)), vnum], 1)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1200)


fix("data_onehot_per_split", lambda: data_onehot_per_split(fixed=True),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")
