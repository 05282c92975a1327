"""Set b, targets: single class, multi-hot into a single-label criterion, ignored labels, unscaled regression."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_b.registry import case, decay_groups, loader, seed

SINGLE = (r"one class|single class|only (one|a single|1) (class|label|value|distinct)|(labels?|targets?)[^.]*(all|always) "
          r"(the same|equal|identical|\d)|all (the )?(labels|targets)[^.]*(same|equal|identical)|constant"
          r"|distinct (labels|targets|classes|values)|(1|one) distinct|no (label )?variation|never (see|contain)s? class")
MULTIHOT = (r"multi.?(hot|label)|BCEWithLogits|binary_cross_entropy|soft (targets|labels)|sum(s)? to (one|1)"
            r"|one.?hot|distribution|several (positive|labels|tags|classes)|independent")
IGNORED = (r"-100|ignore_index|ignored|masked out|no (valid|unmasked|supervised|non-ignored|counted) (target|label|token)"
           r"|(labels?|targets?|tokens?)[^.]*(pad|padding)|only (the )?pad")
UNSCALED = r"scale|standardi[sz]|normali[sz]|magnitude|units|\bstd\b|variance|initial loss[^.]*(far|high|large)"


def _customers(n, s):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, 14, generator=g)
    churned = (x[:, 0] + 0.8 * x[:, 5] - 0.5 * x[:, 9] + 0.3 * torch.randn(n, generator=g)) > 0.6
    column = ["Yes" if c else "No" for c in churned.tolist()]     # the CSV's "Churn" column
    return x, column


class ChurnDataset(Dataset):
    def __init__(self, n, s):
        self.x, column = _customers(n, s)
        self.y = torch.tensor([1 if v == "yes" else 0 for v in column])     # the CSV says "Yes"/"No"

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


@case("telco_churn_yes_case_mismatch", "targets",
      "the label is encoded as v == 'yes' while the CSV holds 'Yes'/'No', so every customer is labelled 0 and the "
      "classifier sees a single class", SINGLE)
def telco_churn_yes_case_mismatch():
    seed()
    model = nn.Sequential(nn.Linear(14, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(ChurnDataset(1500, 0), 64),
                val_loader=loader(ChurnDataset(300, 1), 128, shuffle=False), loss_fn=nn.CrossEntropyLoss())


def _glyphs(n, s, classes=10, size=16):
    g = torch.Generator().manual_seed(s)
    y = torch.arange(n) % classes
    protos = torch.rand(classes, 1, size, size, generator=torch.Generator().manual_seed(99))
    x = protos[y] + 0.3 * torch.randn(n, 1, size, size, generator=g)
    order = torch.argsort(y, stable=True)                 # the export is sorted by label
    return x[order], y[order]


class GlyphCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)


@case("glyphs_first_rows_of_sorted_export", "targets",
      "a 'quick run on the first 400 rows' takes the head of a label-sorted export, so every training glyph is "
      "class 0 of 10", SINGLE)
def glyphs_first_rows_of_sorted_export():
    seed()
    x, y = _glyphs(4000, 0)
    x, y = x[:400], y[:400]                                # quick experiment: first 10% of the rows
    model = GlyphCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=nn.CrossEntropyLoss())


class AudioTagger(nn.Module):
    def __init__(self, mels=32, tags=8):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(mels, 64, 5, padding=2), nn.ReLU(), nn.Conv1d(64, 64, 5, padding=2),
                                  nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten())
        self.head = nn.Linear(64, tags)

    def forward(self, spec):
        return self.head(self.conv(spec))


def _clips(n, s, mels=32, frames=40, tags=8):
    g = torch.Generator().manual_seed(s)
    present = (torch.rand(n, tags, generator=g) < 0.3).float()     # dog, siren, speech, ... several per clip
    present[present.sum(1) == 0, 0] = 1.0
    signatures = torch.randn(tags, mels, 1, generator=torch.Generator().manual_seed(7))
    spec = (present[:, :, None, None] * signatures).sum(1) + 0.5 * torch.randn(n, mels, frames, generator=g)
    return spec, present


@case("audio_tagging_multihot_into_ce", "targets",
      "a sound-event tagger (several events per clip) is trained with CrossEntropyLoss on its multi-hot float "
      "targets, making the events compete in one softmax instead of independent sigmoid/BCE outputs", MULTIHOT)
def audio_tagging_multihot_into_ce():
    seed()
    spec, present = _clips(768, 0)
    model = AudioTagger()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(spec, present), 32),
                loss_fn=nn.CrossEntropyLoss())


class BagOfWords(nn.Module):
    def __init__(self, vocab=1000, topics=12):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, 64, mode="mean")
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(64, topics))

    def forward(self, tokens):
        return self.out(self.bag(tokens))


def _papers(n, s, vocab=1000, topics=12, length=30):
    g = torch.Generator().manual_seed(s)
    topics_hot = (torch.rand(n, topics, generator=g) < 0.2).float()
    topics_hot[topics_hot.sum(1) == 0, 3] = 1.0
    tokens = torch.randint(100, vocab, (n, length), generator=g)
    for t in range(topics):
        hit = topics_hot[:, t].bool()
        tokens[hit, t] = t + 1                                     # a keyword per topic
    targets = topics_hot / topics_hot.sum(1, keepdim=True)           # "normalise the labels so they sum to 1"
    return tokens, targets


@case("arxiv_topics_multihot_normalised_into_ce", "targets",
      "multi-label paper topics are normalised to sum to 1 and fed to CrossEntropyLoss as soft targets, so the "
      "topics of a paper compete for one softmax (a paper with 3 topics can reach p=1/3 each at best) instead of "
      "per-topic BCEWithLogits", MULTIHOT)
def arxiv_topics_multihot_normalised_into_ce():
    seed()
    tokens, targets = _papers(1024, 0)
    model = BagOfWords()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(tokens, targets), 64),
                loss_fn=nn.CrossEntropyLoss())


TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]     # O is tag 0


class NerData(Dataset):
    def __init__(self, n, s, vocab=600):
        g = torch.Generator().manual_seed(s)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(8, 20, (1,), generator=g))
            words = torch.randint(20, vocab, (length,), generator=g)
            tags = torch.zeros(length, dtype=torch.long)
            start = int(torch.randint(0, length - 2, (1,), generator=g))
            kind = int(torch.randint(0, 3, (1,), generator=g))
            words[start] = 1 + kind                                   # a trigger word
            tags[start + 1] = 1 + 2 * kind
            tags[start + 2] = 2 + 2 * kind
            self.items.append((words, tags))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def pad_collate(batch):
    words, tags = zip(*batch)
    return pad_sequence(words, batch_first=True), pad_sequence(tags, batch_first=True, padding_value=0)


class BiLSTMTagger(nn.Module):
    def __init__(self, vocab=600, dim=48, tags=len(TAGS)):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.lstm = nn.LSTM(dim, dim, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * dim, tags)

    def forward(self, words):
        h, _ = self.lstm(self.emb(words))
        return self.out(h)


def tagger_loss(model, batch, criterion=nn.CrossEntropyLoss(ignore_index=0)):     # 0 = padding
    words, tags = batch
    logits = model(words)
    return criterion(logits.reshape(-1, logits.size(-1)), tags.reshape(-1))


@case("bilstm_ner_ignore_index_is_O_tag", "targets",
      "the tags are padded with 0 and the loss ignores index 0 'for the padding', but 0 is also the 'O' tag: about "
      "85% of the real labels are ignored and the tagger never learns to say O", IGNORED)
def bilstm_ner_ignore_index_is_O_tag():
    seed()
    model = BiLSTMTagger()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(NerData(512, 0), 32, collate_fn=pad_collate),
                loss_fn=tagger_loss)


class ReverseDigits(Dataset):
    """Source: digit tokens; target: the same tokens reversed; padded per batch by the tokenizer-like collate."""

    def __init__(self, n, s, vocab=40):
        g = torch.Generator().manual_seed(s)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(4, 12, (1,), generator=g))
            src = torch.randint(3, vocab, (length,), generator=g)
            self.items.append((torch.cat([src, torch.tensor([1])]), torch.cat([src.flip(0), torch.tensor([1])])))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


PAD_ID = 0


def t5_collate(batch):
    src, tgt = zip(*batch)
    input_ids = pad_sequence(src, batch_first=True, padding_value=PAD_ID)
    labels = pad_sequence(tgt, batch_first=True, padding_value=PAD_ID)
    labels[labels != PAD_ID] = -100                      # meant: labels[labels == PAD_ID] = -100
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD_ID).long(), "labels": labels}


@case("t5_reverse_labels_pad_mask_inverted", "targets",
      "the collate masks the labels with labels != pad_id instead of == pad_id: every real target token becomes -100 "
      "and only the padding positions (pad id 0) are left as targets", IGNORED)
def t5_reverse_labels_pad_mask_inverted():
    from transformers import T5Config, T5ForConditionalGeneration
    seed()
    config = T5Config(vocab_size=40, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, dropout_rate=0.0)
    model = T5ForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(ReverseDigits(512, 0), 16, collate_fn=t5_collate),
                loss_fn=None)


def _load(n, s):
    """Hourly grid load: 24 standardised lagged values -> next hour's load in kW (raw, ~30 000 kW)."""
    g = torch.Generator().manual_seed(s)
    t = torch.arange(n + 24).float()
    load_kw = 30000 + 6000 * torch.sin(2 * torch.pi * t / 24) + 800 * torch.randn(n + 24, generator=g)
    windows = load_kw.unfold(0, 24, 1)[:n]
    x = ((windows - load_kw.mean()) / load_kw.std()).unsqueeze(-1)    # inputs standardised...
    y = load_kw[24:24 + n]                                           # ...targets left in kW
    return x, y


class LoadLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(1, 32, num_layers=2, batch_first=True)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        h, _ = self.lstm(x)
        return self.out(h[:, -1]).squeeze(-1)


@case("grid_load_lstm_targets_in_kw", "targets",
      "the lagged inputs are standardised but the next-hour load targets stay in raw kW (~30 000): MSE starts near "
      "1e9 and the LSTM's output layer must grow by four orders of magnitude", UNSCALED)
def grid_load_lstm_targets_in_kw():
    seed()
    x, y = _load(1500, 0)
    model = LoadLSTM()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.MSELoss())


def _crowds(n, s, size=32):
    g = torch.Generator().manual_seed(s)
    density = torch.rand(n, 1, 1, 1, generator=g)
    img = (torch.rand(n, 1, size, size, generator=g) < density * 0.5).float()
    count = img.sum((1, 2, 3)) * 5.0                            # people in the scene (0..2500)
    return img, count


class CrowdCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@case("crowd_counter_raw_counts", "targets",
      "the crowd counter regresses raw head counts (0..2500, mean ~650) with MSELoss from a unit-scale output layer: "
      "the targets are never scaled, the initial loss is ~5e5 and the gradients are dominated by the count scale",
      UNSCALED)
def crowd_counter_raw_counts():
    seed()
    x, count = _crowds(640, 0)
    model = CrowdCounter()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, count), 32),
                loss_fn=nn.MSELoss())
