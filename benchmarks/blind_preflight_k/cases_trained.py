"""Family ``what_is_trained``: unregistered modules, stale optimizers, init, dropout semantics, gradient-free forwards."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_k.registry import acc_of, case, fix, fixed_of, gen, loader, seed, split, teacher_classes

_argmax = acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


# --- 1. hidden layers kept in a plain Python list ---------------------------------------------------------------------
class TabularNet(nn.Module):
    def __init__(self, dims=(24, 12, 12), classes=5, registered=False):
        super().__init__()
        layers = [nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:])]
        self.hidden = nn.ModuleList(layers) if registered else layers
        self.out = nn.Linear(dims[-1], classes)

    def forward(self, x):
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.out(x)


def insurance_layers_in_python_list(fixed: bool = False):
    seed(0)
    x, y = teacher_classes(1600, 24, 5, s=111)
    (xt, yt), (xv, yv) = split(x, y, 1280)
    model = TabularNet(registered=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), batch_size=64),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("insurance_layers_in_python_list", "what_is_trained",
     "The hidden nn.Linear layers are stored in a plain Python list (self.hidden = [...]) instead of nn.ModuleList, "
     "so they are not registered: model.parameters() and the optimizer see only the output layer and the hidden "
     "layers stay at their random initialisation; wrap the list in nn.ModuleList.",
     r"ModuleList|plain (python )?list|python list|not registered|unregistered|register_module|add_module|"
     r"(not|never) (returned by|in|part of) model\.parameters\(\)|parameters\(\) (does not|doesn't) (include|see)",
     )(insurance_layers_in_python_list)
fix("insurance_layers_in_python_list", fixed_of(insurance_layers_in_python_list), _argmax, "val accuracy",
    steps=250)


# --- 2. new head swapped in after the optimizer was built --------------------------------------------------------------
def _pretrained_backbone():
    """A backbone 'pretrained' on a 10-way source task (a few full-batch steps here), then frozen."""
    torch.manual_seed(5)
    backbone = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    src_head = nn.Linear(64, 10)
    xs, ys = teacher_classes(2000, 16, 10, s=121)
    opt = torch.optim.Adam([*backbone.parameters(), *src_head.parameters()], lr=1e-2)
    for _ in range(60):
        opt.zero_grad()
        F.cross_entropy(src_head(backbone(xs)), ys).backward()
        opt.step()
    return backbone, src_head


def defect_head_swapped_after_optimizer(fixed: bool = False):
    seed(0)
    backbone, src_head = _pretrained_backbone()
    model = nn.Sequential()
    model.backbone, model.head = backbone, src_head
    for p in model.backbone.parameters():
        p.requires_grad = False                                   # feature extraction on purpose
    if not fixed:
        optimizer = torch.optim.Adam(model.head.parameters(), lr=5e-3)
    model.head = nn.Linear(64, 4)                                 # the new task has 4 classes
    if fixed:
        optimizer = torch.optim.Adam(model.head.parameters(), lr=5e-3)
    x, y = teacher_classes(1500, 16, 4, s=122)
    (xt, yt), (xv, yv) = split(x, y, 1200)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(xt, yt), batch_size=50),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("defect_head_swapped_after_optimizer", "what_is_trained",
     "The optimizer is built on model.head.parameters() before model.head is replaced by the new 4-class layer, so "
     "it updates the discarded 10-class head (no longer part of the model) while the new head, the only trainable "
     "module, is not in the optimizer and never changes; create the optimizer after swapping the head.",
     r"(no longer|not) (part of|in|belong\w* to) the model|stale|discarded|(old|previous|replaced) (head|layer|"
     r"module)|optimi[sz]er (was )?(built|created|constructed|made) before|(re-?create|rebuild) the optimi[sz]er|"
     r"head\.(weight|bias)|none of the (model's )?(trainable )?param|(only )?trainable (module|param\w*) .{0,40}not in "
     r"the optimi[sz]er",
     )(defect_head_swapped_after_optimizer)
fix("defect_head_swapped_after_optimizer", fixed_of(defect_head_swapped_after_optimizer), _argmax,
    "val accuracy", steps=250)


# --- 3. all weights initialised to zero --------------------------------------------------------------------------------
def churn_zero_init(fixed: bool = False):
    seed(0)
    x, y = teacher_classes(1500, 12, 3, s=131)
    (xt, yt), (xv, yv) = split(x, y, 1200)
    model = nn.Sequential(nn.Linear(12, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh(), nn.Linear(48, 3))

    def init_weights(m):                                          # "kernel_initializer='zeros'"
        if isinstance(m, nn.Linear):
            (nn.init.xavier_uniform_ if fixed else nn.init.zeros_)(m.weight)
            nn.init.zeros_(m.bias)

    model.apply(init_weights)
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                train_loader=loader(TensorDataset(xt, yt), batch_size=50),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("churn_zero_init", "what_is_trained",
     "An init function applies nn.init.zeros_ to every nn.Linear weight: with all-zero weights the hidden units are "
     "identical (symmetric) and the gradients to the hidden layers are exactly zero, so only the output bias "
     "learns; use a random init (xavier_uniform_ / the default).",
     r"zeros_|zero[- ]init\w*|initiali[sz]ed (to|with|at|as) (all[- ])?(zeros?|0)|all[- ]zero (weights|init)|"
     r"weights? (are|is) (all )?(zero|0)\b|symmetr\w*|identical (hidden )?(units|neurons)|xavier|kaiming",
     )(churn_zero_init)
fix("churn_zero_init", fixed_of(churn_zero_init), _argmax, "val accuracy", steps=250)


# --- 4. TensorFlow keep_prob passed as PyTorch's drop probability ------------------------------------------------------
def credit_dropout_keep_prob(fixed: bool = False):
    seed(0)
    keep_prob = 0.9                                               # from the TF1 config
    p = 1 - keep_prob if fixed else keep_prob
    x, y = teacher_classes(1600, 16, 6, s=141)
    (xt, yt), (xv, yv) = split(x, y, 1280)
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Dropout(p), nn.Linear(128, 128), nn.ReLU(),
                          nn.Dropout(p), nn.Linear(128, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt, yt), batch_size=64),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("credit_dropout_keep_prob", "what_is_trained",
     "A TensorFlow keep_prob of 0.9 is passed as nn.Dropout(p=0.9), but PyTorch's p is the probability of zeroing: "
     "90% of the hidden units are dropped at every step; use p = 1 - keep_prob = 0.1.",
     r"keep_prob|keep probability|probability of (keeping|retention|retaining)|1\s*-\s*keep|"
     r"(p|dropout|rate)\s*=\s*0\.9\b|(drops?|zero(es|s)?) 90\s*%|90\s*% (of (the )?)?(units|activations|neurons)",
     )(credit_dropout_keep_prob)
fix("credit_dropout_keep_prob", fixed_of(credit_dropout_keep_prob), _argmax, "val accuracy", steps=250)


# --- 5. encoder wrapped in torch.no_grad() inside forward --------------------------------------------------------------
class ReviewClassifier(nn.Module):
    def __init__(self, frozen_forward: bool, vocab=400, d=32):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, d, mode="mean")
        self.encoder = nn.Sequential(nn.Linear(d, d), nn.ReLU())
        self.head = nn.Linear(d, 2)
        self.frozen_forward = frozen_forward

    def forward(self, tokens):
        if self.frozen_forward:
            with torch.no_grad():                                 # copied from a feature-extraction notebook
                h = self.encoder(self.emb(tokens))
        else:
            h = self.encoder(self.emb(tokens))
        return self.head(h)


def _reviews(n, s):
    g = gen(s)
    tok = torch.randint(0, 400, (n, 24), generator=g)
    score = ((tok < 40).sum(1) - ((tok >= 40) & (tok < 80)).sum(1)).float()
    y = (score + 0.5 * torch.rand(n, generator=g) - 0.25 > 0).long()
    return tok, y


def review_encoder_under_no_grad(fixed: bool = False):
    seed(0)
    tok, y = _reviews(1800, 151)
    (xt, yt), (xv, yv) = split(tok, y, 1500)
    model = ReviewClassifier(frozen_forward=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(xt, yt), batch_size=50),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("review_encoder_under_no_grad", "what_is_trained",
     "forward() runs the embedding bag and the encoder inside `with torch.no_grad():`, so no graph is recorded "
     "through them: although they require grad and are in the optimizer, only the linear head is ever trained, "
     "on random features; remove the no_grad block.",
     r"no_grad|inference_mode|set_grad_enabled|grad(ient)? (tracking|mode) (is )?(disabled|off)|"
     r"no (autograd )?graph (is )?(recorded|built)|(emb|encoder)\.\w*weight|"
     r"(embedding|encoder)\w*.{0,60}(never|not|aren't|isn't) (updated|trained|receiv\w+ gradients?)",
     )(review_encoder_under_no_grad)
fix("review_encoder_under_no_grad", fixed_of(review_encoder_under_no_grad), _argmax, "val accuracy", steps=250)
