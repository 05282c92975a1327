"""Set n, family targets: the loss is told something else than what the model should learn (no crash)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_n.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    seed,
    split,
    token_sequences,
)


class DictRows(Dataset):
    """Rows of a dict of equal-length tensors, batched by the default collate into a dict (Hugging Face style)."""

    def __init__(self, **columns):
        self.columns = columns

    def __len__(self):
        return len(next(iter(self.columns.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.columns.items()}


# --- 1. Tiny GPT-2: labels shifted by hand although the model shifts them itself ------------------------------------
# Source: https://github.com/huggingface/transformers/issues/3523 ("in GPT2LMHeadModel, the label is shifted,
# however, I shift it again when preparing the batch").

def tiny_gpt2(vocab: int = 48):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=vocab, n_positions=32, n_embd=32, n_layer=2, n_head=2, n_inner=64,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)
    return GPT2LMHeadModel(cfg)


def build_gpt2_counting(fixed: bool = False):
    seed(0)
    ids = token_sequences(1280, 16, 48, s=6)
    if fixed:
        labels = ids.clone()                                       # the model shifts inside its forward
    else:
        labels = torch.cat([ids[:, 1:], torch.full((len(ids), 1), -100)], 1)   # "next token" by hand
    model = tiny_gpt2()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0),
                train_loader=loader(DictRows(input_ids=ids[:1024], labels=labels[:1024]), 32),
                val_loader=loader(DictRows(input_ids=ids[1024:], labels=labels[1024:]), 128, shuffle=False),
                loss_fn=None, max_steps=300)


@case("gpt2_labels_shifted_twice", "targets",
      bug="The labels are built as input_ids shifted left by one (labels[:, :-1] = input_ids[:, 1:]) although "
          "GPT2LMHeadModel already shifts labels inside its forward, so the model is trained to predict the token two "
          "positions ahead and its next-token predictions are wrong.",
      cause_pattern=r"shift\w*.{0,80}(twice|again|double|two (positions|tokens|steps))|(double|twice)[- ]shift"
                    r"|(already|pre-?)[- ]?shifted|shifts? (the )?labels? (inside|internally|itself|in (its|the) "
                    r"forward)|labels\s*=\s*input_ids|two (tokens|positions|steps) ahead|t\s*\+\s*2")
def gpt2_labels_shifted_twice(fixed: bool = False):
    return build_gpt2_counting(fixed)


def next_token_accuracy(model, kw):
    def fn(m, b):
        ids = b["input_ids"]
        pred = m(input_ids=ids).logits[:, :-1].argmax(-1)
        return (pred == ids[:, 1:]).sum().item(), ids[:, 1:].numel()
    return mean_over(model, kw["val_loader"], fn)


fix("gpt2_labels_shifted_twice", fixed_of(gpt2_labels_shifted_twice), next_token_accuracy, "val next-token accuracy")


# --- 2. Signature verification: CosineEmbeddingLoss fed 1 / 0 pair labels -------------------------------------
# Source: https://sachinruk.github.io/programming_tips/cosine-embedding-loss.html (describes the dissimilar case of
# nn.CosineEmbeddingLoss as y = 0; the loss only defines y = 1 and y = -1).

def signature_pairs(n: int, s: int, writers: int = 24, d: int = 32):
    g = gen(s)
    proto = torch.randn(writers, d, generator=g)
    wa = torch.randint(0, writers, (n,), generator=g)
    same = torch.rand(n, generator=g) < 0.5
    wb = torch.where(same, wa, (wa + torch.randint(1, writers, (n,), generator=g)) % writers)
    a = proto[wa] + 0.7 * torch.randn(n, d, generator=g)
    b = proto[wb] + 0.7 * torch.randn(n, d, generator=g)
    return a, b, same.long()


def pair_loss(signed: bool):
    def loss_fn(model, batch):
        a, b, same = batch
        target = same * 2 - 1 if signed else same          # the dataset stores 1 = same writer, 0 = different
        return F.cosine_embedding_loss(model(a), model(b), target)
    return loss_fn


@case("signature_cosine_loss_zero_labels", "targets",
      bug="The pairs' labels are 1 (same writer) and 0 (different writers) and go straight into "
          "F.cosine_embedding_loss, which expects 1 / -1: a target of 0 matches neither branch, so dissimilar pairs add "
          "no loss and nothing pushes different writers' embeddings apart.",
      cause_pattern=r"cosine_?embedding_?loss.{0,160}(-1\b|minus one|negative one)"
                    r"|(-1\b|minus one).{0,80}cosine_?embedding"
                    r"|(target|label)s? (of |equal to |= ?)?0\b.{0,80}(ignored|no loss|zero loss|contribut\w* nothing"
                    r"|neither|not (a )?valid)|1 ?/ ?-1|1 and -1|\{-?1, ?-?1\}|±1"
                    r"|dissimilar (pairs?|writers?).{0,60}(never|not|no) (pushed|separated|penali[sz]ed|contribut)")
def signature_cosine_loss_zero_labels(fixed: bool = False):
    seed(0)
    a, b, same = signature_pairs(2560, 7)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(a[:2048], b[:2048], same[:2048]), 64),
                val_loader=loader(TensorDataset(a[2048:], b[2048:], same[2048:]), 256, shuffle=False),
                loss_fn=pair_loss(signed=fixed), max_steps=300)


def verification_accuracy(model, kw):
    """Same writer iff the cosine similarity of the two embeddings is above 0.5."""
    def fn(m, b):
        a, bb, same = b
        match = (F.cosine_similarity(m(a), m(bb)) > 0.5).long()
        return (match == same).sum().item(), len(same)
    return mean_over(model, kw["val_loader"], fn)


fix("signature_cosine_loss_zero_labels", fixed_of(signature_cosine_loss_zero_labels), verification_accuracy,
    "val verification accuracy (cos > 0.5)")


# --- 3. News topics: NLLLoss on softmax probabilities ------------------------------------------------------
# Source: https://github.com/AnubhavGupta3377/Text-Classification-Models-Pytorch/issues/9 (the input of nn.NLLLoss
# should come from log_softmax; the model only applies softmax, so the loss is always negative).

def topic_docs(n: int, s: int, vocab: int = 1000, topics: int = 100, per_topic: int = 3, length: int = 24):
    """News snippets: 15% of the tokens are one of the topic's 3 key words, the rest general vocabulary."""
    g = gen(s)
    y = torch.randint(0, topics, (n,), generator=g)
    general = torch.randint(topics * per_topic, vocab, (n, length), generator=g)
    specific = y[:, None] * per_topic + torch.randint(0, per_topic, (n, length), generator=g)
    pick = torch.rand(n, length, generator=g) < 0.15
    return torch.where(pick, specific, general), y


