"""Set bb, family what_is_trained: which weights the optimizer actually moves."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from benchmarks.blind_preflight_bb.registry import acc_of, case, fix, fixed_of, seed
from benchmarks.blind_preflight_bb.synth import markov_sessions, nuisance_mels, tensors


def argmax_acc():
    return acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


class SessionGRU(nn.Module):
    def __init__(self, n_items, d=32):
        super().__init__()
        self.emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, n_items + 1)

    def forward(self, seq):
        return self.out(self.gru(self.emb(seq))[0][:, -1])


# ---------------------------------------------------------------- 1. model re-built after the optimizer


@case("sasrec_model_rebuilt_after_optimizer", "what_is_trained",
      "The optimizer is built on a placeholder model made before the item vocabulary was counted; the model is then "
      "rebuilt as SessionGRU(n_items=len(item2id)), so the optimizer steps the old model's parameters and the model "
      "that is trained and evaluated never changes.",
      r"optimi[sz]er.{0,80}(old|previous|stale|placeholder|different|another|other|first|earlier|before).{0,40}"
      r"(model|instance|parameters|object)|(re-?creat|re-?build|rebuilt|re-?instantiat|re-?assign|replac).{0,60}"
      r"(model|after).{0,60}optimi[sz]er|parameters?.{0,60}not (in|part of|registered with|known to) the optimi[sz]er|"
      r"(build|create|construct).{0,30}optimi[sz]er.{0,30}after|never (updated|change|move)|no parameter.{0,40}"
      r"(update|change|moved)")
def sasrec_model_rebuilt_after_optimizer(fixed=False):
    seed(0)
    full = markov_sessions(3000, 60, 7, 21)
    seq, target = full[:, :6], full[:, 6]
    item2id = {i: i for i in range(1, 61)}
    model = SessionGRU(n_items=50)                      # placeholder size, before the vocabulary is counted
    optimizer = torch.optim.Adam(model.parameters(), 3e-3)
    model = SessionGRU(n_items=len(item2id))            # the real size
    if fixed:
        optimizer = torch.optim.Adam(model.parameters(), 3e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=tensors(seq[:2400], target[:2400]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(seq[2400:], target[2400:], shuffle=False), max_steps=300)


fix("sasrec_model_rebuilt_after_optimizer", fixed_of(sasrec_model_rebuilt_after_optimizer), argmax_acc(),
    "val next-item accuracy")

# ---------------------------------------------------------------- 2. numpy round trip inside forward


class FrontEndNet(nn.Module):
    """A learnable 32 -> 4 band projection (a "learnable filterbank"), per-clip standardisation, then a small head."""

    def __init__(self, n_cls, numpy_norm):
        super().__init__()
        self.numpy_norm = numpy_norm
        self.frontend = nn.Linear(32, 4)
        self.head = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, n_cls))

    def forward(self, x):  # (B, 32, T)
        z = self.frontend(x.transpose(1, 2)).mean(1)      # (B, 4)
        if self.numpy_norm:                               # librosa-style util, written for numpy arrays
            a = z.detach().cpu().numpy()
            a = (a - a.mean(0, keepdims=True)) / (a.std(0, keepdims=True) + 1e-5)
            z = torch.from_numpy(a).to(x.device)
        else:
            z = (z - z.mean(0, keepdim=True)) / (z.std(0, keepdim=True, unbiased=False) + 1e-5)
        return self.head(z)


@case("frontend_cut_by_numpy_roundtrip", "what_is_trained",
      "The forward converts the learnable filterbank's output to numpy (.detach().cpu().numpy()) for a standardisation "
      "written in numpy and back with torch.from_numpy, which cuts the autograd graph: the 32 -> 4 front end never "
      "gets a gradient and stays a random projection that mixes the loud interferers into the class bands.",
      r"numpy|from_numpy|detach|(graph|autograd).{0,40}(cut|broken|break|disconnect)|no grad(ient)?s?.{0,60}"
      r"(frontend|front end|filterbank|first layer|layers? before)|(frontend|front end|filterbank|first layer)"
      r".{0,80}((no|zero|none) grad|never (receives?|gets?) (a )?grad|not (updated|trained)|random projection)")
def frontend_cut_by_numpy_roundtrip(fixed=False):
    seed(0)
    x, y = nuisance_mels(1800, 8, 22)
    x = (x - x.mean()) / x.std()
    model = FrontEndNet(8, numpy_norm=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(x[:1400], y[:1400]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(x[1400:], y[1400:], shuffle=False), max_steps=300)


fix("frontend_cut_by_numpy_roundtrip", fixed_of(frontend_cut_by_numpy_roundtrip), argmax_acc(), "val accuracy")

# ---------------------------------------------------------------- 3. pretrained weights silently not loaded


class ProbeNet(nn.Module):
    def __init__(self, n_cls):
        super().__init__()
        self.frontend = nn.Linear(32, 4)
        self.head = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, n_cls))

    def forward(self, x):
        return self.head(torch.relu(self.frontend(x.transpose(1, 2))).mean(1))


def pretrained_frontend_state():
    """The checkpoint a DataParallel run saved: a front end that reads the even (class) bands in a 4-bit code."""
    w = torch.zeros(4, 32)
    for k in range(8):
        for bit in range(3):
            if (k >> bit) & 1:
                w[bit, 2 + 2 * k] = 1.0
        w[3, 2 + 2 * k] = 1.0
    bias = 4.0 * (w > 0).sum(1).float() + 1.0     # background bands sit near -4: read 0 unless a class tone is on
    return {"module.frontend.weight": w, "module.frontend.bias": bias}


@case("probe_pretrained_not_loaded", "what_is_trained",
      "The front end is frozen for a linear probe after load_state_dict(ckpt, strict=False), but the checkpoint's keys "
      "carry the 'module.' prefix of nn.DataParallel, so nothing is loaded (every key is unexpected) and the probe "
      "trains on a frozen random front end.",
      r"module\.|prefix|strict ?= ?False|missing[_ ]keys|unexpected[_ ]keys|(weights?|checkpoint|state[_ ]dict|"
      r"pretrained).{0,60}(not|never|silently not|weren't|wasn't) (been )?(loaded|applied)|nothing (was )?loaded|"
      r"(frozen|requires_grad ?= ?False).{0,80}random|random(ly initiali[sz]ed)?.{0,40}frozen")
def probe_pretrained_not_loaded(fixed=False):
    seed(0)
    x, y = nuisance_mels(1800, 8, 23)
    model = ProbeNet(8)
    ckpt = pretrained_frontend_state()
    if fixed:
        ckpt = {k.removeprefix("module."): v for k, v in ckpt.items()}
    model.load_state_dict(ckpt, strict=False)
    model.frontend.requires_grad_(False)
    return dict(model=model, optimizer=torch.optim.Adam(model.head.parameters(), 3e-3),
                train_loader=tensors(x[:1400], y[:1400]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(x[1400:], y[1400:], shuffle=False), max_steps=300)


fix("probe_pretrained_not_loaded", fixed_of(probe_pretrained_not_loaded), argmax_acc(), "val accuracy")

# ---------------------------------------------------------------- 4. Embedding.from_pretrained freezes by default


class CategoryInitGRU(nn.Module):
    def __init__(self, init_vectors, n_items, freeze):
        super().__init__()
        if freeze is None:
            self.emb = nn.Embedding.from_pretrained(init_vectors, padding_idx=0)
        else:
            self.emb = nn.Embedding.from_pretrained(init_vectors, freeze=freeze, padding_idx=0)
        d = init_vectors.shape[1]
        self.gru = nn.GRU(d, 64, batch_first=True)
        self.out = nn.Linear(64, n_items + 1)

    def forward(self, seq):
        return self.out(self.gru(self.emb(seq))[0][:, -1])


def category_vectors(n_items, n_cat, s):
    """Item vectors initialised from item metadata: the one-hot of the item's category (row 0: padding)."""
    cat = torch.randint(0, n_cat, (n_items,), generator=torch.Generator().manual_seed(s))
    v = torch.zeros(n_items + 1, n_cat)
    v[torch.arange(1, n_items + 1), cat] = 1.0
    return v


