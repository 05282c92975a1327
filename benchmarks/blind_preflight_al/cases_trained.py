"""Set al, family what_is_trained: the parameters that should learn are not the ones that do."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from benchmarks.blind_preflight_al.cases_shapes import bag_sequences, colour_tiles
from benchmarks.blind_preflight_al.registry import (
    acc_of,
    adam,
    case,
    ds,
    fix,
    fixed_of,
    gen,
    loader,
    seed,
    teacher_classes,
)


def _argmax_fwd(m, b):
    return m(b[0]).argmax(-1), b[-1]


# 11 ----------------------------------------------------------------- reentrant checkpoint after frozen embeddings
def count_tokens(n, s, vocab=64, length=12):
    g = gen(s)
    tok = torch.randint(0, vocab, (n, length), generator=g)
    member = torch.randperm(vocab, generator=gen(55))[: vocab // 2]
    inset = torch.isin(tok, member).sum(1)
    return tok, (inset >= 6).long()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Linear(64, d))

    def forward(self, h):
        return h + self.ff(h)


class CheckpointedBag(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant
        self.emb = nn.Embedding(64, 8)
        self.emb.weight.requires_grad_(False)              # "pretrained" vectors kept frozen
        self.blocks = nn.ModuleList([Block(8), Block(8)])
        self.head = nn.Linear(8, 2)

    def forward(self, tok):
        h = self.emb(tok)
        for b in self.blocks:
            h = checkpoint(b, h, use_reentrant=self.reentrant)
        return self.head(h.mean(1))


@case("al_reentrant_checkpoint_frozen_embed", "what_is_trained",
      "The blocks run under torch.utils.checkpoint.checkpoint(..., use_reentrant=True) right after a frozen embedding: "
      "no input of the checkpointed segment requires grad, so the blocks get no gradients at all and only the head "
      "trains.",
      r"reentrant|checkpoint.{0,120}(no grad|gradients? (are|is) None|requires_grad|frozen)|enable_input_require_grads"
      r"|None of the inputs have requires_grad")
def al_reentrant_checkpoint_frozen_embed(fixed=False):
    seed(0)
    tok, y = count_tokens(1500, 23)
    model = CheckpointedBag(reentrant=not fixed)
    return dict(model=model, optimizer=adam(model, 1e-2), train_loader=loader(ds(tok[:1200], y[:1200])),
                val_loader=loader(ds(tok[1200:], y[1200:]), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss())


# 12 ----------------------------------------------------------------- LayerScale parameter created in forward
class ScaledMLP(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.fc1, self.fc2 = nn.Linear(12, 64), nn.Linear(64, 4)
        if fixed:
            self.gamma = nn.Parameter(torch.randn(64) * 0.5)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if self.fixed:
            gamma = self.gamma
        else:
            gamma = nn.Parameter(torch.randn(64, device=x.device) * 0.5)   # a fresh, unregistered parameter per call
        return self.fc2(h * gamma)


@case("al_layerscale_param_in_forward", "what_is_trained",
      "The per-channel LayerScale gamma is created as nn.Parameter(torch.randn(...)) inside forward(): it is never "
      "registered in the module or the optimizer, and every call multiplies the features by a fresh random vector.",
      r"(created|defined|instantiated|new).{0,60}(inside|in) forward|forward\(\).{0,80}(nn\.Parameter|parameter|new)"
      r"|nn\.Parameter.{0,80}(forward|not registered|unregistered)|not registered|(fresh|new) random.{0,40}(every|each) (call|step|forward)")
def al_layerscale_param_in_forward(fixed=False):
    seed(0)
    x, y = teacher_classes(1500, 12, 4, 25)
    model = ScaledMLP(fixed)
    return dict(model=model, optimizer=adam(model), train_loader=loader(ds(x[:1200], y[:1200])),
                val_loader=loader(ds(x[1200:], y[1200:]), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss())


# 13 ----------------------------------------------------------------- numpy round trip in forward cuts the graph
class ClipStem(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.stem = nn.Linear(16, 4)
        self.head = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        h = self.stem(x)
        if self.fixed:
            h = torch.clamp(h, 0, 6)
        else:
            h = torch.from_numpy(np.clip(h.detach().cpu().numpy(), 0, 6)).to(x.device)   # ReLU6 "via numpy"
        return self.head(h)


@case("al_numpy_roundtrip_in_forward", "what_is_trained",
      "forward() clips the stem activations with np.clip on h.detach().cpu().numpy() and wraps the result back with "
      "torch.from_numpy: the autograd graph is cut there, so the stem Linear before it never receives a gradient.",
      r"\.numpy\(\)|from_numpy|np\.clip|numpy (round|and back)|detach.{0,80}(graph|gradient|stem|earlier)|(graph|autograd).{0,40}(cut|broken|break|detached)"
      r"|(never|no) (receives?|gets?) (a )?gradients?")
def al_numpy_roundtrip_in_forward(fixed=False):
    seed(0)
    x, y = teacher_classes(1500, 16, 4, 27)
    model = ClipStem(fixed)
    return dict(model=model, optimizer=adam(model), train_loader=loader(ds(x[:1200], y[:1200])),
                val_loader=loader(ds(x[1200:], y[1200:]), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss())


# 14 ----------------------------------------------------------------- module.requires_grad = True does not unfreeze
def tiny_bert_classifier():
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=30, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=16, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(cfg)


@case("al_module_requires_grad_attr", "what_is_trained",
      "To fine-tune only the top of BERT the user freezes model.bert with requires_grad_(False) and then 'unfreezes' the "
      "last encoder layer with model.bert.encoder.layer[-1].requires_grad = True, a plain attribute on the Module that "
      "does not touch its parameters, so the encoder stays frozen and only the classifier trains.",
      r"requires_grad_\(|requires_grad\s*=\s*True.{0,80}(module|attribute|layer)|(attribute|plain attribute).{0,60}"
      r"(module|parameters)|(encoder|layer|backbone).{0,60}(still|stays|remain|left) frozen|(unfreez|frozen).{0,80}"
      r"(no effect|does not|doesn't|not take effect)")
def al_module_requires_grad_attr(fixed=False):
    seed(0)
    tok, y = bag_sequences(1500, 29)
    model = tiny_bert_classifier()
    model.bert.requires_grad_(False)
    if fixed:
        model.bert.encoder.layer[-1].requires_grad_(True)
        model.bert.pooler.requires_grad_(True)
    else:
        model.bert.encoder.layer[-1].requires_grad = True
        model.bert.pooler.requires_grad = True
    att = torch.ones_like(tok)
    from benchmarks.blind_preflight_al.cases_targets import DictDS
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), 3e-3),
                train_loader=loader(DictDS(input_ids=tok[:1200], attention_mask=att[:1200], labels=y[:1200])),
                val_loader=loader(DictDS(input_ids=tok[1200:], attention_mask=att[1200:], labels=y[1200:]), 100,
                                  shuffle=False), loss_fn=None)


def _hf_fwd(m, b):
    return m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1), b["labels"]


# 15 ----------------------------------------------------------------- new head assigned after the optimizer
class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, 10)                           # the "ImageNet" head

    def forward(self, x):
        return self.fc(self.features(x))


@case("al_head_replaced_after_optimizer", "what_is_trained",
      "The optimizer is built from the trainable parameters (the old model.fc) and only then is model.fc replaced by a "
      "new nn.Linear for the 3 new classes: the new head's parameters are not in the optimizer, so nothing that is "
      "used in forward is ever updated.",
      r"(optimizer|param_groups).{0,120}(before|stale|old|not (in|include)|missing|orphan)|(not|never) in the optimizer"
      r"|(replac|reassign|swap).{0,60}(head|fc|classifier|layer).{0,80}(after|optimizer)|(head|fc|classifier).{0,60}"
      r"(not|never) (updated|in the optimizer|optimi[sz]ed)")
def al_head_replaced_after_optimizer(fixed=False):
    seed(0)
    hwc, y = colour_tiles(1400, 31)
    x = hwc.permute(0, 3, 1, 2).contiguous()
    model = Backbone()
    model.features.requires_grad_(False)                      # keep the "pretrained" features
    if fixed:
        model.fc = nn.Linear(32, 3)
        opt = adam(model, 1e-2)
    else:
        opt = adam(model, 1e-2)
        model.fc = nn.Linear(32, 3)
    return dict(model=model, optimizer=opt, train_loader=loader(ds(x[:1100], y[:1100])),
                val_loader=loader(ds(x[1100:], y[1100:]), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss())


fix("al_reentrant_checkpoint_frozen_embed", fixed_of(al_reentrant_checkpoint_frozen_embed), acc_of(_argmax_fwd),
    "val accuracy", steps=300)
fix("al_layerscale_param_in_forward", fixed_of(al_layerscale_param_in_forward), acc_of(_argmax_fwd), "val accuracy",
    steps=250)
fix("al_numpy_roundtrip_in_forward", fixed_of(al_numpy_roundtrip_in_forward), acc_of(_argmax_fwd), "val accuracy",
    steps=250)
fix("al_module_requires_grad_attr", fixed_of(al_module_requires_grad_attr), acc_of(_hf_fwd), "val accuracy", steps=250)
fix("al_head_replaced_after_optimizer", fixed_of(al_head_replaced_after_optimizer), acc_of(_argmax_fwd),
    "val accuracy", steps=200)
