"""What is trained: frozen parts, the optimizer's parameters, heads made or replaced in fine-tuning code."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_ay.registry import (
    TinyResNet,
    arrows,
    case,
    colour_blobs,
    fix,
    fixed_of,
    seed,
    tensor_loaders,
    to_chw,
    val_acc,
)


def blob_loaders(s):
    img, y = colour_blobs(1600, s=s)
    x, y = to_chw(img), torch.from_numpy(y)
    return tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:])


def arrow_loaders(s):
    img, y = arrows(1600, s=s)
    x, y = to_chw(img), torch.from_numpy(y)
    return tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:])


@case("optimizer_before_new_head", "what_is_trained",
      "Fine-tuning code freezes the backbone, builds the optimizer from model.parameters(), and only then replaces "
      "model.fc with a new nn.Linear for the 4 classes: the new head's parameters are not in the optimizer, so "
      "nothing is ever updated.",
      r"(after|before).{0,40}(replac|creat|build|construct|attach).{0,40}(head|fc|optimi[sz]er)|"
      r"(new|replaced) (head|fc|layer|classifier).{0,60}(not|never|missing).{0,30}optimi[sz]er|"
      r"optimi[sz]er.{0,60}(old|original|previous|replaced) (head|fc)|re-?(create|build) the optimi[sz]er|stale")
def optimizer_before_new_head(fixed=False):
    seed(20)
    model = TinyResNet(out=10)  # the "pretrained" 10-class network
    for p in model.parameters():
        p.requires_grad = False
    if fixed:
        model.fc = nn.Linear(32, 4)
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 1e-2)
    else:
        optimizer = torch.optim.Adam(model.parameters(), 1e-2)
        model.fc = nn.Linear(32, 4)
    tr, va = blob_loaders(21)
    return dict(model=model, optimizer=optimizer, train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss(),
                max_steps=300)


fix("optimizer_before_new_head", fixed_of(optimizer_before_new_head), val_acc, "val accuracy")


@case("optimizer_on_discarded_model", "what_is_trained",
      "The optimizer is built on a first TinyResNet, then the script re-instantiates the model and loads the "
      "checkpoint into the new object: the optimizer keeps stepping the discarded model's tensors and the model "
      "that runs is never updated.",
      r"re-?instantiat|re-?creat|rebuil|new (model )?(object|instance)|discarded|old model|different model|"
      r"another model|stale|none of the model'?s? param|(no|none of the) (model )?param\w* .{0,40}in the optimi[sz]er|"
      r"optimi[sz]er.{0,40}(holds|has|references|points to) .{0,30}(other|old|previous|different)")
def optimizer_on_discarded_model(fixed=False):
    seed(22)
    model = TinyResNet(out=4)
    checkpoint = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.Adam(model.parameters(), 2e-3)
    if not fixed:
        model = TinyResNet(out=4)
        model.load_state_dict(checkpoint)
    else:
        model.load_state_dict(checkpoint)
    tr, va = blob_loaders(23)
    return dict(model=model, optimizer=optimizer, train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss(),
                max_steps=300)


fix("optimizer_on_discarded_model", fixed_of(optimizer_on_discarded_model), val_acc, "val accuracy")


class LazyHeadNet(nn.Module):
    """A backbone whose classifier is created inside forward, sized from the features it sees."""

    def __init__(self, classes=4, fixed=False):
        super().__init__()
        self.backbone = TinyResNet(out=4)
        self.backbone.fc = nn.Identity()
        self.classes, self.fixed = classes, fixed
        self.head = nn.Linear(32, classes) if fixed else None

    def forward(self, x):
        feats = self.backbone(x)
        if self.fixed:
            return self.head(feats)
        head = nn.Linear(feats.size(1), self.classes).to(feats.device)
        return head(feats)


@case("head_created_in_forward", "what_is_trained",
      "The classifier nn.Linear is constructed inside forward() (sized from the features): every call makes a fresh "
      "randomly initialised head that is not a registered submodule and not in the optimizer, so the head is never "
      "trained and the logits are random.",
      r"(inside|in) (the )?forward|created? (each|every) (call|step|forward)|fresh.{0,30}(layer|head|linear)|"
      r"not (a )?registered|register.{0,30}(__init__|submodule|module)|__init__|re-?initiali[sz]ed (each|every)")
def head_created_in_forward(fixed=False):
    seed(24)
    model = LazyHeadNet(fixed=fixed)
    tr, va = blob_loaders(25)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("head_created_in_forward", fixed_of(head_created_in_forward), val_acc, "val accuracy")


class PythonListResNet(nn.Module):
    """A ResNet-style stack whose stages the user keeps in a plain Python list."""

    def __init__(self, fixed=False, width=16):
        super().__init__()
        from benchmarks.blind_preflight_ay.registry import Block
        stages = [nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()),
                  Block(width),
                  nn.Sequential(nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
                                nn.BatchNorm2d(2 * width), nn.ReLU()),
                  Block(2 * width)]
        self.stages = nn.ModuleList(stages) if fixed else stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, 4)

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return self.fc(self.pool(x).flatten(1))


@case("stages_in_python_list", "what_is_trained",
      "The convolutional stages are kept in a plain Python list (self.stages = [...]) instead of nn.ModuleList: "
      "they are not registered submodules, so model.parameters() (and the optimizer) only hold the final fc; "
      "the backbone stays at its random init.",
      r"ModuleList|nn\.Sequential|python list|plain list|\blist\b.{0,60}(register|submodule|parameters)|"
      r"not registered|unregistered|(not|never).{0,30}(in|part of) (model\.)?parameters\(\)|"
      r"not in (the )?optimi[sz]er")
def stages_in_python_list(fixed=False):
    seed(26)
    model = PythonListResNet(fixed)
    tr, va = arrow_loaders(27)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("stages_in_python_list", fixed_of(stages_in_python_list), val_acc, "val accuracy")


class ProbeNet(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.backbone = TinyResNet(out=4)
        self.backbone.fc = nn.Identity()
        self.head = nn.Linear(32, 4)
        self.fixed = fixed

    def forward(self, x):
        feats = self.backbone(x)
        if not self.fixed:
            feats = feats.detach()  # copied from a linear-probe script
        return self.head(feats)


@case("features_detached_from_scratch", "what_is_trained",
      "The backbone is trained from scratch (random init) but forward() detaches its features before the head "
      "(a line copied from a linear-probe script): no gradient reaches the backbone, only the linear head on "
      "random features is trained.",
      r"detach|no_grad|stop[- ]gradient|(no|zero|none) gradients?.{0,60}(backbone|features|conv|earlier|upstream)|"
      r"(backbone|features|conv).{0,60}(no|zero|none) grad|cut.{0,30}graph|graph.{0,30}(cut|broken)|linear[- ]probe")
def features_detached_from_scratch(fixed=False):
    seed(28)
    model = ProbeNet(fixed)
    tr, va = arrow_loaders(29)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("features_detached_from_scratch", fixed_of(features_detached_from_scratch), val_acc, "val accuracy")
