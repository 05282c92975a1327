"""Set q, family "what_is_trained": the parameters the optimizer updates are not the ones the model needs trained."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_q.registry import broken, loader, rng, seed

# ---------------------------------------------------------------------------------------------------------------
# 1. Ad click-through: a factorization machine whose factor matrix is a plain tensor attribute.

FIELDS = (10, 12, 3, 4)  # user group, item category, device, hour bucket


def ad_impressions(n: int, s: int):
    """One-hot field vectors (n, 29); the click depends on the user-group x item-category interaction."""
    g = rng(s)
    u_lat, i_lat = g.normal(size=(FIELDS[0], 4)), g.normal(size=(FIELDS[1], 4))
    cols = [g.integers(0, k, size=n) for k in FIELDS]
    x = np.zeros((n, sum(FIELDS)), np.float32)
    offset = 0
    for c, k in zip(cols, FIELDS):
        x[np.arange(n), offset + c] = 1.0
        offset += k
    logit = 1.5 * (u_lat[cols[0]] * i_lat[cols[1]]).sum(1) + 0.2 * (cols[2] - 1)
    y = (g.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y)


class FactorizationMachine(nn.Module):
    def __init__(self, n_features: int = 29, k: int = 8, factors_as_parameter: bool = False):
        super().__init__()
        self.linear = nn.Linear(n_features, 1)
        if factors_as_parameter:
            self.V = nn.Parameter(torch.randn(n_features, k) * 0.1)
        else:
            self.V = torch.randn(n_features, k) * 0.1
            self.V.requires_grad_()

    def forward(self, x):
        V = self.V.to(x.device)
        xv, x2v2 = x @ V, (x * x) @ (V * V)
        interactions = 0.5 * (xv.pow(2) - x2v2).sum(1, keepdim=True)
        return (self.linear(x) + interactions).squeeze(1)


@broken("ctr_fm_factors_plain_tensor", "what_is_trained",
        "The factorization machine stores its interaction factors as a plain tensor (self.V = torch.randn(...) * 0.1; "
        "self.V.requires_grad_()), not an nn.Parameter: V is not in model.parameters(), the optimizer never updates "
        "it, and the user x item interactions the clicks depend on stay random.",
        "self.V = nn.Parameter(torch.randn(n_features, k) * 0.1)",
        "https://openillumi.com/?p=120695",
        r"nn\.parameter|register_parameter|register_buffer|not (a |an )?(registered|nn\.parameter|parameter)\b|"
        r"plain (torch\.)?tensor|tensor attribute|not (registered|included|listed) (in|with|by) (the )?(model|module|"
        r"parameters)|not in (model\.)?(named_)?parameters\(\)|\bV\b.{0,60}(not|never) (updated|trained|optimi[sz]ed|"
        r"registered)|(unregistered|untracked) (tensor|weight|factor)")
def ctr_fm_factors_plain_tensor(fixed: bool = False):
    seed(20)
    x, y = ad_impressions(6000, 111)
    model = FactorizationMachine(factors_as_parameter=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x[:4800], y[:4800]), 128),
                val_loader=loader(TensorDataset(x[4800:], y[4800:]), 400, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 2. Multi-horizon demand forecast: per-horizon heads made with list multiplication.


def demand_windows(n: int, s: int, lookback: int = 24, horizon: int = 6):
    """Hourly demand made of two seasonal components; inputs the last 24 hours, targets the next 6."""
    g = rng(s)
    t = np.arange(lookback + horizon)[None, :]
    p1, p2 = g.uniform(8, 30, size=(n, 1)), g.uniform(3, 8, size=(n, 1))
    series = (np.sin(2 * np.pi * t / p1 + g.uniform(0, 6.3, (n, 1)))
              + 0.5 * np.sin(2 * np.pi * t / p2 + g.uniform(0, 6.3, (n, 1))) + 0.05 * g.normal(size=(n, t.shape[1])))
    x, y = series[:, :lookback], series[:, lookback:]
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)


class MultiHorizonForecaster(nn.Module):
    def __init__(self, horizons: int = 6, separate_heads: bool = False):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        if separate_heads:
            self.heads = nn.ModuleList([nn.Linear(64, 1) for _ in range(horizons)])
        else:
            self.heads = nn.ModuleList([nn.Linear(64, 1)] * horizons)

    def forward(self, x):
        z = self.trunk(x)
        return torch.cat([head(z) for head in self.heads], dim=1)


@broken("horizon_heads_list_multiplied", "what_is_trained",
        "The six per-horizon heads are built as nn.ModuleList([nn.Linear(64, 1)] * horizons): list multiplication "
        "repeats one Linear object, so every horizon shares a single head and the model predicts the same value for "
        "hours t+1 ... t+6.",
        "self.heads = nn.ModuleList([nn.Linear(64, 1) for _ in range(horizons)])",
        "https://github.com/acids-ircam/ddsp_pytorch/issues/37",
        r"\] ?\* ?(\d|horizons|n\b)|list multiplication|(same|single|one) (nn\.)?(linear|module|layer|head) "
        r"(instance|object)|(share|shares|shared|sharing) (one|a single|the same) (head|layer|linear|module|weights?)|"
        r"heads? .{0,60}(are |is )?(the same|identical|one) (object|instance|module)|(is|are) (the )?same "
        r"(python )?object|\bid\(")
def horizon_heads_list_multiplied(fixed: bool = False):
    seed(21)
    x, y = demand_windows(3000, 121)
    model = MultiHorizonForecaster(separate_heads=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 3. ECG beat classification: the optimizer holds the parameters of a model object that was then re-created.


def ecg_beats(n: int, s: int, length: int = 64):
    """Single-lead beats (n, 1, 64): 0 normal (narrow upright QRS), 1 ventricular (wide, inverted),
    2 fibrillation-like (narrow QRS on a fast irregular baseline)."""
    g = rng(s)
    t = np.arange(length)[None, :]
    labels = g.integers(0, 3, size=n)
    centre = 32 + g.integers(-6, 7, size=(n, 1))
    width = np.where(labels == 1, 5.0, 1.5)[:, None]
    sign = np.where(labels == 1, -1.0, 1.0)[:, None]
    x = sign * np.exp(-0.5 * ((t - centre) / width) ** 2)
    fib = 0.35 * np.sin(2 * np.pi * t / g.uniform(3, 5, size=(n, 1)) + g.uniform(0, 6.3, size=(n, 1)))
    x = x + np.where(labels[:, None] == 2, fib, 0.0) + 0.12 * g.normal(size=x.shape)
    return torch.tensor(x[:, None, :], dtype=torch.float32), torch.from_numpy(labels)


class ECGNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv1d(1, 8, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
                                      nn.Conv1d(8, 16, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
                                      nn.Flatten())
        self.classifier = nn.Linear(16, 3)

    def forward(self, x):
        return self.classifier(self.features(x))


@broken("ecg_model_reinstantiated", "what_is_trained",
        "The optimizer is built on a first ECGNet() and the model is then re-created (the 'model = ECGNet()' cell run "
        "again to reset the weights): the optimizer holds the old instance's parameters, so the model being trained "
        "is never updated.",
        "build the optimizer after the last model = ECGNet(): optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)",
        "https://github.com/spro/practical-pytorch/issues/9",
        r"re-?(created|instantiated|built|initiali[sz]ed|constructed)|instantiated twice|created twice|(new|another|"
        r"second|different|separate) (model )?(instance|object|copy)|(old|previous|stale|first|other|earlier) "
        r"(model|instance|copy|network)'?s? (param|weight)|none of the (model'?s? )?(param|weight)\w* (are|is) "
        r"(in|held by|updated by) the optimi[sz]er|optimi[sz]er (holds|has|contains|references|tracks) (no|none of "
        r"the|only other|different) .{0,40}(param|weight|tensor)|no (model )?param\w* (of the model )?(is|are) in "
        r"the optimi[sz]er")
def ecg_model_reinstantiated(fixed: bool = False):
    seed(22)
    x, y = ecg_beats(1800, 131)
    model = ECGNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    if not fixed:
        model = ECGNet()  # re-run of the model cell ("start from fresh weights")
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:1400], y[:1400]), 64),
                val_loader=loader(TensorDataset(x[1400:], y[1400:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=250)


# ---------------------------------------------------------------------------------------------------------------
# 4. Clinical-note triage: token embeddings from nn.Embedding.from_pretrained, frozen by default.

VOCAB, EMB_DIM = 400, 8


def clinical_notes(n: int, s: int, length: int = 20):
    """Notes of 20 term ids (1..399); 200 terms carry an urgency polarity, label 1 when the note is urgent.
    Pretrained vectors exist for 40 general-domain terms only; the rest get random rows."""
    g = rng(s)
    polarity = np.zeros(VOCAB)
    polar = g.choice(np.arange(1, VOCAB), size=200, replace=False)
    polarity[polar] = g.choice([-1.0, 1.0], size=200)
    ids = np.zeros((n, length), np.int64)
    labels = np.zeros(n, np.int64)
    i = 0
    while i < n:
        toks = g.integers(1, VOCAB, size=length)
        score = polarity[toks].sum()
        if score == 0:
            continue
        ids[i], labels[i] = toks, int(score > 0)
        i += 1
    vectors = g.normal(0, 0.6, size=(VOCAB, EMB_DIM))  # out-of-vocabulary rows: random init
    vectors[g.choice(VOCAB, 40, replace=False)] = g.normal(0, 0.3, size=(40, EMB_DIM))  # "GloVe" rows
    vectors[0] = 0.0
    return torch.from_numpy(ids), torch.from_numpy(labels), torch.tensor(vectors, dtype=torch.float32)


class NoteClassifier(nn.Module):
    def __init__(self, vectors: torch.Tensor, fine_tune: bool):
        super().__init__()
        if fine_tune:
            self.embedding = nn.Embedding.from_pretrained(vectors, freeze=False, padding_idx=0)
        else:
            self.embedding = nn.Embedding.from_pretrained(vectors, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(EMB_DIM, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, ids):
        return self.mlp(self.embedding(ids).mean(1))


@broken("clinical_embeddings_from_pretrained_frozen", "what_is_trained",
        "The term embeddings are built with nn.Embedding.from_pretrained(vectors), whose default freeze=True keeps "
        "them fixed, while 90% of the rows are random vectors for clinical terms missing from the pretrained "
        "vocabulary: those embeddings are never trained.",
        "nn.Embedding.from_pretrained(vectors, freeze=False, padding_idx=0)",
        "https://github.com/RUCAIBox/RecBole/issues/2046",
        r"from_pretrained|freeze ?= ?(true|false)|embedding\w*(\.weight)?\W.{0,80}(frozen|requires_grad ?= ?false|"
        r"not (be )?(updated|trained|fine-?tuned))|(frozen|untrained|never trained|fixed) .{0,40}embedding")
def clinical_embeddings_from_pretrained_frozen(fixed: bool = False):
    seed(23)
    ids, y, vectors = clinical_notes(3000, 141)
    model = NoteClassifier(vectors, fine_tune=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(ids[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(ids[2400:], y[2400:]), 300, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


# ---------------------------------------------------------------------------------------------------------------
# 5. Sound-event tagging: the head reads an embedding captured by a forward hook that detaches it.


def sound_events(n: int, s: int, length: int = 128):
    """Mono clips (n, 1, 128): a windowed tone burst at a random time; class = one of 6 tone frequencies."""
    g = rng(s)
    t = np.arange(length)[None, :]
    labels = g.integers(0, 6, size=n)
    freq = np.array([0.04, 0.07, 0.10, 0.14, 0.19, 0.25])[labels][:, None]
    onset = g.integers(0, length - 48, size=(n, 1))
    env = np.exp(-0.5 * ((t - onset - 24) / 10.0) ** 2)
    x = env * np.sin(2 * np.pi * freq * t + g.uniform(0, 6.3, size=(n, 1))) + 0.3 * g.normal(size=(n, length))
    return torch.tensor(x[:, None, :], dtype=torch.float32), torch.from_numpy(labels)


class EventTagger(nn.Module):
    def __init__(self, keep_graph: bool):
        super().__init__()
        self.keep_graph = keep_graph
        self.encoder = nn.Sequential(nn.Conv1d(1, 16, 9, stride=2, padding=4), nn.ReLU(),
                                     nn.Conv1d(16, 16, 9, stride=2, padding=4), nn.ReLU(),
                                     nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 4))
        self.head = nn.Linear(4, 6)
        self._captured = {}
        self.encoder.register_forward_hook(self._capture)

    def _capture(self, module, inputs, output):
        # from the embedding-extraction snippet we use for t-SNE plots
        self._captured["embedding"] = output if self.keep_graph else output.detach()

    def forward(self, x):
        self.encoder(x)
        return self.head(self._captured.pop("embedding"))


@broken("audio_hook_detached_embedding", "what_is_trained",
        "The classifier head reads the encoder's embedding from a forward hook that stores output.detach(), so no "
        "gradient ever reaches the encoder: the convolutional encoder stays at its random initialization and only "
        "the 4-to-6 head is trained.",
        "self._captured['embedding'] = output  # no .detach() in the hook the head reads from",
        "https://github.com/lucidrains/CoCa-pytorch/issues/6",
        r"detach|no_grad|(cut|cuts|severed|breaks?|disconnected|outside) (from |of )?(the )?(autograd |computation(al)? )?"
        r"graph|(forward )?hook.{0,80}(stores?|saves?|caches?|keeps?|captures?)|encoder.{0,80}(no|zero|none|never "
        r"(get|receive)s?) (gradient|grad|updates?)|(no|zero) grad\w* (reaches|flows? (to|into|back to|through)) "
        r"(the )?encoder|encoder .{0,40}(never|not) (updated|trained|changes?)")
def audio_hook_detached_embedding(fixed: bool = False):
    seed(24)
    x, y = sound_events(2000, 151)
    model = EventTagger(keep_graph=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 64),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)
