"""What is trained: the parameters the optimizer updates are not the ones that make the prediction (a detached
backbone, a layer rebuilt every call, an optimizer over an old model or over the head only, heads that are one
shared module)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ah.registry import acc_of, case, fix, fixed_of, gen, loader, mean_over, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------
# Defect classification: the head reads the backbone's features from a forward hook that stores output.detach().


def texture_tiles(n: int, s: int, size: int = 12):
    """Tiles of 4 defect classes: a short scratch at 0, 45, 90 or 135 degrees at a random place, in noise."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.6 * torch.randn(n, 1, size, size, generator=g)
    r0 = torch.randint(2, size - 2, (n,), generator=g)
    c0 = torch.randint(2, size - 2, (n,), generator=g)
    steps = torch.tensor([[0, 1], [1, 1], [1, 0], [1, -1]])
    for k in range(-2, 3):
        d = steps[y] * k
        x[torch.arange(n), 0, (r0 + d[:, 0]).clamp(0, size - 1), (c0 + d[:, 1]).clamp(0, size - 1)] += 2.0
    return x, y


class HookedDefectNet(nn.Module):
    """The features for the head are collected with a forward hook, as in feature-extraction tutorials."""

    def __init__(self, fixed=False, width=8):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(width, 4)
        self._features = {}
        keep = (lambda out: out) if fixed else (lambda out: out.detach())

        def save(module, inputs, output):
            self._features["last"] = keep(output)

        self.backbone[-1].register_forward_hook(save)

    def forward(self, x):
        self.backbone(x)
        return self.head(self._features["last"].amax(dim=(2, 3)))


def hook_detach(fixed: bool = False):
    seed(0)
    x, y = texture_tiles(1024, 51)
    xv, yv = texture_tiles(512, 52)
    model = HookedDefectNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


case("ah_hook_features_detached_backbone", "what_is_trained",
     "The classifier head reads the backbone's last feature map from a forward hook that stores output.detach(), so "
     "the loss never reaches the convolutional backbone: its weights get no gradient and stay at their random "
     "initialisation while only the 36-parameter head trains.",
     r"detach|forward hook|hook\w*.{0,60}(detach|gradient|graph)|"
     r"(backbone|conv\w*|feature extractor)\b.{0,80}(no|zero|none|never (get|receive)\w*) (grad|gradient)|"
     r"(grad|gradient)s?.{0,40}(never|not|don't|do not|cannot) (reach|flow|propagate)\w*.{0,40}(backbone|conv|feature)|"
     r"(graph|autograd).{0,40}(cut|broken|disconnected)|(cut|broken|disconnected).{0,40}(graph|autograd)|"
     r"(backbone|conv\w*)\b.{0,80}(grad|gradient)s? (is |are |=|== ?)?none")(hook_detach)

# --------------------------------------------------------------------------------------------------------------
# Churn prediction: the input projection is created inside forward() (sized from the batch), so every call gets
# new random weights that no optimizer holds.


def churn(n: int, s: int, d: int = 16):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 3, generator=gen(61))
    logits = x @ w + 0.8 * torch.stack([x[:, 0] * x[:, 1], x[:, 2].abs(), -x[:, 3] * x[:, 4]], 1)
    return x, logits.argmax(1)


class ChurnNet(nn.Module):
    def __init__(self, hidden=64, fixed=False, d=16):
        super().__init__()
        self.hidden, self.fixed = hidden, fixed
        if fixed:
            self.input_proj = nn.Linear(d, hidden)
        self.body = nn.Sequential(nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 3))

    def forward(self, x):
        if self.fixed:
            proj = self.input_proj
        else:  # "size the first layer from the data, so the model works for any feature set"
            proj = nn.Linear(x.shape[1], self.hidden).to(x.device)
        return self.body(proj(x))


