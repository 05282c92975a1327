"""Set ac, family what_is_trained: the weights that would learn the task are not the ones being updated."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ac.cases_shapes import color_tiles, topic_docs
from benchmarks.blind_preflight_ac.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed


def argmax_acc():
    return acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


# --- new head swapped in after the optimizer was built ---------------------------------------------------------

class SmallBackbone(nn.Module):
    """Stands for a 'pretrained' backbone: conv features + an fc for its original 10 classes."""
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 24, 3, padding=1), nn.ReLU(), nn.Conv2d(24, 24, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        return self.fc(self.features(x))


@case("head_replaced_after_optimizer_built", "what_is_trained",
      bug="Feature extraction: the backbone is frozen, the optimizer is built on model.fc.parameters(), and only "
          "then is model.fc replaced by the new 3-class nn.Linear: the optimizer still holds the old fc's tensors, "
          "the new head gets gradients but is never stepped, and nothing in the model is updated.",
      cause_pattern=r"(fc|head|classifier|new layer|nn\.Linear)\w*.{0,120}(not|never|missing)\w* (in|from|covered by|"
                    r"registered (with|in)|held by|stepped|updated)|(optimizer|param_groups).{0,120}(old|previous|"
                    r"replaced|stale)\w* (fc|head|classifier|output layer)|(replac|swap|reassign)\w*"
                    r".{0,80}after.{0,40}optimizer|optimizer.{0,60}after.{0,60}(replac|swap)")
def head_replaced_after_optimizer_built(fixed=False):
    seed(0)
    x, y = color_tiles(1500, 21)
    x = x.permute(0, 3, 1, 2).contiguous()
    model = SmallBackbone()
    for p in model.parameters():
        p.requires_grad = False
    if fixed:
        model.fc = nn.Linear(24, 3)
        optimizer = torch.optim.Adam(model.fc.parameters(), lr=1e-2)
    else:
        optimizer = torch.optim.Adam(model.fc.parameters(), lr=1e-2)
        model.fc = nn.Linear(24, 3)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:1100], y[:1100]), 32),
                val_loader=loader(TensorDataset(x[1100:], y[1100:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("head_replaced_after_optimizer_built", fixed_of(head_replaced_after_optimizer_built), argmax_acc(),
    "val accuracy", steps=300)


# --- Embedding.from_pretrained freezes a random table ------------------------------------------------------------

class BagOfEmbeddings(nn.Module):
    def __init__(self, vectors, freeze):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(vectors, freeze=freeze)
        self.head = nn.Linear(vectors.size(1), 4)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(1))


@case("random_vectors_frozen_by_from_pretrained", "what_is_trained",
      bug="No GloVe file matched the vocabulary, so the embedding table is initialised from torch.randn through "
          "nn.Embedding.from_pretrained, whose default freeze=True keeps the random vectors fixed: only the linear "
          "head on their mean trains, and the topic words never get embeddings of their own.",
      cause_pattern=r"from_pretrained|freeze ?= ?True|(embedding|embed)\w*.{0,80}(frozen|freez|requires_grad|not "
                    r"(train|updat|learn))|(frozen|freez)\w*.{0,80}(embedding|random (vectors|init|table))")
def random_vectors_frozen_by_from_pretrained(fixed=False):
    seed(0)
    x, y = topic_docs(1800, 22)
    vectors = 0.5 * torch.randn(180, 16, generator=gen(23))
    model = BagOfEmbeddings(vectors, freeze=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2),
                train_loader=loader(TensorDataset(x[:1400], y[:1400]), 32),
                val_loader=loader(TensorDataset(x[1400:], y[1400:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("random_vectors_frozen_by_from_pretrained", fixed_of(random_vectors_frozen_by_from_pretrained), argmax_acc(),
    "val accuracy", steps=300)


# --- hidden weights kept as plain tensors -----------------------------------------------------------------------

def churn_table(n, s):
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    score = x[:, 0] * x[:, 1] + torch.sin(2 * x[:, 2]) + 0.7 * x[:, 3] ** 2 - 0.7
    return x, torch.bucketize(score, torch.tensor([-0.5, 0.5]))


class ChurnNet(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        w = 0.25 * torch.randn(16, 12)
        if fixed:
            self.w1, self.b1 = nn.Parameter(w), nn.Parameter(torch.zeros(12))
        else:
            self.w1, self.b1 = w.requires_grad_(), torch.zeros(12, requires_grad=True)
        self.out = nn.Linear(12, 3)

    def forward(self, x):
        h = torch.relu(x @ self.w1.to(x.device) + self.b1.to(x.device))
        return self.out(h)


@case("hidden_weights_plain_tensors_not_parameters", "what_is_trained",
      bug="The hidden layer's weight and bias are plain tensors made with requires_grad=True and stored as "
          "attributes instead of nn.Parameter: they are not registered, model.parameters() (and so the optimizer) "
          "never sees them, and the first layer stays at its random initialisation.",
      cause_pattern=r"nn\.Parameter|register_(parameter|buffer)|(plain|bare|raw|regular|ordinary) tensor|"
                    r"not (registered|a parameter|an? nn\.Parameter)|(missing|absent) from (model\.)?parameters|"
                    r"unregistered|requires_grad ?= ?True.{0,80}(attribute|tensor)")
def hidden_weights_plain_tensors_not_parameters(fixed=False):
    seed(0)
    x, y = churn_table(2000, 24)
    model = ChurnNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("hidden_weights_plain_tensors_not_parameters", fixed_of(hidden_weights_plain_tensors_not_parameters),
    argmax_acc(), "val accuracy", steps=300)


# --- encoder run under torch.no_grad() in forward --------------------------------------------------------------

def vibration_windows(n, s):
    """(n, 2, 48) vibration windows; class = which of 3 burst shapes appears at a random position."""
    g = gen(s)
    x = 0.5 * torch.randn(n, 2, 48, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    shapes = torch.tensor([[1., 1., 1., 1., 1., 1.], [1., -1., 1., -1., 1., -1.], [1., 1., 1., -1., -1., -1.]])
    pos = torch.randint(0, 42, (n,), generator=g)
    for i in range(n):
        x[i, 0, pos[i]:pos[i] + 6] += 1.2 * shapes[y[i]]
        x[i, 1, pos[i]:pos[i] + 6] -= 0.6 * shapes[y[i]]
    return x, y


class VibrationNet(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.encoder = nn.Sequential(nn.Conv1d(2, 8, 5, padding=2), nn.ReLU(), nn.Conv1d(8, 8, 5, padding=2),
                                     nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten())
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        if self.fixed:
            feats = self.encoder(x)
        else:
            with torch.no_grad():       # copied from a feature-extraction tutorial
                feats = self.encoder(x)
        return self.head(feats)


@case("encoder_forward_under_no_grad", "what_is_trained",
      bug="The model's forward runs its freshly initialised Conv1d encoder inside torch.no_grad() (copied from a "
          "feature-extraction tutorial with a pretrained encoder): no graph reaches the encoder, its weights get no "
          "gradient although they are in the optimizer, and only the linear head on random features trains.",
      cause_pattern=r"no_grad|inference_mode|(encoder|conv|backbone|feature)\w*.{0,100}(no grad|None grad|\.grad is "
                    r"None|never (receive|get)s? (a )?grad|zero grad|not (receive|get)\w* (a )?grad)|(graph|gradient flow)\w*"
                    r".{0,30}(is |was )?(cut|detached|disconnected)")
def encoder_forward_under_no_grad(fixed=False):
    seed(0)
    x, y = vibration_windows(1600, 25)
    model = VibrationNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("encoder_forward_under_no_grad", fixed_of(encoder_forward_under_no_grad), argmax_acc(), "val accuracy", steps=300)


# --- the optimizer belongs to an earlier instance of the model (notebook cell re-run) ------------------------------

def delivery_table(n, s):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    y = 2.0 * torch.tanh(x[:, 0] + 0.5 * x[:, 1]) + x[:, 2] * x[:, 3] + 0.1 * torch.randn(n, generator=g)
    return x, y.unsqueeze(1)


def delivery_mlp():
    return nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


@case("optimizer_from_earlier_model_instance", "what_is_trained",
      bug="In the notebook the optimizer cell ran on one instance of the model, then the model cell was re-run "
          "(model = delivery_mlp()): the optimizer holds the parameters of the old, discarded instance, so the "
          "model being trained gets gradients that no optimizer step ever applies.",
      cause_pattern=r"none of (the )?model'?s? param|(optimizer|param_groups).{0,80}(contains?|holds?|has|includes?) "
                    r"(none|no\w*) of|optimizer.{0,100}(different|another|old|earlier|previous|stale|discarded) "
                    r"(model|instance|copy|object)|(different|another|old|earlier|previous|stale|discarded) (model )?"
                    r"(instance|copy|object)|re-?(ran|run|instantiat)\w*.{0,60}model|0 of \d+ (model )?param")
def optimizer_from_earlier_model_instance(fixed=False):
    seed(0)
    x, y = delivery_table(2000, 26)
    model = delivery_mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    if not fixed:
        model = delivery_mlp()           # the model cell, run once more
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 128, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1500)


fix("optimizer_from_earlier_model_instance", fixed_of(optimizer_from_earlier_model_instance),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=300, higher=False)
