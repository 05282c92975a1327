"""Set aa, family mechanics: how the optimisation runs (weight precision, the learning-rate schedule, the
initialisation, the loss formula) quietly stops a correct model on correct data from learning."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aa.cases_trained import color_patch_images
from benchmarks.blind_preflight_aa.registry import (
    acc_of,
    blob_scenes,
    case,
    fg_iou_of,
    fix,
    fixed_of,
    loader,
    seed,
    tone_clips,
)


class ToneNet(nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.features = nn.Sequential(nn.Conv1d(1, 16, 9, padding=4), nn.ReLU(), nn.Conv1d(16, 16, 9, padding=4),
                                      nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        return self.head(self.features(x))


class PatchCNN(nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten(),
                                 nn.Linear(32, classes))

    def forward(self, x):
        return self.net(x)


# ------------------------------------------------------------------------------------------------------------------
# 16. A hand-written focal loss for imbalanced sound events, FL = (1 - p)^gamma * log(p): the minus sign is missing.
# ------------------------------------------------------------------------------------------------------------------

def make_focal_loss(gamma: float = 2.0, negate: bool = True):
    def focal_loss(model, batch):
        clips, labels = batch
        logp = F.log_softmax(model(clips), dim=-1).gather(1, labels[:, None]).squeeze(1)
        p = logp.exp()
        fl = (1 - p) ** gamma * logp
        return (-fl if negate else fl).mean()
    return focal_loss


@case("focal_loss_missing_minus", "mechanics",
      bug="The hand-written focal loss returns ((1 - p) ** gamma * log(p)).mean(), without the leading minus of "
          "FL = -(1 - p_t)^gamma log(p_t): the loss is negative and minimising it drives the true class's probability "
          "to 0, so the 'decreasing' loss trains the model to be wrong.",
      cause_pattern=r"(missing|without|no|forgot\w*|lacks?) (the |a )?(leading )?(minus|negative sign|negation|-1)"
                    r"|sign (is )?(flipped|wrong|inverted)|wrong sign|(maximi[sz]\w*|increas\w*) (the )?(cross[- ]entropy|log[- ]?likelihood|nll)"
                    r"|loss (is |goes |becomes )?negative.{0,80}(log|sign|minus|focal)|focal.{0,80}(sign|minus|negative)"
                    r"|(probabilit\w*|p_?t?) .{0,40}(of the (true|correct|target) class).{0,40}(to(wards)? 0|down|decreas)")
def focal_loss_missing_minus(fixed: bool = False):
    seed(0)
    x, y = tone_clips(1152, s=41)
    model = ToneNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1024], y[:1024]), 32),
                val_loader=loader(TensorDataset(x[1024:], y[1024:]), 128, shuffle=False),
                loss_fn=make_focal_loss(negate=fixed), max_steps=2000)


fix("focal_loss_missing_minus", fixed_of(focal_loss_missing_minus),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc")


# ------------------------------------------------------------------------------------------------------------------
# 17. Warm-up written as LambdaLR(lambda step: base_lr * ...): LambdaLR multiplies, so the LR is base_lr ** 2.
# ------------------------------------------------------------------------------------------------------------------

@case("lambdalr_absolute_lr", "mechanics",
      bug="The warm-up is LambdaLR(optimizer, lambda step: 3e-3 * min(1, (step + 1) / 50)): LambdaLR multiplies the "
          "optimizer's lr by the lambda's value, so the function should return a factor, but it returns the learning "
          "rate itself and the effective LR is 3e-3 * 3e-3 = 9e-6.",
      cause_pattern=r"LambdaLR|lr_lambda|multiplicative factor|(multipl|scal)\w* (the )?(base|initial|optimi[sz]er'?s?) (lr|learning rate)"
                    r"|(learning rate|lr) .{0,40}(squared|\*\* ?2|9e-0?6|9\.0e-0?6)"
                    r"|returns? (the |an )?(absolute )?(learning rate|lr) (instead of|rather than|not) (a )?(factor|multiplier)")
def lambdalr_absolute_lr(fixed: bool = False):
    seed(0)
    x, y = color_patch_images(1152, s=42)
    model = PatchCNN()
    base_lr = 3e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=base_lr)
    if fixed:
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 50))
    else:
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: base_lr * min(1.0, (step + 1) / 50))
    return dict(model=model, optimizer=optimizer, scheduler=warmup,
                train_loader=loader(TensorDataset(x[:1024], y[:1024]), 32),
                val_loader=loader(TensorDataset(x[1024:], y[1024:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("lambdalr_absolute_lr", fixed_of(lambdalr_absolute_lr),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc")


# ------------------------------------------------------------------------------------------------------------------
# 18. A copied init_weights() sets every conv / linear weight to the same small constant: symmetry never breaks.
# ------------------------------------------------------------------------------------------------------------------

def init_weights(m):
    if isinstance(m, (nn.Conv1d, nn.Linear)):
        nn.init.constant_(m.weight, 0.01)
        nn.init.zeros_(m.bias)


@case("constant_init_symmetry", "mechanics",
      bug="model.apply(init_weights) sets every Conv1d / Linear weight to the same constant 0.01: all filters of a "
          "layer compute the same thing and receive the same gradient, so they stay identical forever and the network "
          "has effectively one channel per layer.",
      cause_pattern=r"symmetry|symmetric (weights|init\w*|units|filters)|identical (filters|units|neurons|channels|rows|weights)|constant_?\(|constant (init|value|weights)"
                    r"|(all|every) (the )?(weights?|filters|units|rows) .{0,30}(equal|identical|the same value)"
                    r"|init_weights|nn\.init\.(constant|zeros|ones)_")
def constant_init_symmetry(fixed: bool = False):
    seed(0)
    x, y = tone_clips(1152, s=43)
    model = ToneNet()
    if not fixed:
        model.apply(init_weights)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1024], y[:1024]), 32),
                val_loader=loader(TensorDataset(x[1024:], y[1024:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("constant_init_symmetry", fixed_of(constant_init_symmetry),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc")


# ------------------------------------------------------------------------------------------------------------------
# 19. Soft Dice loss computed on raw logits (no sigmoid): the denominator can reach 0 or go negative.
# ------------------------------------------------------------------------------------------------------------------

class BinarySegNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(16, 1, 1))

    def forward(self, x):
        return self.body(x)                                     # logits (N, 1, H, W)


def make_dice_loss(apply_sigmoid: bool):
    def dice_loss(model, batch, smooth: float = 1.0):
        img, mask = batch
        pred = model(img).squeeze(1)
        if apply_sigmoid:
            pred = torch.sigmoid(pred)
        inter = (pred * mask).sum()
        return 1 - (2 * inter + smooth) / (pred.sum() + mask.sum() + smooth)
    return dice_loss


@case("dice_on_logits", "mechanics",
      bug="The soft Dice loss is computed on the raw logits of the mask head (no torch.sigmoid), as if they were "
          "probabilities: pred.sum() can be negative, the denominator crosses zero and the loss explodes or flips "
          "sign, and the optimum is no longer a good mask.",
      cause_pattern=r"(dice|soft[- ]?dice|iou|jaccard|tversky).{0,100}(logits|sigmoid|softmax|probabilit|activation|nonlin)"
                    r"|(logits|sigmoid|softmax|probabilit|activation|nonlin).{0,100}(dice|iou|jaccard|tversky)"
                    r"|denominator .{0,60}(zero|negative|cross)")
def dice_on_logits(fixed: bool = False):
    seed(0)
    x, m = blob_scenes(768, s=44)
    model = BinarySegNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:640], m[:640]), 32),
                val_loader=loader(TensorDataset(x[640:], m[640:]), 128, shuffle=False),
                loss_fn=make_dice_loss(apply_sigmoid=fixed), max_steps=2000)


fix("dice_on_logits", fixed_of(dice_on_logits), fg_iou_of(lambda m, b: (m(b[0]).squeeze(1) > 0, b[1] > 0.5)),
    "val IoU")


# ------------------------------------------------------------------------------------------------------------------
# 20. OneCycleLR sized with steps_per_epoch=len(train_dataset) instead of len(train_loader): 32x too long a cycle.
# ------------------------------------------------------------------------------------------------------------------

@case("onecycle_steps_per_epoch_dataset", "mechanics",
      bug="The audio classifier's OneCycleLR is built with steps_per_epoch=len(train_ds) (samples) instead of len(train_loader) (batches), "
          "so the cycle is 32 times longer than the run: training ends early in the warm-up, at about max_lr / 25, "
          "and never reaches the peak or the annealing.",
      cause_pattern=r"steps_per_epoch|total_steps|len\((train_)?(ds|dataset)\)|len\((train_)?loader\)"
                    r"|(cycle|schedule|warm-?up) .{0,60}(longer|too long|never (reaches|ends|finishes)|32 ?x|32 times)"
                    r"|(samples|examples) (instead of|rather than|not) (batches|steps)"
                    r"|(never|does not|doesn't) reach (the )?(peak|max_lr|maximum)")
def onecycle_steps_per_epoch_dataset(fixed: bool = False):
    seed(0)
    x, y = tone_clips(1152, s=45)
    train_ds = TensorDataset(x[:1024], y[:1024])
    train_loader = loader(train_ds, 32)
    model = ToneNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    epochs = 10
    steps = len(train_loader) if fixed else len(train_ds)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, epochs=epochs, steps_per_epoch=steps)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=train_loader,
                val_loader=loader(TensorDataset(x[1024:], y[1024:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=epochs * len(train_loader))


fix("onecycle_steps_per_epoch_dataset", fixed_of(onecycle_steps_per_epoch_dataset),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc", steps=320)