def layer_in_forward(fixed: bool = False):
    seed(0)
    x, y = churn(2000, 62)
    xv, yv = churn(800, 63)
    model = ChurnNet(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


case("ah_input_layer_built_in_forward", "what_is_trained",
     "The churn model creates its input layer nn.Linear(x.shape[1], hidden) inside forward(), so each call runs a "
     "new randomly initialised layer that is not registered in __init__, not in the optimizer and never trained, and "
     "the layers after it see differently scrambled features at every step.",
     r"(created|built|constructed|instantiated|defined|new)\w*.{0,60}(inside|in|during|every|each) (the )?"
     r"(forward|call|step|pass)|inside forward|__init__|(not|never) (registered|a submodule|part of the model)|"
     r"(new|fresh|re-?initiali[sz]ed) (random )?(weights|parameters|layer)|"
     r"(output|prediction)s?.{0,60}(differ|change|not (deterministic|reproducible)).{0,60}(same|identical) (input|"
     r"batch)|"
     r"non-?determinis")(layer_in_forward)

# --------------------------------------------------------------------------------------------------------------
# Energy forecasting: the optimizer is built, then the model is built again (a notebook cell re-run / a fresh
# instance after moving it), so the optimizer steps the parameters of a model that is not the one trained.


def energy(n: int, s: int, d: int = 12):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=gen(71)) / d ** 0.5
    y = torch.tanh(x @ w) * 2 + 0.5 * x[:, 0] * x[:, 1] + 0.1 * torch.randn(n, generator=g)
    return x, y.unsqueeze(1)


def make_energy_net():
    return nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def model_rebuilt(fixed: bool = False):
    seed(0)
    x, y = energy(2000, 72)
    xv, yv = energy(600, 73)
    model = make_energy_net()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    if not fixed:
        model = make_energy_net()   # the "build model" cell run again after the optimizer cell
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 600, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=3000)


case("ah_optimizer_holds_old_model", "what_is_trained",
     "The optimizer was built on model.parameters() and the model was then instantiated again, so the model passed "
     "to training (and evaluated) is a second instance none of whose parameters the optimizer holds: its gradients "
     "are computed every step and never applied.",
     r"none of (the )?(model'?s? )?(parameters|weights)|(no|zero|0) (of the )?(model'?s? )?parameters? "
     r"(are |is )?(in|held by)|optimi[sz]er.{0,60}(different|another|other|old|previous|stale|separate|earlier) "
     r"(model|instance|copy|object|parameters?)|(re-?created|re-?built|re-?instantiated|instantiated again|"
     r"new instance|second instance)|(model|parameters?).{0,40}(not|none).{0,20}(the )?(same|identical) "
     r"(objects?|tensors?) as (in )?(the )?optimi[sz]er")(model_rebuilt)

# --------------------------------------------------------------------------------------------------------------
# Product-image classification from scratch with an optimizer line copied from a fine-tuning tutorial:
# optim.SGD(model.fc.parameters()) -- "only the classifier is optimised" -- but nothing here is pretrained.


