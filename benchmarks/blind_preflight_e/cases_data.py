"""Set e, family 5: data by content (overlapping splits, degenerate inputs, broken scaling, loaders and samplers
that drop or skew what is seen)."""

from __future__ import annotations

import math
from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler, random_split

from benchmarks.blind_preflight_e.registry import case, loader, seed, teacher_classes

FAMILY = "data"


def mlp(d_in, d_out, hidden=64):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, d_out))


def squeeze_mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x).squeeze(-1), y)


# --------------------------------------------------------------------------- 1. scans split by scan, not by patient


def load_series(n=5000, s=0):
    """Hourly load: daily and weekly cycles plus an AR(1) disturbance, standardised."""
    g = torch.Generator().manual_seed(s)
    t = torch.arange(n).float()
    ar = torch.zeros(n)
    eps = torch.randn(n, generator=g)
    for i in range(1, n):
        ar[i] = 0.9 * ar[i - 1] + 0.3 * eps[i]
    series = torch.sin(2 * math.pi * t / 24) + 0.5 * torch.sin(2 * math.pi * t / 168) + ar
    return (series - series.mean()) / series.std()


class Windows(torch.utils.data.Dataset):
    def __init__(self, series, window=48):
        self.series, self.window = series, window

    def __len__(self):
        return len(self.series) - self.window

    def __getitem__(self, i):
        return self.series[i:i + self.window], self.series[i + self.window]


def patient_scans(patients=200, per=8, s=0):
    """Eight scans per patient. Two dims carry the (noisy) disease marker; sixteen are the patient's anatomy and
    scanner signature, shared by all scans of that patient. The diagnosis is per patient."""
    g = torch.Generator().manual_seed(s)
    marker = torch.randn(patients, generator=g)
    diagnosis = ((marker + 1.0 * torch.randn(patients, generator=g)) > 0).long()
    signature = torch.randn(patients, 16, generator=g)
    pid = torch.arange(patients).repeat_interleave(per)
    x = torch.cat([marker[pid, None] + 0.3 * torch.randn(len(pid), 2, generator=g),
                   signature[pid] + 0.1 * torch.randn(len(pid), 16, generator=g)], 1)
    return x, diagnosis[pid], pid


@case("scans_split_by_scan_not_by_patient", FAMILY,
      "the 1600 scans of 200 patients (8 each, one diagnosis per patient) are split with random_split over scans: "
      "almost every validation patient also has scans in training, so the model is scored on patients whose "
      "diagnosis it memorised from their other scans; validation accuracy ~1.0 hides ~0.6 on new patients (split "
      "by patient, e.g. GroupShuffleSplit)",
      r"overlap|leak|(same|shared) (patients?|subjects?|groups?|ids?|individuals?)|group|patient|subject|near.?"
      r"duplicat|duplicat|(val|validation)[^.]*(train|training) (patients|subjects|samples|rows)")
