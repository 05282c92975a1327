"""Data: what the loaders deliver (ids, alignment, masks, sampling, rows) is not what the user meant."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from benchmarks.blind_preflight_x.registry import (
    acc_of,
    balanced_acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_of,
    seed,
)

# --- 1. NER tag vocabulary built separately per split ----------------------------------------------------------------

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]


def _ner_sentences(n, s, length=12):
    """Word ids 0..89: ids 0..9 start a person, 10..19 a location, 20..29 an organisation; ids 30..59 continue the
    entity that precedes them, ids 60..89 are outside words."""
    g = gen(s)
    words, tags = [], []
    for _ in range(n):
        w, t = [], []
        while len(w) < length:
            kind = int(torch.randint(0, 4, (1,), generator=g))
            if kind == 3:
                w.append(60 + int(torch.randint(0, 30, (1,), generator=g)))
                t.append("O")
                continue
            name = ["PER", "LOC", "ORG"][kind]
            w.append(10 * kind + int(torch.randint(0, 10, (1,), generator=g)))
            t.append("B-" + name)
            for _ in range(int(torch.randint(0, 2, (1,), generator=g))):
                w.append(30 + 10 * kind + int(torch.randint(0, 10, (1,), generator=g)))
                t.append("I-" + name)
        words.append(w[:length])
        tags.append(t[:length])
    return words, tags


def tag_vocab(tag_lists):
    """label2id in order of first appearance (the split's own)."""
    vocab = {}
    for ts in tag_lists:
        for t in ts:
            vocab.setdefault(t, len(vocab))
    return vocab


class WindowTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(90, 32)
        self.conv = nn.Conv1d(32, 64, 3, padding=1)
        self.out = nn.Linear(64, 7)

    def forward(self, x):
        h = torch.relu(self.conv(self.emb(x).transpose(1, 2))).transpose(1, 2)
        return self.out(h)


def tagging_loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x).reshape(-1, 7), y.reshape(-1))


@case("dt_ner_tag_vocab_built_per_split", "data",
      bug="The NER label2id is built separately for the training and the validation split (ids in order of first "
          "appearance within each split), so the same tag has different ids in the two loaders and validation "
          "scores the model against a permuted tag set.",
      cause_pattern=r"(label2id|tag2id|label (map|vocab\w*|encod\w*)|(tag|label) (vocab\w*|ids?|mapping)).{0,200}"
                    r"(per split|each split|separately|different(ly)?|(val|validation|test) (split|set|loader)|"
                    r"permut|inconsistent|not shared)|(built|fit(ted)?) (on|for|from) (each|every) split|"
                    r"same (tag|label|class) (has|gets|maps to) (a )?different id")
def dt_tag_vocab(fixed=False):
    seed(0)
    words, tags = _ner_sentences(1500, 51)
    train_vocab = tag_vocab(tags[:1200])
    val_vocab = train_vocab if fixed else tag_vocab(tags[1200:][::-1])
    x = torch.tensor(words)
    y_train = torch.tensor([[train_vocab[t] for t in ts] for ts in tags[:1200]])
    y_val = torch.tensor([[val_vocab[t] for t in ts] for ts in tags[1200:]])
    model = WindowTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1200], y_train), 32),
                val_loader=loader(TensorDataset(x[1200:], y_val), 100, shuffle=False),
                loss_fn=tagging_loss, max_steps=250)


fix("dt_ner_tag_vocab_built_per_split", fixed_of(dt_tag_vocab), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val token accuracy", steps=250)

# --- 2. word labels not shifted for the [CLS] token --------------------------------------------------------------------

CLS, SEP, PAD = 1, 2, 0


def _slot_rows(n, s, length=10, aligned=True):
    """Slot filling on word ids 3..62; tag = a fixed function of the word (5 slot tags). With aligned=False the
    word tags are written from position 0, over [CLS], as the broken collate does."""
    g = gen(s)
    w = torch.randint(3, 63, (n, length), generator=g)
    tags = (w * 7 + 3) % 5
    ids = torch.cat([torch.full((n, 1), CLS), w, torch.full((n, 1), SEP)], 1)
    labels = torch.full_like(ids, -100)
    if aligned:
        labels[:, 1:length + 1] = tags
    else:
        labels[:, :length] = tags
    return [{"input_ids": a, "attention_mask": torch.ones_like(a), "labels": b} for a, b in zip(ids, labels)]


def tiny_bert_tagger():
    from transformers import BertConfig, BertForTokenClassification
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=16, num_labels=5, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, pad_token_id=PAD)
    return BertForTokenClassification(cfg)


