"""What is trained: LoRA adapters, swapped heads, gradual unfreezing, a deep-copied model."""

from __future__ import annotations

import copy

import torch
from torch import nn

from benchmarks.blind_preflight_at.registry import FTNet, LoRALinear, acc_of, case, fix, fixed_of, ft_loaders, seed  # noqa: F401

FT_ACC = acc_of(lambda m, b: (m(b[0]).argmax(1), b[1]))


def frozen_ftnet():
    model = FTNet()
    for p in model.backbone.parameters():
        p.requires_grad = False
    return model


@case("lora_both_factors_zero", "what_is_trained",
      "The hand-written LoRA layer initialises both factors A and B with zeros, so the adapter's product B @ A and "
      "both gradients (dL/dA through B, dL/dB through A) stay exactly zero: the adapter never trains and only the "
      "head learns.",
      r"(both|A and B|lora_A and lora_B|A ?and ?B).{0,60}zero|zero.{0,60}(both|A and B)|"
      r"(lora_A|\bA\b).{0,40}(zeros?|zero-init|non-?zero|kaiming|random)|(adapter|lora).{0,80}"
      r"(never (train|update|learn)|zero grad|gradients? (are|stay|remain) zero|no gradient)")
def lora_both_factors_zero(fixed=False):
    seed(0)
    tr, va = ft_loaders(use_first=True)
    model = frozen_ftnet()
    model.backbone.fc1 = LoRALinear(model.backbone.fc1, r=4, alpha=8, zero_a=not fixed)
    params = [p for p in model.parameters() if p.requires_grad]
    return dict(model=model, optimizer=torch.optim.AdamW(params, 3e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("lora_both_factors_zero", fixed_of(lora_both_factors_zero), FT_ACC, "val accuracy")


class SeqBackbone(nn.Module):
    """The 'pretrained' backbone as a Sequential, with named handles to its layers."""

    def __init__(self, base):
        super().__init__()
        self.fc1, self.fc2 = base.fc1, base.fc2
        self.net = nn.Sequential(self.fc1, nn.ReLU(), self.fc2, nn.ReLU())

    def forward(self, x):
        return self.net(x)


@case("lora_wrapped_attribute_unused", "what_is_trained",
      "LoRA is injected with model.backbone.fc1 = LoRALinear(model.backbone.fc1), but forward runs through "
      "model.backbone.net (an nn.Sequential holding the original fc1), so the adapter is never on the forward path: "
      "its parameters get no gradient and the frozen backbone is used unchanged.",
      r"(never|not) (on|in|used|called).{0,40}(forward|path)|(forward|Sequential).{0,80}(original|old|unwrapped|"
      r"still)|(adapter|lora).{0,80}(unused|not used|never (called|used|receives?))|"
      r"(wrapp|inject|replac).{0,80}(attribute|fc1).{0,80}(Sequential|net\[0\]|forward)")
def lora_wrapped_attribute_unused(fixed=False):
    seed(0)
    tr, va = ft_loaders(use_first=True)
    model = frozen_ftnet()
    model.backbone = SeqBackbone(model.backbone)
    if fixed:
        model.backbone.net[0] = LoRALinear(model.backbone.net[0], r=4, alpha=8)
    else:
        model.backbone.fc1 = LoRALinear(model.backbone.fc1, r=4, alpha=8)
    params = [p for p in model.parameters() if p.requires_grad]
    return dict(model=model, optimizer=torch.optim.AdamW(params, 3e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("lora_wrapped_attribute_unused", fixed_of(lora_wrapped_attribute_unused), FT_ACC, "val accuracy")


@case("head_swapped_after_optimizer", "what_is_trained",
      "For a linear probe the backbone is frozen and the optimizer is built from model.parameters() before the "
      "classifier head is replaced (model.head = nn.Linear(32, 4)), so the optimizer holds the old head's tensors "
      "and the new head, the only trainable part, is never updated.",
      r"(new|replaced|swapped) (classifier )?head.{0,80}(not in|missing from|never updated|not updated|"
      r"no.{0,10}optimi)|optimi[sz]er.{0,60}(before|prior to).{0,40}(head|swap|replac)|old head|"
      r"(head|swap|replac).{0,60}after.{0,30}optimi[sz]er|rebuild.{0,30}optimi[sz]er")
def head_swapped_after_optimizer(fixed=False):
    seed(0)
    tr, va = ft_loaders(use_first=False)
    model = frozen_ftnet()
    if fixed:
        model.head = nn.Linear(32, 4)
        opt = torch.optim.Adam(model.parameters(), 3e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), 3e-3)
        model.head = nn.Linear(32, 4)
    return dict(model=model, optimizer=opt, train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss(),
                max_steps=200)


fix("head_swapped_after_optimizer", fixed_of(head_swapped_after_optimizer), FT_ACC, "val accuracy")


@case("unfrozen_layer_not_in_optimizer", "what_is_trained",
      "Gradual unfreezing: stage 2 sets requires_grad=True on the backbone's first layer, but the optimizer was "
      "built in stage 1 from model.head.parameters() only and is not given the unfrozen parameters "
      "(no add_param_group), so fc1 gets gradients that are never applied.",
      r"add_param_group|unfr[eo]z.{0,80}(not in|missing from|never (added|applied|updated)|optimi[sz]er)|"
      r"(trainable )?param(eter)?s?.{0,60}not in (the )?optimi[sz]er|(gradients?|grads?).{0,60}never applied|"
      r"requires_grad ?= ?True.{0,80}optimi[sz]er")
def unfrozen_layer_not_in_optimizer(fixed=False):
    seed(0)
    tr, va = ft_loaders(use_first=True)
    model = frozen_ftnet()
    opt = torch.optim.Adam(model.head.parameters(), 3e-3)   # stage 1: head only
    for p in model.backbone.fc1.parameters():                # stage 2: unfreeze the first layer
        p.requires_grad = True
    if fixed:
        opt.add_param_group({"params": list(model.backbone.fc1.parameters()), "lr": 1e-3})
    return dict(model=model, optimizer=opt, train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss(),
                max_steps=200)


fix("unfrozen_layer_not_in_optimizer", fixed_of(unfrozen_layer_not_in_optimizer), FT_ACC, "val accuracy")


@case("optimizer_on_pre_copy_model", "what_is_trained",
      "The fine-tuning run deep-copies the pretrained model (copy.deepcopy) after building the optimizer on the "
      "original's parameters and then trains the copy, so the optimizer steps tensors that are not in the model "
      "being trained and the copy never changes.",
      r"deepcopy|deep copy|(copy|clone).{0,80}(optimi[sz]er|not (in|the) (the )?model)|"
      r"optimi[sz]er.{0,80}(different|other|original|another) (model|module|copy)|"
      r"(none|no) of the (model'?s? )?param(eter)?s.{0,40}optimi[sz]er|model.{0,30}never (changes|updated)")
def optimizer_on_pre_copy_model(fixed=False):
    seed(0)
    tr, va = ft_loaders(use_first=True)
    pretrained = FTNet()
    if fixed:
        model = copy.deepcopy(pretrained)
        opt = torch.optim.Adam(model.parameters(), 2e-3)
    else:
        opt = torch.optim.Adam(pretrained.parameters(), 2e-3)
        model = copy.deepcopy(pretrained)   # keep the pretrained weights untouched for comparison
    return dict(model=model, optimizer=opt, train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss(),
                max_steps=200)


fix("optimizer_on_pre_copy_model", fixed_of(optimizer_on_pre_copy_model), FT_ACC, "val accuracy")
