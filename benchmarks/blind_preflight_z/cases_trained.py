"""What is trained: the parameters the user meant to train are frozen, shared, missing from the optimizer or never
loaded."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_z.registry import (
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    plain_acc,
    rmse_of,
    seed,
    to_dev,
)

# --------------------------------------------------------------------------------------------------------------
# 1. Multi-target regression of three material properties: one head per target built as
#    nn.ModuleList([nn.Linear(64, 1)] * 3) -- list multiplication repeats the same Linear object.


class PropertyNet(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        if fixed:
            self.heads = nn.ModuleList([nn.Linear(64, 1) for _ in range(3)])
        else:
            self.heads = nn.ModuleList([nn.Linear(64, 1)] * 3)

    def forward(self, x):
        h = self.trunk(x)
        return torch.cat([head(h) for head in self.heads], 1)


def _materials(n, s=12):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    y = torch.stack([x[:, 0] + 0.5 * x[:, 1], -x[:, 0] + x[:, 2] ** 2 - 1, torch.sin(2 * x[:, 3]) * 1.5], 1)
    return x, y + 0.1 * torch.randn(n, 3, generator=g)


@case("heads_shared_by_list_multiplication", "what_is_trained",
      "The three regression heads are built as nn.ModuleList([nn.Linear(64, 1)] * 3): list multiplication repeats "
      "one Linear object, so all three targets share a single head and get the same prediction.",
      r"\] ?\* ?3|list multiplication|same (Linear|module|object|layer|head)|shar(e|ed|ing) (the same )?"
      r"(weights|parameters|head|layer|module)|identical (heads|outputs|predictions)|for _ in range")
def heads_shared_by_list_multiplication(fixed: bool = False):
    seed(0)
    x, y = _materials(1800)
    model = PropertyNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 300, shuffle=False), loss_fn=nn.MSELoss())


fix("heads_shared_by_list_multiplication", fixed_of(heads_shared_by_list_multiplication),
    rmse_of(lambda m, b: (m(to_dev(m, b[0])[0]), b[1])), "val RMSE", higher=False)

# --------------------------------------------------------------------------------------------------------------
# 2. Fine-tuning the last block of a "pretrained" encoder plus a new head: everything is frozen with a loop,
#    then `model.encoder.block3.requires_grad = True` -- an attribute on the Module, which no parameter reads.


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.block1 = nn.Sequential(nn.Linear(16, 64), nn.ReLU())
        self.block2 = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
        self.block3 = nn.Sequential(nn.Linear(64, 4), nn.Tanh())

    def forward(self, x):
        return self.block3(self.block2(self.block1(x)))


class FineTuned(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(4, 6)

    def forward(self, x):
        return self.head(self.encoder(x))


@case("module_requires_grad_attribute", "what_is_trained",
      "After freezing every parameter, the block meant for fine-tuning is 'unfrozen' with "
      "model.encoder.block3.requires_grad = True, which only sets a Python attribute on the Module: its parameters "
      "keep requires_grad=False, so only the tiny head trains on 4 frozen features (use .requires_grad_(True) or "
      "loop over block3.parameters()).",
      r"requires_grad_\(|block3|\.requires_grad = True.{0,60}(module|attribute)|(module|attribute).{0,60}"
      r"requires_grad|(frozen|requires_grad=False).{0,80}(block|encoder|layer)|parameters\(\).{0,40}requires_grad")
def module_requires_grad_attribute(fixed: bool = False):
    seed(0)
    x, y = _six_classes(2400)
    model = FineTuned()
    for p in model.parameters():
        p.requires_grad = False
    if fixed:
        model.encoder.block3.requires_grad_(True)
    else:
        model.encoder.block3.requires_grad = True
    model.head.requires_grad_(True)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


def _six_classes(n, s=13):
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 6, generator=gen(131))
    return x, (x @ w).argmax(1)


fix("module_requires_grad_attribute", fixed_of(module_requires_grad_attribute), plain_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 3. Transfer from a checkpoint saved under nn.DataParallel: every key starts with "module.", and
#    load_state_dict(..., strict=False) silently loads nothing; the (random) encoder is then frozen.


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 8), nn.Tanh())
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        return self.head(self.encoder(x))


def _pretrained_and_data(n):
    torch.manual_seed(1234)
    teacher = Backbone()
    with torch.no_grad():
        for p in teacher.encoder.parameters():
            p.mul_(2.5)
    g = gen(14)
    x = torch.randn(n, 20, generator=g)
    with torch.no_grad():
        y = (teacher.encoder(x) @ torch.randn(8, 5, generator=gen(141))).argmax(1)
    ckpt = {"module." + k: v.clone() for k, v in teacher.state_dict().items() if k.startswith("encoder")}
    return ckpt, x, y


@case("state_dict_module_prefix_strict_false", "what_is_trained",
      "The checkpoint was saved from nn.DataParallel, so every key starts with 'module.'; "
      "load_state_dict(state, strict=False) matches no key and silently loads nothing, and the randomly initialised "
      "encoder is then frozen as if it were pretrained (strip the 'module.' prefix and load with strict=True).",
      r"module\.|prefix|strict\s*=\s*False|load_state_dict|(missing|unexpected)[_ ]keys|"
      r"(weights|checkpoint).{0,40}(not|never) (loaded|restored)|nothing (was )?loaded")
def state_dict_module_prefix_strict_false(fixed: bool = False):
    ckpt, x, y = _pretrained_and_data(2400)
    seed(0)
    model = Backbone()
    state = {k.removeprefix("module."): v for k, v in ckpt.items()} if fixed else ckpt
    model.load_state_dict(state, strict=False)
    model.encoder.requires_grad_(False)
    return dict(model=model, optimizer=torch.optim.Adam(model.head.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


fix("state_dict_module_prefix_strict_false", fixed_of(state_dict_module_prefix_strict_false), plain_acc,
    "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 4. Bag-of-words intent classifier whose embedding is initialised with nn.Embedding.from_pretrained(vectors):
#    the default freeze=True keeps the (task-agnostic) vectors fixed; the user expected them to be fine-tuned.


class BowClassifier(nn.Module):
    def __init__(self, vectors, fixed=False):
        super().__init__()
        self.emb = nn.Embedding.from_pretrained(vectors, freeze=False) if fixed else \
            nn.Embedding.from_pretrained(vectors)
        self.fc = nn.Linear(vectors.size(1), 4)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


def _intents(n, vocab=300, length=12, s=15):
    g = gen(s)
    topic = torch.randint(0, 4, (vocab,), generator=gen(151))
    ids = torch.randint(0, vocab, (n, length), generator=g)
    votes = torch.stack([(topic[ids] == c).sum(1) for c in range(4)], 1).float()
    y = (votes + 0.1 * torch.rand(n, 4, generator=g)).argmax(1)
    return ids, y


@case("embedding_from_pretrained_frozen", "what_is_trained",
      "The word vectors are loaded with nn.Embedding.from_pretrained(vectors), whose default freeze=True sets "
      "requires_grad=False on the embedding weight, so the embeddings the classifier relies on are never "
      "fine-tuned (pass freeze=False).",
      r"from_pretrained|freeze\s*=\s*(True|False)|(embedding|emb\.weight).{0,60}(frozen|requires_grad|not (trained|"
      r"updated))|frozen.{0,40}embedding")
def embedding_from_pretrained_frozen(fixed: bool = False):
    seed(0)
    ids, y = _intents(2400)
    vectors = torch.randn(300, 8, generator=gen(152)) * 0.5  # task-agnostic "pretrained" vectors
    model = BowClassifier(vectors, fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(ids[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(ids[2000:], y[2000:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


fix("embedding_from_pretrained_frozen", fixed_of(embedding_from_pretrained_frozen), plain_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 5. Tabular autoencoder for sensor compression: optimizer = Adam(model.encoder.parameters()) -- the
#    decoder (a separate submodule of the same model) is never updated.


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
        self.decoder = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, x):
        return self.decoder(self.encoder(x))


def _sensors(n, s=16):
    g = gen(s)
    z = torch.randn(n, 3, generator=g)
    mix = torch.randn(3, 16, generator=gen(161))
    x = torch.tanh(z @ mix) + 0.05 * torch.randn(n, 16, generator=g)
    return x


def recon_mse(model, kw):
    def fn(m, b):
        x = to_dev(m, b[0])[0]
        return ((m(x) - x) ** 2).sum().item(), x.numel()
    return mean_over(model, kw["val_loader"], fn)


@case("optimizer_only_encoder_params", "what_is_trained",
      "The optimizer is built as Adam(model.encoder.parameters()), so the decoder's parameters get gradients but "
      "are never in any optimizer param group and never update; the reconstruction goes through a random "
      "decoder (pass model.parameters()).",
      r"decoder|model\.encoder\.parameters\(\)")
def optimizer_only_encoder_params(fixed: bool = False):
    seed(0)
    x = _sensors(2000)
    model = AutoEncoder()
    params = model.parameters() if fixed else model.encoder.parameters()
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=3e-3),
                train_loader=loader(TensorDataset(x[:1700], x[:1700]), 32),
                val_loader=loader(TensorDataset(x[1700:], x[1700:]), 300, shuffle=False), loss_fn=nn.MSELoss())


fix("optimizer_only_encoder_params", fixed_of(optimizer_only_encoder_params), recon_mse, "val reconstruction MSE",
    higher=False)