@case("dt_word_labels_not_shifted_for_cls", "data",
      bug="The collate writes the word-level slot tags from position 0 of labels, but the tokenizer put [CLS] at "
          "position 0 of input_ids: every tag sits one position to the left of its word ([CLS] gets word 1's tag), "
          "so the model learns each word's right neighbour's tag.",
      cause_pattern=r"\[?cls\]?.{0,200}(shift|offset|misalign|position 0|one position|align)|(labels?|tags?).{0,160}"
                    r"(shifted|offset|misaligned|off by one|one position)|word_ids|special tokens?.{0,120}(labels?|"
                    r"tags?|-100)")
def dt_cls_shift(fixed=False):
    seed(0)
    model = tiny_bert_tagger()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(_slot_rows(1200, 52, aligned=fixed), 32),
                val_loader=loader(_slot_rows(300, 53, aligned=fixed), 100, shuffle=False),
                loss_fn=None, max_steps=250)


def _aligned_eval(kw):
    return DataLoader(_slot_rows(300, 53, aligned=True), batch_size=100)


fix("dt_word_labels_not_shifted_for_cls", fixed_of(dt_cls_shift),
    acc_of(lambda m, b: (m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1),
                         b["labels"]), batches=_aligned_eval),
    "token accuracy at each word's own position", steps=250)

# --- 3. attention_mask built with the key_padding_mask convention -------------------------------------------------------


def _complaints(n, s, length=16):
    """Ticket text ids (3..79, 0 = pad, lengths 4..12); urgent when 'outage' (id 5) or 'down' (id 6) occurs."""
    g = gen(s)
    x = torch.randint(7, 80, (n, length), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    lengths = torch.randint(4, 13, (n,), generator=g)
    pos = (torch.rand(n, generator=g) * (lengths - 1)).long() + 1
    x[y == 1, pos[y == 1]] = torch.randint(5, 7, (int((y == 1).sum()),), generator=g)
    x[:, 0] = 1
    x[torch.arange(length).expand(n, length) >= lengths[:, None]] = 0
    return x, y


def complaint_rows(x, y, fixed):
    # nn.Transformer habit: True / 1 marks the padding to ignore
    mask = (x != 0).long() if fixed else (x == 0).long()
    return [{"input_ids": a, "attention_mask": m, "labels": b} for a, m, b in zip(x, mask, y)]


@case("dt_attention_mask_is_padding_mask", "data",
      bug="The collate builds attention_mask = (input_ids == pad_id), the nn.Transformer key_padding_mask "
          "convention, but Hugging Face models read 1 as 'attend' and 0 as 'ignore': every token attends only to the "
          "padding and the real words are masked out.",
      cause_pattern=r"attention_mask.{0,200}(invert|revers|flip|pad(ding)?\b.{0,40}(1|true|attend)|opposite|"
                    r"== ?pad|convention)|key_padding_mask|(1|true) (for|marks|on) (the )?pad(ding)?.{0,80}"
                    r"(attention|mask)|attend\w* (only )?to (the )?pad")
def dt_mask(fixed=False):
    seed(0)
    x, y = _complaints(1500, 54)
    from benchmarks.blind_preflight_x.cases_targets import tiny_bert_classifier
    model = tiny_bert_classifier(2)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(complaint_rows(x[:1200], y[:1200], fixed), 32),
                val_loader=loader(complaint_rows(x[1200:], y[1200:], fixed), 100, shuffle=False),
                loss_fn=None, max_steps=250)


