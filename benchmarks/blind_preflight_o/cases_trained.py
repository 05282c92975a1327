"""Set o, family what_is_trained: the weights that should learn are not the ones the optimizer updates."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertForSequenceClassification

from benchmarks.blind_preflight_o.registry import acc_of, case, fix, fixed_of, gen, loader, seed, tensors

# --------------------------------------------------------------------------------------------------------------
# Keyword-spotting net adapted to 3 new commands: the head is swapped after the optimizer was built.
# Sources: https://github.com/feedly/transfer-nlp/pull/14, https://github.com/ifzhang/FairMOT/issues/125


def band_spectrograms(n: int, s: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 16, 32) log-mel-like frames: class k puts energy into its own band of mel bins at random times."""
    g = gen(s)
    y = torch.randint(0, classes, (n,), generator=g)
    x = 0.5 * torch.randn(n, 16, 32, generator=g)
    bins = torch.arange(16).view(1, 16, 1)
    lo = (y * (16 // classes)).view(n, 1, 1)
    on = torch.rand(n, 1, 32, generator=g) < 0.5
    x = x + 1.0 * ((bins >= lo) & (bins < lo + 16 // classes) & on).float()
    return x, y


class KeywordNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.Conv1d(32, 32, 5, padding=2),
                                     nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        return self.fc(self.encoder(x))


@case("trained_new_head_not_in_optimizer", "what_is_trained",
      "The Adam optimizer is created from model.parameters() of the 10-keyword network, then the encoder is frozen "
      "and model.fc is replaced by a new nn.Linear(32, 3): the new head's weights were never given to the optimizer, "
      "so nothing that requires grad is ever stepped and the 3-command classifier stays at its random init.",
      r"fc\.(weight|bias)|model\.fc|(new|replaced|swapped) (head|layer|fc|classifier|module)|after (creating|building"
      r"|constructing) the optimi[sz]er|before (replacing|swapping)|add_param_group|(re)?create the optimi[sz]er"
      r"|never (given|passed|handed) to the optimi[sz]er")
def build_keywords(fixed: bool = False) -> dict:
    seed(0)
    model = KeywordNet(10)                       # the "pretrained" checkpoint
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for p in model.parameters():
        p.requires_grad = False
    model.fc = nn.Linear(32, 3)
    if fixed:
        optimizer = torch.optim.Adam(model.fc.parameters(), lr=1e-2)
    x, y = band_spectrograms(1500, 13, 3)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(tensors(x[:1200], y[:1200]), 32),
                val_loader=loader(tensors(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("trained_new_head_not_in_optimizer", fixed_of(build_keywords), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# Expression-profile classifier with a hand-written low-rank projection: nn.Parameter(...) * 0.05 is a plain tensor.
# Source: https://runebook.dev/zh/docs/pytorch/generated/torch.nn.parameter.parameter


def expression(n: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(s)
    x = torch.randn(n, 200, generator=g)
    w = torch.randn(5, generator=g)
    return x, (x[:, :5] @ w > 0).long()


class LowRankProbe(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        if fixed:
            self.proj = nn.Parameter(torch.randn(200, 8) * 0.05)
        else:
            self.proj = nn.Parameter(torch.randn(8, 200) * 0.05).t()     # stored (out, in) like nn.Linear.weight
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x):
        return self.head(x @ self.proj.to(x.device))        # .to(): "expected all tensors on the same device"


@case("trained_transposed_parameter_not_registered", "what_is_trained",
      "The projection is written self.proj = nn.Parameter(torch.randn(8, 200) * 0.05).t(): transposing the "
      "Parameter returns a plain (non-leaf) tensor, so the 200x8 projection is not registered in model.parameters(), the "
      "optimizer never sees it and the classifier only trains its 8->2 head on a fixed random projection.",
      r"not (a |an )?(registered|leaf)|non-leaf|plain tensor|nn\.Parameter\(|register_parameter|not in "
      r"model\.(named_)?parameters|missing from (model\.)?(named_)?parameters|never sees|transpos\w* (the |a )?Parameter")
def build_expression(fixed: bool = False) -> dict:
    seed(0)
    x, y = expression(1600, 14)
    model = LowRankProbe(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(x[:1300], y[:1300]), 64),
                val_loader=loader(tensors(x[1300:], y[1300:]), 150, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("trained_transposed_parameter_not_registered", fixed_of(build_expression),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# Click model warm-started from last quarter's item vectors with nn.Embedding.from_pretrained (freeze=True default).
# Source: https://github.com/RUCAIBox/RecBole/issues/2046

USERS, ITEMS = 120, 160


def clicks(n: int, s: int) -> tuple[torch.Tensor, ...]:
    g = gen(s)
    p, q = torch.randn(USERS, 6, generator=g), torch.randn(ITEMS, 6, generator=g)
    u, i = torch.randint(0, USERS, (n,), generator=g), torch.randint(0, ITEMS, (n,), generator=g)
    score = (p[u] * q[i]).sum(-1) / 6 ** 0.5 + 0.3 * torch.randn(n, generator=g)
    return u, i, (score > 0).float()


class ClickMF(nn.Module):
    def __init__(self, old_item_vectors: torch.Tensor, fixed: bool):
        super().__init__()
        self.user = nn.Embedding(USERS, 16)
        if fixed:
            self.item = nn.Embedding.from_pretrained(old_item_vectors, freeze=False)
        else:
            self.item = nn.Embedding.from_pretrained(old_item_vectors)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, u, i):
        return (self.user(u) * self.item(i)).sum(-1) + self.bias


def click_loss(model, batch):
    u, i, y = batch
    return F.binary_cross_entropy_with_logits(model(u, i), y)


@case("trained_pretrained_item_embeddings_frozen", "what_is_trained",
      "The item table is loaded with nn.Embedding.from_pretrained(old_item_vectors), whose default freeze=True sets "
      "requires_grad=False: last quarter's item vectors (another catalogue, uninformative here) never move and "
      "only the user vectors train, so the dot product cannot fit this quarter's clicks.",
      r"from_pretrained|freeze ?= ?(True|False)|frozen (item |pretrained )?embedding|embedding\w* (is|are) frozen"
      r"|embedding\w*.{0,40}requires_grad ?= ?False|item\.weight|(item|embedding) (table|weights?|vectors?) (is|are) "
      r"(frozen|not trained)")
def build_clicks(fixed: bool = False) -> dict:
    seed(0)
    u, i, y = clicks(24000, 15)
    old_item_vectors = 0.3 * torch.randn(ITEMS, 16, generator=gen(16))
    model = ClickMF(old_item_vectors, fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(tensors(u[:20000], i[:20000], y[:20000]), 128),
                val_loader=loader(tensors(u[20000:], i[20000:], y[20000:]), 1000, shuffle=False),
                loss_fn=click_loss, max_steps=400)


fix("trained_pretrained_item_embeddings_frozen", fixed_of(build_clicks),
    acc_of(lambda m, b: ((m(b[0], b[1]) > 0).long(), b[2].long())), "val click accuracy", steps=400)


# --------------------------------------------------------------------------------------------------------------
# Bird-call classifier whose (randomly initialised) encoder runs under torch.no_grad() in forward.
# Source: https://dp0d.github.io/finetune_trick


def chirps(n: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 16, 32) spectrograms: rising chirp, falling chirp, steady tone, or two alternating tones."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    t = torch.arange(32).float()
    start = torch.randint(0, 8, (n, 1), generator=g).float()
    slope = torch.where(y == 0, 0.25, torch.where(y == 1, -0.25, 0.0)).unsqueeze(1)
    f = torch.where((y == 1).unsqueeze(1), start + 8, start) + slope * t
    f = torch.where((y == 3).unsqueeze(1), start + 6 * ((t // 4) % 2), f).round().long().clamp(0, 15)
    x = 0.6 * torch.randn(n, 16, 32, generator=g)
    x.scatter_add_(1, f.unsqueeze(1), torch.ones(n, 1, 32))
    return x, y


class CallClassifier(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.encoder = nn.Sequential(nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.Conv1d(32, 32, 5, padding=2),
                                     nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten())
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        if self.fixed:
            feats = self.encoder(x)
        else:
            with torch.no_grad():                 # "saves memory", from a feature-extraction snippet
                feats = self.encoder(x)
        return self.head(feats)


@case("trained_encoder_under_no_grad", "what_is_trained",
      "The forward wraps the (randomly initialised, meant to be trained) convolutional encoder in "
      "with torch.no_grad():, copied from a feature-extraction snippet: no graph is recorded through it, its "
      "weights never get a gradient although they require grad, and only the linear head learns on random features.",
      r"no_grad|inference_mode|no (autograd )?graph|never (get|receive)s? (a )?grad|without "
      r"(a )?grad\w*|detach\w*|gradient\w* (do(es)? not|don't|never) (flow|reach)")
def build_calls(fixed: bool = False) -> dict:
    seed(0)
    x, y = chirps(1500, 17)
    model = CallClassifier(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(x[:1200], y[:1200]), 32),
                val_loader=loader(tensors(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("trained_encoder_under_no_grad", fixed_of(build_calls), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# Tiny BERT review classifier: the top two encoder layers "unfrozen" with layer.requires_grad = True.
# Source: https://theneuralbase.com/pytorch/learn/intermediate/replacing-the-classification-head/

CLS_ID = 1


def lexicon_reviews(n: int, s: int, length: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids 3-12 are positive words, 13-22 negative, 23-49 neutral; label 1 when positives outnumber negatives."""
    g = gen(s)
    ids = torch.randint(3, 50, (n, length), generator=g)
    ids[:, 0] = CLS_ID
    pos = ((ids >= 3) & (ids <= 12)).sum(1)
    neg = ((ids >= 13) & (ids <= 22)).sum(1)
    keep = pos != neg
    return ids[keep], (pos > neg).long()[keep]


@case("trained_requires_grad_set_on_module", "what_is_trained",
      "After freezing model.bert, the top two encoder layers are 'unfrozen' with layer.requires_grad = True: that "
      "sets a plain attribute on the nn.Module, not on its parameters (requires_grad_(True) does), so the layers stay "
      "frozen, filter(requires_grad) leaves only the classifier in AdamW and it learns on a frozen random encoder.",
      r"requires_grad_\(|attribute on (the |an )?(nn\.)?Module|(module|layer)\.requires_grad ?=|plain (python )?"
      r"attribute|not (on|to) (its|the) parameters|set on the module")
def build_reviews(fixed: bool = False) -> dict:
    seed(0)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=24, num_labels=2)
    model = BertForSequenceClassification(config)
    for p in model.bert.parameters():
        p.requires_grad = False
    for layer in model.bert.encoder.layer[-2:]:
        if fixed:
            layer.requires_grad_(True)
        else:
            layer.requires_grad = True
    optimizer = torch.optim.AdamW(filter(lambda p: p.requires_grad, model.parameters()), lr=2e-3)
    ids, y = lexicon_reviews(2000, 18)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(ReviewRows(ids[:1500], y[:1500]), 32),
                val_loader=loader(ReviewRows(ids[1500:], y[1500:]), 100, shuffle=False),
                loss_fn=None, max_steps=300)


class ReviewRows(torch.utils.data.Dataset):
    def __init__(self, ids, y):
        self.ids, self.y = ids, y

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return dict(input_ids=self.ids[i], labels=self.y[i])


fix("trained_requires_grad_set_on_module", fixed_of(build_reviews),
    acc_of(lambda m, b: (m(input_ids=b["input_ids"]).logits.argmax(-1), b["labels"])), "val accuracy")