@case("topics_nllloss_on_softmax", "targets",
      bug="The text classifier ends in nn.Softmax(dim=1) and the loss is nn.NLLLoss, which expects log-probabilities "
          "(log_softmax): it then minimises -p[target], the loss goes negative (bounded at -1) and the gradient "
          "vanishes wherever p[target] is small.",
      cause_pattern=r"nll_?loss.{0,120}(log[- _]?probabilit|log_?softmax)|log_?softmax.{0,100}nll"
                    r"|(softmax|probabilit)\w*.{0,60}(instead of|not|rather than) (the )?log[- _]?(softmax|probabilit)"
                    r"|loss (goes|went|is|becomes|turns) negative|negative (nll|loss)|-p\[target\]"
                    r"|minus the probability")
def topics_nllloss_on_softmax(fixed: bool = False):
    seed(0)
    x, y = topic_docs(3000, 8)
    (xt, yt), (xv, yv) = split(x, y, 2500)

    class BagOfWords(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(1000, 32, mode="mean")
            self.out = nn.Linear(32, 100)
            self.norm = nn.LogSoftmax(dim=1) if fixed else nn.Softmax(dim=1)

        def forward(self, tokens):
            return self.norm(self.out(self.bag(tokens)))

    model = BagOfWords()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 64),
                val_loader=loader(TensorDataset(xv, yv), 250, shuffle=False),
                loss_fn=nn.NLLLoss(), max_steps=300)


fix("topics_nllloss_on_softmax", fixed_of(topics_nllloss_on_softmax),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --- 4. Defect localisation: a sigmoid box head trained on pixel coordinates ----------------------------------
# Source: https://github.com/facebookresearch/detr/issues/587 (box labels outside [0, 1] while every predicted box
# coordinate lies in (0, 1): the box head ends in a sigmoid, and DETR expects boxes normalised by the image size).

def defect_boxes(n: int, s: int, size: int = 32):
    """One bright defect per grey panel; the target is its box (x1, y1, x2, y2) in pixels."""
    g = gen(s)
    img = 0.3 * torch.randn(n, 1, size, size, generator=g)
    boxes = torch.zeros(n, 4)
    for i in range(n):
        w, h = torch.randint(6, 14, (2,), generator=g).tolist()
        x1 = int(torch.randint(0, size - w, (1,), generator=g))
        y1 = int(torch.randint(0, size - h, (1,), generator=g))
        img[i, 0, y1:y1 + h, x1:x1 + w] += 1.5
        boxes[i] = torch.tensor([x1, y1, x1 + w, y1 + h], dtype=torch.float32)
    return img, boxes


class BoxHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.box = nn.Sequential(nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return torch.sigmoid(self.box(self.features(x)))      # (x1, y1, x2, y2), DETR-style in (0, 1)


@case("defect_sigmoid_boxes_pixel_targets", "targets",
      bug="The box head ends in a sigmoid (coordinates in (0, 1), as in DETR) but the target boxes are in pixels "
          "(0-32), never divided by the image size: every target is out of the head's reach, the sigmoid saturates "
          "and the predicted boxes collapse to the corner.",
      cause_pattern=r"sigmoid.{0,120}(pixel|\[0, ?1\]|\(0, ?1\)|normali[sz]|image size)"
                    r"|(pixel|absolute) (coordinates|units|values|boxes).{0,120}(sigmoid|\[0, ?1\]|normali[sz])"
                    r"|normali[sz]\w* (the )?(box|boxes|coordinates|targets) (by|to|with) (the )?(image )?"
                    r"(size|width|height|\[0, ?1\])|divid\w* (the )?(box(es)?|coordinates|targets) by (the )?(image )?"
                    r"(size|width|height)|(out of|beyond|outside) (the )?(head|output|sigmoid)'?s? (reach|range)")
def defect_sigmoid_boxes_pixel_targets(fixed: bool = False):
    seed(0)
    img, boxes = defect_boxes(1280, 11)
    if fixed:
        boxes = boxes / 32.0
    model = BoxHead()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(img[:1024], boxes[:1024]), 32),
                val_loader=loader(TensorDataset(img[1024:], boxes[1024:]), 128, shuffle=False),
                loss_fn=nn.SmoothL1Loss(), max_steps=300)