class SmallConvNet(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(width, 4)

    def forward(self, x):
        return self.fc(self.features(x).amax(dim=(2, 3)))


def head_only_optimizer(fixed: bool = False):
    seed(0)
    x, y = texture_tiles(1024, 81)
    xv, yv = texture_tiles(512, 82)
    model = SmallConvNet()
    params = model.parameters() if fixed else model.fc.parameters()
    return dict(model=model, optimizer=torch.optim.SGD(params, lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


case("ah_optimizer_only_on_classifier", "what_is_trained",
     "The optimizer is optim.SGD(model.fc.parameters(), ...), the 'train only the classifier' line of a fine-tuning "
     "tutorial, but the convolutional features were never pretrained: 2,480 of the 2,548 parameters are left out of "
     "the optimizer and stay random, and only the last linear layer learns.",
     r"optimi[sz]er.{0,80}(only|just)\b.{0,40}(fc|classifier|head|last layer|final layer)|"
     r"(fc|classifier|head)\.parameters\(\)|(only|just) (the )?(fc|classifier|head|last layer|final layer)('s)? "
     r"(parameters |weights )?(are )?(in|optimi[sz]ed|updated|trained)|(random|untrained|never trained|"
     r"never pretrained|"
     r"not pretrained) (conv\w* )?(features|backbone|feature extractor|layers)|"
     r"(backbone|features|conv\w*).{0,60}(not|never) (in|passed to|optimi[sz]ed|updated|trained)|"
     r"fine-?tun\w*.{0,80}(scratch|pretrained)|"
     r"\d[\d,]* of (the )?\d[\d,]* (trainable )?parameters")(head_only_optimizer)

# --------------------------------------------------------------------------------------------------------------
# Multi-task marketing model (open rate, click rate, spend): the three heads are [nn.Linear(h, 1)] * 3, one module
# repeated, so all three tasks get the same prediction.


def campaigns(n: int, s: int, d: int = 10):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 3, generator=gen(91)) / d ** 0.5
    y = torch.stack([torch.tanh((x @ w)[:, 0]) * 1.5, (x @ w)[:, 1], x[:, 0] * x[:, 1] - (x @ w)[:, 2]], 1)
    return x, y + 0.1 * torch.randn(n, 3, generator=g)


class MultiTask(nn.Module):
    def __init__(self, d=10, hidden=64, tasks=3, fixed=False):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        if fixed:
            self.heads = nn.ModuleList([nn.Linear(hidden, 1) for _ in range(tasks)])
        else:
            self.heads = nn.ModuleList([nn.Linear(hidden, 1)] * tasks)   # one head per task

    def forward(self, x):
        h = self.trunk(x)
        return torch.cat([head(h) for head in self.heads], dim=1)


def shared_heads(fixed: bool = False):
    seed(0)
    x, y = campaigns(2000, 92)
    xv, yv = campaigns(600, 93)
    model = MultiTask(fixed=fixed)

    def multitask_loss(model, batch):
        inputs, targets = batch
        return F.mse_loss(model(inputs), targets)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 600, shuffle=False),
                loss_fn=multitask_loss, max_steps=3000)


case("ah_task_heads_one_shared_module", "what_is_trained",
     "The three task heads are built as nn.ModuleList([nn.Linear(hidden, 1)] * 3), which repeats one Linear object "
     "three times: the tasks share a single set of head weights, the model emits the same number for open rate, "
     "click rate and spend, and can only fit their average.",
     r"(same|one|single|shared|identical) (module|object|instance|linear|head)s?\b.{0,60}"
     r"(repeated|reused|shared|three times|\d times|multiple times|for (all|every|each))|"
     r"\[.{0,40}\] ?\* ?\d|list multiplication|(shares?|sharing|shared) (weights|parameters)|"
     r"(heads?|tasks?|outputs?|columns?).{0,60}(identical|the same (values?|predictions?|outputs?)|equal)|"
     r"(identical|equal) (outputs?|predictions?|columns?)|duplicate (modules?|parameters?)|"
     r"(is|are) the same (object|module)")(shared_heads)

# --------------------------------------------------------------------------------------------------------------
# The one-line fixes verify.py trains next to each case, and the metric both are scored on.

_argmax_acc = acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))

fix("ah_hook_features_detached_backbone", fixed_of(hook_detach), _argmax_acc, "val accuracy")
fix("ah_input_layer_built_in_forward", fixed_of(layer_in_forward), _argmax_acc, "val accuracy")
fix("ah_optimizer_holds_old_model", fixed_of(model_rebuilt), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE",
    higher=False)
fix("ah_optimizer_only_on_classifier", fixed_of(head_only_optimizer), _argmax_acc, "val accuracy")


def _mean_task_rmse(model, kw):
    def fn(m, b):
        return ((m(b[0]) - b[1]) ** 2).mean(0).sqrt().sum().item(), 3
    return mean_over(model, kw["val_loader"], fn)


fix("ah_task_heads_one_shared_module", fixed_of(shared_heads), _mean_task_rmse, "val RMSE averaged over the 3 tasks",
    higher=False)