fix("dt_attention_mask_is_padding_mask", fixed_of(dt_mask),
    acc_of(lambda m, b: (m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1),
                         b["labels"])), "val accuracy", steps=250)

# --- 4. WeightedRandomSampler weights proportional to class frequency ---------------------------------------------------


def _triage(n, s):
    """Symptom embeddings of triage notes: routine 86 %, urgent 10 %, emergency 4 %, overlapping."""
    g = gen(s)
    y = torch.multinomial(torch.tensor([0.86, 0.10, 0.04]), n, replacement=True, generator=g)
    centers = torch.randn(3, 12, generator=g) * 0.55
    return centers[y] + torch.randn(n, 12, generator=g), y


@case("dt_sampler_weights_are_class_frequency", "data",
      bug="The WeightedRandomSampler is given each sample's class frequency (count / total) as its weight instead of "
          "its inverse, so the majority class is drawn even more often (in proportion to the squared frequency) and "
          "the rare emergency class almost never appears in a batch.",
      cause_pattern=r"(weightedrandomsampler|sampler|sample weights?).{0,200}(inverse|frequency|1 ?/ ?(count|freq)|"
                    r"proportional|majority|over-?sampl|rare|minority)|(inverse|reciprocal) (of the )?"
                    r"(class )?(frequenc|count)")
def dt_sampler(fixed=False):
    seed(0)
    x, y = _triage(3000, 55)
    xt, yt = x[:2400], y[:2400]
    freq = torch.bincount(yt, minlength=3).float() / len(yt)
    w = (1.0 / freq)[yt] if fixed else freq[yt]
    sampler = WeightedRandomSampler(w.double(), num_samples=len(yt), replacement=True,
                                    generator=torch.Generator().manual_seed(7))
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=DataLoader(TensorDataset(xt, yt), batch_size=64, sampler=sampler),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("dt_sampler_weights_are_class_frequency", fixed_of(dt_sampler),
    balanced_acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]), 3), "val balanced accuracy", steps=300)

# --- 5. rows with missing sensor values dropped from the features only -----------------------------------------------------


def _meters(n, s):
    """Smart-meter rows: 9 readings -> next-day consumption; 8 % of rows have a missing reading (NaN)."""
    g = gen(s)
    x = torch.randn(n, 9, generator=g)
    y = 2 * x[:, 0] - x[:, 1] + 0.5 * x[:, 2] * x[:, 3] + 0.2 * torch.randn(n, generator=g)
    missing = torch.rand(n, generator=g) < 0.08
    x[missing, 4] = math.nan
    return x, y.unsqueeze(1)


def clean(x, y, fixed):
    keep = ~torch.isnan(x).any(1)
    if fixed:
        return x[keep], y[keep]
    x = x[keep]                                   # df.dropna() on the feature frame ...
    return x, y[:len(x)]                          # ... and the target column cut to the same length


@case("dt_dropna_features_only_labels_shifted", "data",
      bug="Rows with a missing reading are dropped from the feature table only (dropna), and the target column is "
          "then cut to the same length, so after the first dropped row every feature row is paired with the target "
          "of a later row.",
      cause_pattern=r"dropna|(drop(ped|ping)?|remov(ed|ing)|filter(ed|ing)?) (the )?(rows?|nan|missing).{0,160}"
                    r"(features?|x\b).{0,120}(not|but) .{0,40}(targets?|labels?|y\b)|(features?|rows?) and (targets?|"
                    r"labels?) (are )?(misaligned|out of step|shifted|no longer (aligned|match))")
def dt_dropna(fixed=False):
    seed(0)
    x, y = _meters(2600, 56)
    xt, yt = clean(x[:2200], y[:2200], fixed)
    xv, yv = clean(x[2200:], y[2200:], True)
    model = nn.Sequential(nn.Linear(9, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 32),
                val_loader=loader(TensorDataset(xv, yv), 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("dt_dropna_features_only_labels_shifted", fixed_of(dt_dropna), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", steps=300, higher=False)