def scans_split_by_scan_not_by_patient():
    seed(0)
    x, y, _ = patient_scans(s=41)
    train, val = random_split(TensorDataset(x, y), [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    model = mlp(18, 2, hidden=128)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(train, 64), val_loader=loader(val, 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 2. min-max scaling with the global min/max


def customer_table(n=3000, s=0):
    """Eight behavioural features (unit scale) and the account number as the last column (kept 'for joins')."""
    x, y = teacher_classes(n, 8, 2, s=s)
    account = torch.randint(10_000_000, 99_999_999, (n, 1), generator=torch.Generator().manual_seed(s + 1)).float()
    return torch.cat([x, account], 1), y


def minmax_global(X):
    return (X - X.min()) / (X.max() - X.min())          # BUG: one min/max for the whole table, not per column


@case("churn_minmax_scaled_with_global_min_max", FAMILY,
      "the min-max scaling uses X.min() and X.max() of the whole table instead of per column (axis 0); the account "
      "number column spans ~1e8, so every behavioural feature is squeezed into a band ~1e-7 wide around the same "
      "value: the inputs the model can use are practically constant",
      r"scal(e|ed|ing)|normali[sz]|min.?max|per.?(column|feature)|axis|(near|almost|nearly|practically)[- ]constant|"
      r"(tiny|small|narrow|negligible) (range|variance|spread|std)|(inputs?|features?|columns?)[^.]*(tiny|constant|"
      r"no variation|barely vary|do not vary|don't vary)")
def churn_minmax_scaled_with_global_min_max():
    seed(0)
    X, y = customer_table(s=42)
    X = minmax_global(X)
    model = mlp(9, 2)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(X[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(X[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 3. standardisation multiplies by the std


def plant_sensors(n=3000, s=0):
    """Ten sensors in their own units (stds from 0.01 to 1000) and a fault class from the standardised readings."""
    z, y = teacher_classes(n, 10, 3, s=s)
    scales = torch.logspace(-2, 3, 10)
    offsets = torch.linspace(-50, 400, 10)
    return z * scales + offsets, y


@case("sensor_standardise_multiplies_by_std", FAMILY,
      "the standardisation is written (X - mean) * std instead of / std: the sensors' stds run from 0.01 to 1000, so "
      "the 'standardised' columns have stds from 1e-4 to 1e6, ten orders of magnitude apart; the large columns swamp "
      "the first layer and the loss is huge and erratic",
      r"standardi[sz]|normali[sz]|scal(e|ed|ing)|magnitude|(large|huge|extreme|wide) (inputs?|features?|values?|"
      r"range)|(inputs?|features?|columns?)[^.]*(large|huge|range|magnitude|scale)|\bstd\b")
def sensor_standardise_multiplies_by_std():
    seed(0)
    X, y = plant_sensors(s=43)
    mean, std = X[:2560].mean(0), X[:2560].std(0)
    X = (X - mean) * std                                 # BUG: should divide
    model = mlp(10, 3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(X[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(X[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


# --------------------------------------------------------------------------- 4. drop_last with a batch larger than the data


@case("fewshot_drop_last_batch_larger_than_dataset", FAMILY,
      "the few-shot fine-tune has 40 labelled examples but keeps the pre-training loader settings batch_size=64, "
      "drop_last=True: the only batch is incomplete and dropped, so the training loader yields no batch at all and "
      "the 'training' runs zero steps",
      r"empty|no batch(es)?|zero batch|0 batch|drop_last|fewer (samples|examples|items|rows) than|(batch.?size)[^.]*("
      r"larger|bigger|exceeds|greater|more than)|len\([^)]*\) ?(==|is) ?0|yields? nothing|(zero|no|0) (steps|"
      r"iterations)")
def fewshot_drop_last_batch_larger_than_dataset():
    seed(0)
    x, y = teacher_classes(140, 20, 3, s=44)
    torch.manual_seed(7)                              # stands in for the pre-trained weights
    model = mlp(20, 3)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                train_loader=DataLoader(TensorDataset(x[:40], y[:40]), batch_size=64, shuffle=True, drop_last=True,
                                        generator=torch.Generator().manual_seed(0)),
                val_loader=loader(TensorDataset(x[40:], y[40:]), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


# --------------------------------------------------------------------------- text helpers


POS = ["great", "excellent", "love", "perfect", "recommend", "works", "happy", "sturdy"]
NEG = ["broken", "refund", "awful", "waste", "poor", "returned", "disappointed", "flimsy"]
FILLER = ["the", "it", "was", "this", "after", "a", "week", "and", "my", "with", "for", "very", "is", "i", "one",
          "box", "arrived", "use", "price", "quality", "battery", "screen", "cable", "size"]
TEMPLATE = "customer review for product in category electronics submitted via web form :".split()


def reviews(n, s=0, template=False):
    g = torch.Generator().manual_seed(s)
    texts, labels = [], []
    for _ in range(n):
        y = int(torch.randint(0, 2, (1,), generator=g))
        words = [FILLER[int(i)] for i in torch.randint(0, len(FILLER), (int(torch.randint(6, 14, (1,), generator=g)),),
                                                            generator=g)]
        cues = POS if y else NEG
        for _ in range(2):
            words.insert(int(torch.randint(0, len(words) + 1, (1,), generator=g)),
                         cues[int(torch.randint(0, len(cues), (1,), generator=g))])
        texts.append(" ".join((TEMPLATE if template else []) + words))
        labels.append(y)
    return texts, torch.tensor(labels)


class BagClassifier(nn.Module):
    def __init__(self, vocab, d=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.head = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, ids):
        keep = (ids != 0).float().unsqueeze(-1)
        return self.head((self.embed(ids) * keep).sum(1) / keep.sum(1).clamp(min=1))


def encode(texts, vocab, max_length):
    rows = []
    for t in texts:
        ids = [vocab.get(w, 1) for w in t.split()][:max_length]      # truncation to max_length, 1 = [UNK]
        rows.append(ids + [0] * (max_length - len(ids)))
    return torch.tensor(rows)


# --------------------------------------------------------------------------- 5. template prefix + truncation


@case("reviews_truncated_to_shared_template_prefix", FAMILY,
      "every exported review starts with the same 12-word form template ('customer review for product in category "
      "electronics submitted via web form :') and the tokenizer truncates to max_length=12 'to keep batches small': "
      "all training inputs are the identical template, the review text is cut off, and the labels cannot be learned",
      r"identical|same (inputs?|samples?|sequences?|tokens?|rows?|examples?)|truncat|constant (inputs?|features?)|"
      r"(inputs?|features?)[^.]*(constant|do not vary|don't vary|identical)|distinct|no variation|max_length")
def reviews_truncated_to_shared_template_prefix():
    seed(0)
    texts, y = reviews(3000, s=45, template=True)
    vocab = {w: i + 2 for i, w in enumerate(sorted({w for t in texts for w in t.split()}))}
    ids = encode(texts, vocab, max_length=12)
    model = BagClassifier(len(vocab) + 2)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(ids[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 6. vocabulary keyed by most_common() tuples


def build_vocab(texts, size=500):
    counts = Counter(w for t in texts for w in t.split())
    return {w: i + 2 for i, w in enumerate(counts.most_common(size))}     # BUG: keys are (word, count) tuples


@case("reviews_vocab_keyed_by_most_common_tuples", FAMILY,
      "the vocabulary is {w: i for i, w in enumerate(counts.most_common(500))}, whose keys are (word, count) tuples: "
      "no word string is ever found, so every token is encoded as [UNK] (id 1) and the inputs differ only in their "
      "length (padding)",
      r"\bunk\b|unknown|out.of.vocab|\bOOV\b|identical|same (inputs?|tokens?|ids?|sequences?)|(one|single|1) (distinct "
      r")?(token|id|value)|distinct (tokens?|ids?|inputs?|values)|constant")
def reviews_vocab_keyed_by_most_common_tuples():
    seed(0)
    texts, y = reviews(3000, s=46)
    vocab = build_vocab(texts[:2560])
    ids = encode(texts, vocab, max_length=16)
    model = BagClassifier(len(vocab) + 2)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(ids[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 7. sampler weights proportional to class counts


def fraud_table(n=6000, s=0):
    """Transactions, about 5% fraud; fraud rows have a shifted feature pattern."""
    g = torch.Generator().manual_seed(s)
    y = (torch.rand(n, generator=g) < 0.05).long()
    x = torch.randn(n, 16, generator=g)
    x[y == 1, :4] += 1.5
    return x, y


@case("fraud_sampler_weights_are_class_counts", FAMILY,
      "the 'balancing' WeightedRandomSampler gets weights = class_counts[labels] (each row weighted by its class's "
      "count) instead of 1 / class_counts[labels]: the 95% class is up-weighted 19x more, so fraud is drawn ~0.3% of "
      "the time instead of 50% and the classifier almost never sees a positive",
      r"WeightedRandomSampler|sampler|inverse|(minority|rare|positive|fraud) (class|rows|samples|examples)[^.]*(rare|"
      r"never|seldom|under|few|almost)|imbalanc|class (frequency|balance|distribution|weights?)")
def fraud_sampler_weights_are_class_counts():
    seed(0)
    x, y = fraud_table(s=47)
    tx, ty = x[:5000], y[:5000]
    class_counts = torch.bincount(ty).float()
    weights = class_counts[ty]                                 # BUG: should be 1.0 / class_counts[ty]
    sampler = WeightedRandomSampler(weights, num_samples=len(ty), replacement=True,
                                    generator=torch.Generator().manual_seed(0))
    model = mlp(16, 2)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=DataLoader(TensorDataset(tx, ty), batch_size=64, sampler=sampler),
                val_loader=loader(TensorDataset(x[5000:], y[5000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)
