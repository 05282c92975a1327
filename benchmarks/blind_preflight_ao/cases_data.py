"""Data: the text pipeline (bucketing, vocabulary, stop words, ordering, truncation) destroys the signal before the
model sees it; every batch still has the right shapes and dtypes."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ao.registry import (
    PAD,
    UNK,
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    keyword_texts,
    loader,
    seed,
)


def _argmax(m, b):
    return m(b[0]).argmax(-1), b[-1]


class MeanBag(nn.Module):
    """Embedding + masked mean pooling + MLP: a fastText-style text classifier."""

    def __init__(self, vocab, n_classes):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32, padding_idx=PAD)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, n_classes))

    def forward(self, ids):
        keep = (ids != PAD).unsqueeze(-1).float()
        pooled = (self.emb(ids) * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return self.mlp(pooled)


class GRUText(nn.Module):
    def __init__(self, vocab, n_classes):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32, padding_idx=PAD)
        self.rnn = nn.GRU(32, 48, batch_first=True)
        self.head = nn.Linear(48, n_classes)

    def forward(self, ids):
        return self.head(self.rnn(self.emb(ids))[1][-1])


# --- 1. documents sorted by length for bucketing, labels left in the original order --------------------------------
def ragged_docs(n, s):
    x, y, lens = keyword_texts(n, 30, 60, 4, s=s, lengths=(4, 30))
    return [row[:int(k)] for row, k in zip(x, lens)], y


@case("data_bucketing_sorts_texts_only", "data",
      bug="To bucket by length the news pipeline sorts the tokenised documents with docs.sort(key=len) but leaves "
          "the label list in its original order, so after sorting almost every document is paired with another "
          "document's label.",
      cause_pattern=r"sort\w* (the )?(tokeni[sz]ed )?(texts?|docs?|documents?|sentences?|inputs?).{0,80}(label|target)|"
                    r"(label|target)s?.{0,80}(not|never) (sorted|reordered|permuted)|"
                    r"(label|target)s? (are |is )?(left )?(in (the|their|its) original order|out of order)|"
                    r"(paired|matched) with (an)?other (document|text|sample)'s label|"
                    r"(texts?|documents?|inputs?) and (their )?(label|target)s? (are |were )?(misaligned|mismatched|out of sync)")
def bucketing_sorts_texts_only(fixed=False):
    seed(0)
    docs, y = ragged_docs(1600, s=51)
    train_docs, train_y = docs[:1200], y[:1200]
    if fixed:
        order = sorted(range(len(train_docs)), key=lambda i: len(train_docs[i]))
        train_docs, train_y = [train_docs[i] for i in order], train_y[order]
    else:
        train_docs = sorted(train_docs, key=len)
    x_train = pad_sequence(train_docs, batch_first=True, padding_value=PAD)
    x_val = pad_sequence(docs[1200:], batch_first=True, padding_value=PAD)
    model = MeanBag(60, 4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x_train, train_y), 32),
                val_loader=loader(TensorDataset(x_val, y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("data_bucketing_sorts_texts_only", fixed_of(bucketing_sorts_texts_only), acc_of(_argmax), "val accuracy",
    steps=250)


# --- 2. vocabulary built on lower-cased text, lookup not lower-cased --------------------------------------------------
PRODUCTS = ["Kindle", "Echo", "Roomba", "Pixel", "Switch"]


def filler_words(k=40):
    g = gen(52)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(letters[int(i)] for i in torch.randint(0, 26, (4,), generator=g)) for _ in range(k)]


def support_tickets(n, s):
    g = gen(s)
    words = filler_words()
    texts, labels = [], []
    for _ in range(n):
        toks = [words[int(i)] for i in torch.randint(0, len(words), (12,), generator=g)]
        label = int(torch.randint(0, len(PRODUCTS), (1,), generator=g))
        toks[int(torch.randint(0, 12, (1,), generator=g))] = PRODUCTS[label]
        texts.append(" ".join(toks))
        labels.append(label)
    return texts, torch.tensor(labels)


def build_vocab(texts):
    vocab = {"<pad>": PAD, "<unk>": UNK}
    for t in texts:
        for w in t.lower().split():
            vocab.setdefault(w, len(vocab))
    return vocab


def encode(texts, vocab, lower):
    return torch.tensor([[vocab.get(w.lower() if lower else w, UNK) for w in t.split()] for t in texts])


@case("data_vocab_lowercased_lookup_cased", "data",
      bug="The ticket router builds its vocabulary from text.lower().split() but encodes with vocab.get(word, UNK) "
          "on the original casing, so every capitalised product name, the only words that decide the label, "
          "becomes <unk>.",
      cause_pattern=r"\.lower\(\)|lower-?cas\w*|cas(e|ing)[- ](mismatch|sensitiv|insensitiv)|<unk>|"
                    r"\bunk(nown)? (token|id|word)s?\b|out[- ]of[- ]vocab")
def vocab_lowercased_lookup_cased(fixed=False):
    seed(0)
    texts, y = support_tickets(1500, s=53)
    vocab = build_vocab(texts[:1200])
    x = encode(texts, vocab, lower=fixed)
    model = MeanBag(len(vocab), len(PRODUCTS))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("data_vocab_lowercased_lookup_cased", fixed_of(vocab_lowercased_lookup_cased), acc_of(_argmax),
    "val accuracy", steps=250)


# --- 3. stop-word list removes the negations ------------------------------------------------------------------------
STOPWORDS = {"the", "a", "an", "was", "is", "it", "this", "and", "of", "i", "very", "not", "no", "never", "nor"}
POSITIVE = ["good", "great", "fun", "moving", "sharp"]
NEGATIVE = ["bad", "dull", "weak", "boring", "messy"]


def reviews(n, s):
    g = gen(s)
    fillers = ["the", "a", "was", "is", "it", "this", "and", "of", "i", "very"] + filler_words(20)
    texts, labels = [], []
    for _ in range(n):
        toks = [fillers[int(i)] for i in torch.randint(0, len(fillers), (10,), generator=g)]
        positive = bool(torch.rand((), generator=g) < 0.5)
        adj = (POSITIVE if positive else NEGATIVE)[int(torch.randint(0, 5, (1,), generator=g))]
        negated = bool(torch.rand((), generator=g) < 0.5)
        p = int(torch.randint(1, 10, (1,), generator=g))
        toks[p] = adj
        if negated:
            toks[p - 1] = "not"
        texts.append(toks)
        labels.append(int(positive != negated))
    return texts, torch.tensor(labels)


def clean_and_encode(texts, drop_negations, width=12):
    stop = STOPWORDS if drop_negations else STOPWORDS - {"not", "no", "never", "nor"}
    kept = [[w for w in t if w not in stop] for t in texts]
    vocab = {"<pad>": PAD, "<unk>": UNK}
    for t in kept:
        for w in t:
            vocab.setdefault(w, len(vocab))
    ids = torch.zeros(len(kept), width, dtype=torch.long)
    for i, t in enumerate(kept):
        ids[i, :len(t)] = torch.tensor([vocab[w] for w in t])
    return ids, len(vocab)


@case("data_stopwords_drop_negation", "data",
      bug="The review preprocessing removes an NLTK-style English stop-word list that contains 'not', 'no' and "
          "'never', so 'not good' and 'good' become the same input and the negated half of the reviews cannot be "
          "classified.",
      cause_pattern=r"stop[- ]?words?|negations? (are |were )?(removed|dropped|stripped|filtered|lost)|"
                    r"(remov|dropp|strip|filter)\w*.{0,40}(negation|\b(not|no|never)\b)|\bnot\b.{0,40}(removed|dropped|stripped|filtered)")
def stopwords_drop_negation(fixed=False):
    seed(0)
    texts, y = reviews(1600, s=54)
    x, vocab = clean_and_encode(texts, drop_negations=not fixed)
    model = GRUText(vocab, 2)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("data_stopwords_drop_negation", fixed_of(stopwords_drop_negation), acc_of(_argmax), "val accuracy",
    steps=300)


# --- 4. corpus concatenated class by class, DataLoader without shuffle -------------------------------------------------
@case("data_class_blocks_no_shuffle", "data",
      bug="The topic corpus is concatenated one class file after another and the training DataLoader has "
          "shuffle=False, so each batch holds a single class and the model is dragged to whichever class block it "
          "saw last.",
      cause_pattern=r"(sorted|ordered|grouped|concatenated|arranged)\w* (by|per|one) (class|label|topic)|"
                    r"(class|label|topic)[- ]?(sorted|ordered|blocks?|after (class|label|topic))|"
                    r"single[- ](class|label) batch|(one|same|single) (class|label) (per|in each|in every) batch|"
                    r"(each|every) batch (holds|contains|has) (only )?(one|a single) (class|label)")
def class_blocks_no_shuffle(fixed=False):
    seed(0)
    x, y, _ = keyword_texts(1600, 20, 60, 4, s=55)
    order = torch.argsort(y[:1200], stable=True)                  # file per class, concatenated
    train = TensorDataset(x[:1200][order], y[:1200][order])
    model = MeanBag(60, 4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32, shuffle=fixed),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("data_class_blocks_no_shuffle", fixed_of(class_blocks_no_shuffle), acc_of(_argmax), "val accuracy", steps=250)


# --- 5. tokenizer truncation to max_length=8 on 48-token documents ---------------------------------------------------
def truncate(x, max_length):
    return x[:, :max_length].clone()


@case("data_truncation_max_length_too_short", "data",
      bug="The legal-clause classifier tokenises with truncation=True, max_length=8 (a leftover from a debug run) "
          "on 48-token clauses, so the deciding term, anywhere in the clause, is cut off in five of six "
          "documents.",
      cause_pattern=r"truncat\w*|max_length|max_len|cut off|(sequence|input) length.{0,40}(too short|short)|"
                    r"(first|only) \d+ tokens")
def truncation_max_length_too_short(fixed=False):
    seed(0)
    x, y, _ = keyword_texts(1600, 48, 60, 4, s=56)
    x = truncate(x, 48 if fixed else 8)
    model = MeanBag(60, 4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("data_truncation_max_length_too_short", fixed_of(truncation_max_length_too_short), acc_of(_argmax),
    "val accuracy", steps=250)