@case("item_embeddings_frozen_from_pretrained", "what_is_trained",
      "The item embeddings are initialised from category one-hots with nn.Embedding.from_pretrained(vectors), whose "
      "freeze=True default keeps them fixed: items of one category stay identical, so the next item, which depends on "
      "the item and not its category, cannot be told apart.",
      r"from_pretrained|freeze ?= ?(True|False)|(embedding|item vector)s?.{0,60}(frozen|not (trained|updated|"
      r"learn)|requires_grad ?= ?False|never (change|update))|(frozen|requires_grad ?= ?False).{0,60}embedding|"
      r"identical (item )?(embedding|vector)s?")
def item_embeddings_frozen_from_pretrained(fixed=False):
    seed(0)
    g = torch.Generator().manual_seed(24)
    seq = torch.randint(1, 81, (3000, 5), generator=g)           # browsing, then the item that decides what's next
    target = torch.randperm(80, generator=g)[seq[:, -1] - 1] + 1
    model = CategoryInitGRU(category_vectors(80, 8, 25), 80, freeze=False if fixed else None)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 5e-3),
                train_loader=tensors(seq[:2400], target[:2400]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(seq[2400:], target[2400:], shuffle=False), max_steps=300)


fix("item_embeddings_frozen_from_pretrained", fixed_of(item_embeddings_frozen_from_pretrained), argmax_acc(),
    "val next-item accuracy")

# ---------------------------------------------------------------- 5. GRU outputs detached before the readout


class TBPTTGRU(nn.Module):
    def __init__(self, n_items, detach_outputs, d=16):
        super().__init__()
        self.detach_outputs = detach_outputs
        self.emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, n_items + 1)

    def forward(self, seq):
        h, _ = self.gru(self.emb(seq))
        if self.detach_outputs:      # "detach the hidden state between batches" (truncated BPTT), put on the outputs
            h = h.detach()
        return self.out(h[:, -1])


@case("gru_outputs_detached", "what_is_trained",
      "The GRU's outputs are .detach()ed before the readout (a truncated-BPTT habit meant for the carried hidden "
      "state), so the item embeddings and the GRU never get a gradient; only the last Linear trains on random "
      "recurrent features that cannot encode the two-item rule.",
      r"detach|(graph|autograd).{0,40}(cut|broken|break|disconnect)|no grad(ient)?s?.{0,80}(gru|embedding|encoder|"
      r"recurrent|earlier layers)|(gru|embedding|encoder|recurrent).{0,80}(no|zero|none) grad|only the "
      r"(last|output|final) (layer|linear)")
def gru_outputs_detached(fixed=False):
    seed(0)
    full = markov_sessions(3000, 30, 7, 26, order=2)
    seq, target = full[:, :6], full[:, 6]
    model = TBPTTGRU(30, detach_outputs=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 5e-3),
                train_loader=tensors(seq[:2400], target[:2400]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(seq[2400:], target[2400:], shuffle=False), max_steps=300)


fix("gru_outputs_detached", fixed_of(gru_outputs_detached), argmax_acc(), "val next-item accuracy")

_ = np