def box_iou(model, kw):
    """Mean IoU of the predicted and target boxes, in the units the case trains on (IoU is scale-free)."""
    def fn(m, b):
        p, t = m(b[0]).float(), b[1]
        iw = (torch.minimum(p[:, 2], t[:, 2]) - torch.maximum(p[:, 0], t[:, 0])).clamp(min=0)
        ih = (torch.minimum(p[:, 3], t[:, 3]) - torch.maximum(p[:, 1], t[:, 1])).clamp(min=0)
        inter = iw * ih

        def area(z):
            return (z[:, 2] - z[:, 0]).clamp(min=0) * (z[:, 3] - z[:, 1]).clamp(min=0)
        return (inter / (area(p) + area(t) - inter).clamp(min=1e-9)).sum().item(), len(t)
    return mean_over(model, kw["val_loader"], fn)


fix("defect_sigmoid_boxes_pixel_targets", fixed_of(defect_sigmoid_boxes_pixel_targets), box_iou, "val box IoU")


# --- 5. Cell segmentation: BCEWithLogitsLoss on 0/255 masks ---------------------------------------------------
# Source: https://github.com/milesial/Pytorch-UNet/issues/78 (negative loss; "please ensure mask is 0-1, not 0-255").

def cell_images(n: int, s: int, size: int = 24):
    g = gen(s)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    img = 0.4 * torch.randn(n, 1, size, size, generator=g)
    mask = torch.zeros(n, 1, size, size)
    for i in range(n):
        for _ in range(int(torch.randint(1, 3, (1,), generator=g))):
            cy, cx = torch.randint(4, size - 4, (2,), generator=g).tolist()
            r = float(torch.randint(2, 5, (1,), generator=g))
            blob = ((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r
            mask[i, 0][blob] = 255.0                       # as read from an 8-bit PNG
    img = img + (mask > 0).float()
    return img, mask


@case("cells_bce_on_255_masks", "targets",
      bug="The masks are read from 8-bit PNGs and passed to nn.BCEWithLogitsLoss as 0/255 instead of 0/1: with a "
          "target of 255 the loss goes negative without bound and pushes every logit up, so the model ends up "
          "predicting foreground everywhere.",
      cause_pattern=r"255|outside (of )?(the )?\[?0,? ?1\]?|not (in|within|between) \[?0,? ?(and )?1\]?"
                    r"|targets? (must|should) be (in|between|within) \[?0,? ?(and )?1"
                    r"|(mask|target)s?.{0,60}(divid\w*|/|scal\w*|normali[sz]\w*).{0,30}(\[0, ?1\]|0 ?(and|-|to) ?1)")
def cells_bce_on_255_masks(fixed: bool = False):
    seed(0)
    img, mask = cell_images(640, 10)
    if fixed:
        mask = mask / 255.0
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 1, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(img[:512], mask[:512]), 16),
                val_loader=loader(TensorDataset(img[512:], mask[512:]), 128, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


def foreground_iou(model, kw):
    inter = union = 0.0
    was = model.training
    model.eval()
    with torch.no_grad():
        for x, m in kw["val_loader"]:
            pred, true = model(x) > 0, m > 0
            inter += (pred & true).sum().item()
            union += (pred | true).sum().item()
    model.train(was)
    return inter / max(union, 1.0)


fix("cells_bce_on_255_masks", fixed_of(cells_bce_on_255_masks), foreground_iou, "val foreground IoU")
