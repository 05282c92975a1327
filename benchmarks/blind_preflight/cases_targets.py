"""Targets: one class only, multi-hot into a single-label criterion, all ignored, off by one, unscaled."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight.registry import case, loader, seed, teacher_classes, token_sequences

ONE_CLASS = (r"one class|single class|only (one|a single) (class|label|value)|(labels?|targets?)[^.]*(all|always) "
             r"(the same|equal|identical|\d)|all (the )?(labels|targets)[^.]*(same|equal|identical)|constant|"
             r"distinct (labels|targets|classes|values)|(1|one) distinct|no (label )?variation")
MULTI_HOT = (r"multi.?(hot|label)|BCEWithLogits|binary_cross_entropy|probabilit|soft (targets|labels)|"
             r"sum(s)? to (one|1)|one.?hot|distribution")
ALL_IGNORED = (r"-100|ignore_index|ignored|all (the )?(labels|targets|tokens)[^.]*mask|masked out|"
               r"no (valid|unmasked|supervised|non-ignored|counted) (target|label|token)")
OFF_BY_ONE = r"out of (range|bounds)|\[0, ?\d+\)|off.by.one|1-based|one-based|0-based|zero-based|num_classes|range"
SHIFT = r"shift|offset|next.token|two (positions|tokens)|t ?\+ ?2|position"
UNSCALED = r"scale|standardi[sz]|normali[sz]|magnitude|units|\bstd\b|variance"


class ReviewsBag(nn.Module):
    def __init__(self, vocab=500, dim=32, classes=2):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(dim, classes))

    def forward(self, tokens):
        return self.head(self.bag(tokens))


def _reviews(n, s=0, length=30, vocab=500):
    g = torch.Generator().manual_seed(s)
    stars = torch.randint(1, 6, (n,), generator=g)                  # 1..5 stars
    tokens = torch.randint(0, vocab, (n, length), generator=g)
    sentiment_words = torch.rand(n, length, generator=g) < 0.25
    return torch.where(sentiment_words, stars[:, None] * 10, tokens), stars


@case("reviews_threshold_single_class", "targets",
      "positive = stars > 5 on a 1-5 star scale, so every label is 0: the classifier sees one class only",
      ONE_CLASS)
def reviews_threshold_single_class():
    seed()
    tokens, stars = _reviews(768)
    labels = (stars > 5).long()
    model = ReviewsBag()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    vt, vs = _reviews(128, 1)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(tokens, labels), 32),
                val_loader=loader(TensorDataset(vt, (vs > 5).long()), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


class CsvDataset(Dataset):
    """Rows of an exported table: [schema_version, f1..f10, label]; the label is read from the wrong column."""

    def __init__(self, n, s=0):
        x, y = teacher_classes(n, 10, 3, s)
        self.table = torch.cat([torch.ones(n, 1), x, y[:, None].float()], 1)

    def __len__(self):
        return len(self.table)

    def __getitem__(self, i):
        row = self.table[i]
        return row[1:-1], row[0].long()        # meant: row[-1]


@case("csv_label_wrong_column_single_class", "targets",
      "the label is read from column 0 (a constant schema-version field) instead of the last column, so every "
      "target is class 1", ONE_CLASS)
def csv_label_wrong_column_single_class():
    seed()
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return dict(model=model, optimizer=optimizer, train_loader=loader(CsvDataset(1024), 64),
                loss_fn=nn.CrossEntropyLoss())


@case("recipe_tags_multihot_into_ce", "targets",
      "multi-hot float targets (a recipe has several tags) are fed to CrossEntropyLoss, which treats them as one "
      "class distribution (softmax, tags compete) instead of independent BCEWithLogits outputs", MULTI_HOT)
def recipe_tags_multihot_into_ce():
    seed()
    g = torch.Generator().manual_seed(0)
    ingredients = (torch.rand(1024, 40, generator=g) < 0.15).float()
    w = torch.randn(40, 8, generator=g)
    tags = ((ingredients @ w) > 1.0).float()
    tags[tags.sum(1) == 0, 0] = 1.0
    model = nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 8))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(ingredients, tags), 64),
                loss_fn=nn.CrossEntropyLoss())


class SceneCNN(nn.Module):
    def __init__(self, labels=6):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, labels)

    def forward(self, x):
        return self.head(self.body(x))


def _scenes(n, s=0):
    g = torch.Generator().manual_seed(s)
    present = (torch.rand(n, 6, generator=g) < 0.35).float()
    colours = torch.rand(6, 3, 1, 1, generator=g)
    images = 0.2 * torch.rand(n, 3, 16, 16, generator=g)
    for k in range(6):
        r, c = divmod(k, 3)
        images[:, :, r * 8: r * 8 + 6, c * 5: c * 5 + 5] += present[:, k, None, None, None] * colours[k]
    return images.clamp(0, 1) - 0.4, present


@case("scene_cnn_multihot_into_ce", "targets",
      "a multi-label scene CNN (several objects per image) is trained with CrossEntropyLoss on multi-hot float "
      "targets, a single-label criterion, instead of BCEWithLogitsLoss", MULTI_HOT)
def scene_cnn_multihot_into_ce():
    seed()
    images, present = _scenes(512)
    model = SceneCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(images, present), 32),
                loss_fn=nn.CrossEntropyLoss())


class LMDataset(Dataset):
    def __init__(self, n, length, vocab, s=0, mask_bug=True):
        self.ids = token_sequences(n, length, vocab, s)
        self.mask_bug = mask_bug

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        attention_mask = torch.ones_like(ids)
        # meant: ignore the padding positions, i.e. where attention_mask == 0
        labels = ids.masked_fill(attention_mask.bool(), -100)
        return {"input_ids": ids, "attention_mask": attention_mask, "labels": labels}


@case("gpt2_inverted_label_mask_all_ignored", "targets",
      "the padding mask for the labels is inverted (masked_fill where attention_mask == 1), so every label is -100 "
      "and the LM loss has no token to learn from (NaN)", ALL_IGNORED)
def gpt2_inverted_label_mask_all_ignored():
    from transformers import GPT2Config, GPT2LMHeadModel
    seed()
    config = GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=2)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(LMDataset(256, 32, 96), 16), loss_fn=None)


class NERDataset(Dataset):
    def __init__(self, n, length=24, vocab=120, tags=5, s=0):
        g = torch.Generator().manual_seed(s)
        self.items = []
        for _ in range(n):
            real = int(torch.randint(8, length + 1, (1,), generator=g))
            ids = torch.zeros(length, dtype=torch.long)
            ids[:real] = torch.randint(5, vocab, (real,), generator=g)
            ids[0] = 2                                               # [CLS]
            tags_ = torch.full((length,), -100)
            tags_[1:real] = ids[1:real] % tags
            mask = (ids != 0).long()
            self.items.append((ids, mask, tags_))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        ids, mask, tags = self.items[i]
        # meant to blank the padding: masked_fill(mask == 0, -100)
        labels = tags.masked_fill(mask == 1, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@case("bert_ner_inverted_mask_all_ignored", "targets",
      "token-classification labels are masked where attention_mask == 1 instead of == 0, and the padding was "
      "already -100, so every label of every batch is -100", ALL_IGNORED)
def bert_ner_inverted_mask_all_ignored():
    from transformers import BertConfig, BertForTokenClassification
    seed()
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=5)
    model = BertForTokenClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(NERDataset(256), 16), loss_fn=None)


def _digits(n, s=0):
    g = torch.Generator().manual_seed(s)
    digit = torch.randint(0, 10, (n,), generator=g)
    templates = torch.rand(10, 1, 12, 12, generator=torch.Generator().manual_seed(99)) > 0.5
    images = templates[digit].float() + 0.3 * torch.randn(n, 1, 12, 12, generator=g)
    return images, digit


@case("digits_one_based_labels", "targets",
      "labels come from a 1-based label file (1..10) while the head has 10 outputs: the labels are off by one and "
      "class 10 is out of range for CrossEntropyLoss", OFF_BY_ONE)
def digits_one_based_labels():
    seed()
    images, digit = _digits(640)
    labels = digit + 1                       # the label file counts classes from 1
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 10 * 10, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(images, labels), 32),
                loss_fn=nn.CrossEntropyLoss())


class ShiftedLM(Dataset):
    def __init__(self, n, length, vocab, s=0):
        self.ids = token_sequences(n, length + 1, vocab, s)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        seq = self.ids[i]
        # shifted by hand although GPT2LMHeadModel shifts the labels itself
        return {"input_ids": seq[:-1], "labels": seq[1:]}


@case("gpt2_labels_shifted_twice", "targets",
      "the labels are shifted by one by hand and GPT2LMHeadModel shifts them again, so the model is trained to "
      "predict the token two positions ahead", SHIFT)
def gpt2_labels_shifted_twice():
    from transformers import GPT2Config, GPT2LMHeadModel
    seed()
    config = GPT2Config(vocab_size=80, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=2)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(ShiftedLM(256, 32, 80), 16), loss_fn=None)


@case("house_prices_unscaled_targets", "targets",
      "features are standardised but the regression targets are raw prices (1e5-1e6 dollars): MSE starts around "
      "1e11 and the gradients are dominated by the target scale", UNSCALED)
def house_prices_unscaled_targets():
    seed()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 10, generator=g)
    price = 350_000 + 120_000 * (x[:, :4] @ torch.tensor([1.0, 0.5, -0.3, 0.8])) / 1.5
    price = price.clamp(min=60_000)

    class PriceNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))

        def forward(self, x):
            return self.net(x).squeeze(-1)

    model = PriceNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, price), 64),
                loss_fn=nn.MSELoss())
