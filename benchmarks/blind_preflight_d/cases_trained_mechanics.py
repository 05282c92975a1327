"""Set d: what is trained, and the mechanics of the step."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_d.registry import case, loader, seed, teacher_classes, teacher_regression

FROZEN = (r"frozen|freez|requires_grad|(does not|doesn't) require grad|no (trainable|parameter|gradient)"
          r"|(none|no) of the (parameters|weights)|never (updated|trained)|nothing (is )?(trainable|trained)")
NOT_IN_OPTIMIZER = (r"(not|never|missing|absent)[^.]*optimi[sz]er|optimi[sz]er[^.]*(miss|lack|omit|other|copy|different"
                    r"|not (updat|includ|contain|hold)|does(n't| not) (updat|includ|contain|hold))|deepcopy|\bcopy\b")


def _shapes_images(n=1536, classes=4, s=0):
    """Synthetic 1x16x16 images: a bright square whose quadrant is the class."""
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.randn(n, 1, 16, 16, generator=g) * 0.3
    for i in range(n):
        r, c = divmod(int(y[i]), 2)
        x[i, 0, r * 8 + 2:r * 8 + 6, c * 8 + 2:c * 8 + 6] += 1.5
    return x, y


class ConvFeatures(nn.Module):
    def __init__(self, ch=1):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(ch, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten())

    def forward(self, x):
        return self.body(x)                                  # (B, 128)


# ---------------------------------------------------------------- what is trained

class QuadrantNet(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.features = ConvFeatures()
        self.classes = classes

    def forward(self, x):
        h = self.features(x)
        return nn.Linear(h.shape[1], self.classes)(h)        # the head is built on the fly, every call


@case("head_linear_constructed_inside_forward", "what_is_trained",
      bug="the classifier head is constructed inside forward (nn.Linear(h.shape[1], classes)(h)), so every call uses "
          "a fresh randomly initialised layer that is not a registered submodule and not in the optimizer",
      cause_pattern=r"(created|built|constructed|instantiated|new)[^.]*(forward|each (call|step))|inside forward"
                    r"|in forward|not (registered|a parameter|in the optimi[sz]er)|unregistered|re-?initiali[sz]"
                    r"|(fresh|new) (random )?(layer|module|weights)")
def head_linear_constructed_inside_forward():
    seed(20)
    x, y = _shapes_images(s=20)
    model = QuadrantNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32), loss_fn=nn.CrossEntropyLoss())


class ChurnMLP(nn.Module):
    def __init__(self, d=30):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 2))

    def forward(self, x):
        return self.net(x)


@case("ema_copy_given_to_optimizer", "what_is_trained",
      bug="the EMA copy (copy.deepcopy(model)) is created first and its parameters are handed to the optimizer, while "
          "the loss is computed with the live model: the model's gradients are never applied, and the EMA weights "
          "never change",
      cause_pattern=NOT_IN_OPTIMIZER)
def ema_copy_given_to_optimizer():
    seed(21)
    x, y = teacher_classes(3072, 30, 2, s=21)
    model = ChurnMLP()
    ema_model = copy.deepcopy(model).requires_grad_(True)
    optimizer = torch.optim.AdamW(ema_model.parameters(), lr=2e-3, weight_decay=0.01)   # meant model.parameters()
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=nn.CrossEntropyLoss())


class PretrainedNet(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.block = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        return self.fc(self.block(self.stem(x)))


@case("gradual_unfreeze_typo_requires_grad_underscore", "what_is_trained",
      bug="the fine-tune freezes the whole model with requires_grad_(False) and then 'unfreezes' the last block and "
          "the fc head with p.requires_grad_ = True (an attribute assignment, not the method call), so every "
          "parameter stays frozen",
      cause_pattern=FROZEN)
def gradual_unfreeze_typo_requires_grad_underscore():
    seed(22)
    x, y = _shapes_images(s=22)
    model = PretrainedNet()
    model.requires_grad_(False)                              # stage 1: start fully frozen
    for name, p in model.named_parameters():
        if name.startswith(("block", "fc")):
            p.requires_grad_ = True                          # meant p.requires_grad_(True) / p.requires_grad = True
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x, y), 32), loss_fn=nn.CrossEntropyLoss())


def _t5_reverse_batches(n=256, length=10, vocab=64, s=0):
    g = torch.Generator().manual_seed(s)
    ids = torch.randint(3, vocab, (n, length), generator=g)
    labels = torch.flip(ids, dims=[1])
    return [{"input_ids": ids[i:i + 16], "attention_mask": torch.ones_like(ids[i:i + 16]),
             "labels": labels[i:i + 16]} for i in range(0, n, 16)]


@case("t5_dropout_rate_from_keep_prob", "what_is_trained",
      bug="the tiny T5 is configured from a TF-style config key keep_prob=0.9 as T5Config(dropout_rate=0.9), so 90% "
          "of the activations are dropped in every layer instead of 10%",
      cause_pattern=r"dropout|keep.?prob")
def t5_dropout_rate_from_keep_prob():
    from transformers import T5Config, T5ForConditionalGeneration
    seed(23)
    hparams = {"d_model": 64, "layers": 2, "heads": 4, "keep_prob": 0.9}
    config = T5Config(vocab_size=64, d_model=hparams["d_model"], d_kv=16, d_ff=128, num_layers=hparams["layers"],
                      num_decoder_layers=hparams["layers"], num_heads=hparams["heads"],
                      dropout_rate=hparams["keep_prob"], decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=_t5_reverse_batches(s=23), loss_fn=None)


@case("sgd_weight_decay_5_instead_of_5e4", "what_is_trained",
      bug="the CNN's SGD gets weight_decay=5 (the config's '5e-4' lost its exponent): with lr 0.05 every step shrinks "
          "the weights by 25%, so they collapse towards zero and the model cannot learn",
      cause_pattern=r"weight.?decay")
def sgd_weight_decay_5_instead_of_5e4():
    seed(24)
    x, y = _shapes_images(s=24)
    model = PretrainedNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x, y), 32), loss_fn=nn.CrossEntropyLoss())


@case("adam_eps_one_from_inception_advice", "what_is_trained",
      bug="Adam is built with eps=1.0 (the TF Inception advice copied over): with gradients of order 1e-2 the "
          "denominator is ~1, so the update is lr*m, a plain tiny-lr momentum step, and the regressor barely moves",
      cause_pattern=r"\beps\b|epsilon")
def adam_eps_one_from_inception_advice():
    seed(25)
    x, y = teacher_regression(3072, 24, s=25)
    model = nn.Sequential(nn.Linear(24, 64), nn.Tanh(), nn.Linear(64, 1), nn.Flatten(0))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1.0)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=nn.MSELoss())


class BackboneHead(nn.Module):
    def __init__(self, d=32, classes=5):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(d, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU())
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        return self.head(self.backbone(x))


@case("finetune_head_group_inherits_lr_zero", "what_is_trained",
      bug="AdamW is built with lr=0.0 as the default and two param groups, only the backbone group setting its own "
          "lr=1e-4; the new head's group inherits lr=0, so the freshly initialised head is never updated",
      cause_pattern=r"\blr\b|learning.rate")
def finetune_head_group_inherits_lr_zero():
    seed(26)
    x, y = teacher_classes(3072, 32, 5, s=26)
    model = BackboneHead()
    optimizer = torch.optim.AdamW([{"params": model.backbone.parameters(), "lr": 1e-4},
                                   {"params": model.head.parameters()}], lr=0.0, weight_decay=0.01)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=nn.CrossEntropyLoss())


class ClippedFeatureNet(nn.Module):
    def __init__(self, d=24):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 32))
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        h = self.encoder(x)
        h = np.clip(h.detach().cpu().numpy(), -3.0, 3.0)    # robust clipping done in NumPy
        h = torch.from_numpy(h).to(x.device)
        return self.head(h).squeeze(-1)


@case("feature_numpy_roundtrip_in_forward", "what_is_trained",
      bug="forward clips the encoder's features with np.clip after .detach().numpy() and converts them back with "
          "torch.from_numpy, which cuts the graph: the encoder never receives a gradient and only the head trains",
      cause_pattern=r"detach|numpy|no grad(ient)?|(get|receive)s? no grad|never (updated|trained)|not (reach|flow)"
                    r"|graph|without (a )?grad")
def feature_numpy_roundtrip_in_forward():
    seed(27)
    x, y = teacher_regression(3072, 24, s=27)
    model = ClippedFeatureNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=nn.MSELoss())


# ---------------------------------------------------------------- mechanics

@case("sgd_clip_grad_norm_1e4", "mechanics",
      bug="the loop clips the gradient norm to 1e-4 (the weight-decay value passed in the clip slot): with SGD lr 0.05 "
          "each step moves the weights by at most 5e-6, so nothing is learned",
      cause_pattern=r"clip")
def sgd_clip_grad_norm_1e4():
    seed(30)
    x, y = teacher_classes(3072, 20, 3, s=30)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.CrossEntropyLoss(), clip_grad_norm=1e-4)


@case("warmup_lambda_integer_division", "mechanics",
      bug="the warmup LambdaLR is lambda step: min(1, step // warmup_steps) with integer division, so the learning "
          "rate factor is 0 for all 2000 warmup steps, longer than the 1000-step run: the model never moves",
      cause_pattern=r"(\blr\b|learning.rate)[^.]*(\b0\b|0\.0|zero)|(zero|\b0\b) (lr|learning.rate)|warm.?up|schedul"
                    r"|integer division|//")
def warmup_lambda_integer_division():
    seed(31)
    x, y = teacher_classes(3072, 20, 3, s=31)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    warmup_steps = 2000
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1, step // warmup_steps))
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.CrossEntropyLoss(), scheduler=scheduler, max_steps=1000)


class ClsRegNet(nn.Module):
    def __init__(self, d=20):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d, 64), nn.ReLU())
        self.cls = nn.Linear(64, 3)
        self.reg = nn.Linear(64, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.cls(h), self.reg(h).squeeze(-1)


@case("multitask_loss_rebuilt_with_torch_tensor", "mechanics",
      bug="the multi-task loss is summed as torch.tensor([cls_loss.item(), reg_loss.item()], requires_grad=True).sum() "
          "so it can be logged: the result is a new leaf with no graph to the model, so backward gives the "
          "parameters no gradient",
      cause_pattern=r"detach|graph|grad_fn|(not|isn't|is not) (connected|attached)|no grad(ient)?|leaf|\.item\(\)"
                    r"|torch\.tensor|never (updated|trained)")
def multitask_loss_rebuilt_with_torch_tensor():
    seed(32)
    x, c = teacher_classes(3072, 20, 3, s=32)
    _, r = teacher_regression(3072, 20, s=32)

    def multitask_loss(model, batch):
        feats, cls_t, reg_t = batch
        logits, value = model(feats)
        cls_loss = F.cross_entropy(logits, cls_t)
        reg_loss = F.mse_loss(value, reg_t)
        return torch.tensor([cls_loss.item(), reg_loss.item()], requires_grad=True).sum()

    model = ClsRegNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, c, r), 64), loss_fn=multitask_loss)


@case("adam_maximize_flag_from_reward_code", "mechanics",
      bug="the optimizer line was copied from a policy-gradient script as Adam(..., maximize=True), so the "
          "classifier takes gradient-ascent steps on its cross-entropy loss and the loss rises",
      cause_pattern=r"maximi[sz]e|ascen(t|ding)|loss (increas|rises|grows|goes up)|(increas|rising|grow)\w*[^.]*loss"
                    r"|diverg")
def adam_maximize_flag_from_reward_code():
    seed(33)
    x, y = teacher_classes(3072, 20, 4, s=33)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, maximize=True)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.CrossEntropyLoss())


class CleanSGD(torch.optim.SGD):
    """SGD that 'cleans up' the gradients as part of the step."""

    def step(self, closure=None):
        self.zero_grad(set_to_none=True)                     # meant after super().step()
        return super().step(closure)


@case("custom_sgd_step_clears_grads_first", "mechanics",
      bug="a custom SGD subclass calls self.zero_grad() at the start of step() instead of after it, so every step "
          "discards the gradients it was meant to apply and the weights never change",
      cause_pattern=r"zero_grad|grad(ient)?s? (are |were |is )?(zeroed|cleared|wiped|reset|discarded|none)"
                    r"|(no|zero) (update|change)|(weights|parameters) (do not|don't|did not|never) (change|move)"
                    r"|never (updated|changed)")
def custom_sgd_step_clears_grads_first():
    seed(34)
    x, y = teacher_classes(3072, 20, 3, s=34)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3))
    optimizer = CleanSGD(model.parameters(), lr=0.05, momentum=0.9)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.CrossEntropyLoss())
