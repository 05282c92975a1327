"""What-is-trained family: five real user bugs where some of the weights the user means to train never change
(no crash)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_p.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed, split

# --------------------------------------------------------------------------------------------------------------------
# 1. Battery health regression: a numpy clip inside forward, "fixed" with .detach(), cuts the encoder off the graph.


def _battery(n: int, s: int):
    """16 cycling statistics per cell -> state of health (standardised)."""
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    soh = (torch.sin(1.5 * x[:, 0]) * x[:, 1] + 0.8 * torch.tanh(x[:, 2] * x[:, 3]) + 0.5 * x[:, 4] ** 2
           - 0.6 * x[:, 5] * x[:, 6] + 0.3 * torch.cos(2 * x[:, 7]) + 0.05 * torch.randn(n, generator=g))
    return x, (soh - 0.5).view(-1, 1)


class BatteryNet(nn.Module):
    def __init__(self, torch_clip: bool):
        super().__init__()
        self.torch_clip = torch_clip
        self.encoder = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU())
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        h = self.encoder(x)
        if self.torch_clip:
            h = torch.clamp(h, -3.0, 3.0)
        else:
            # np.clip "to keep activations bounded"; .detach() added after
            # "RuntimeError: Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
            h = torch.from_numpy(np.clip(h.detach().cpu().numpy(), -3.0, 3.0)).to(x.device)
        return self.head(h)


@case("trained_battery_numpy_detach_in_forward", "what_is_trained",
      bug="forward() clips the encoder activations with np.clip on h.detach().numpy() (the detach added to silence "
          "'Can't call numpy() on Tensor that requires grad'), which cuts the autograd graph: the encoder's 2 Linear "
          "layers never receive a gradient and only the final head is trained on random features.",
      fix_line="Clip in torch so the graph is kept: h = torch.clamp(h, -3, 3) instead of the numpy round trip.",
      source="https://tutorialreference.com/python/examples/faq/python-pytorch-error-runtimeerror-cant-call-numpy-on-"
             "tensor-that-requires-grad-detach",
      cause_pattern=r"(detach|numpy).{0,140}(graph|autograd|gradient|backprop)|(graph|autograd|gradient|backprop)"
                    r".{0,140}(detach|numpy)|np\.clip|torch\.clamp|from_numpy",
      paraphrases=("The encoder output goes through .detach().numpy() and np.clip inside forward, which breaks the "
                   "autograd graph: no gradient reaches the encoder. Use torch.clamp.",
                   "Gradients stop at the numpy round trip in forward(): the layers before it are never updated."))
def battery_numpy_detach_in_forward(fixed: bool = False) -> dict:
    seed(0)
    x, y = _battery(3000, 21)
    (xt, yt), (xv, yv) = split(x, y, 2500)
    model = BatteryNet(torch_clip=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 250, False),
                loss_fn=nn.MSELoss(), max_steps=3000)


fix("trained_battery_numpy_detach_in_forward", fixed_of(battery_numpy_detach_in_forward),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE (state of health)", steps=300, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# 2. Movie ratings: item vectors loaded with nn.Embedding.from_pretrained, whose freeze=True default keeps them fixed.

N_VIEWERS, N_MOVIES = 400, 300


def _ratings(n: int, s: int):
    g = gen(40)
    u_true, m_true = torch.randn(N_VIEWERS, 6, generator=g), torch.randn(N_MOVIES, 6, generator=g)
    proj = torch.randn(6, 16, generator=g)
    content_vectors = 0.15 * m_true @ proj + torch.randn(N_MOVIES, 16, generator=g)   # from a synopsis encoder
    g = gen(s)
    u = torch.randint(0, N_VIEWERS, (n,), generator=g)
    m = torch.randint(0, N_MOVIES, (n,), generator=g)
    r = (u_true[u] * m_true[m]).sum(1) / 6 ** 0.5 + 0.2 * torch.randn(n, generator=g)
    return torch.stack([u, m], 1), r, content_vectors


class RatingMF(nn.Module):
    def __init__(self, content_vectors: torch.Tensor, fine_tune: bool):
        super().__init__()
        self.viewer = nn.Embedding(N_VIEWERS, 16)
        nn.init.normal_(self.viewer.weight, std=0.1)
        if fine_tune:
            self.movie = nn.Embedding.from_pretrained(content_vectors, freeze=False)
        else:
            self.movie = nn.Embedding.from_pretrained(content_vectors)      # "initialise from the content model"
        self.viewer_bias = nn.Embedding(N_VIEWERS, 1)
        self.movie_bias = nn.Embedding(N_MOVIES, 1)

    def forward(self, ids):
        u, m = ids[:, 0], ids[:, 1]
        return ((self.viewer(u) * self.movie(m)).sum(1) + self.viewer_bias(u).squeeze(1)
                + self.movie_bias(m).squeeze(1))


@case("trained_movies_from_pretrained_frozen", "what_is_trained",
      bug="The movie embeddings are created with nn.Embedding.from_pretrained(content_vectors), whose default "
          "freeze=True sets requires_grad=False, so the item vectors meant to be fine-tuned from the content model "
          "stay fixed and only the viewer vectors and biases learn.",
      fix_line="Pass freeze=False: nn.Embedding.from_pretrained(content_vectors, freeze=False).",
      source="https://github.com/RUCAIBox/RecBole/issues/2046",
      cause_pattern=r"from_pretrained.{0,160}freez|freeze\s*=\s*(True|False)|(movie|item)\w* (embedding|vector)s?.{0,100}"
                    r"(frozen|not (being )?(trained|updated|fine-?tuned)|requires_grad\s*=\s*False|fixed)",
      paraphrases=("nn.Embedding.from_pretrained freezes the table by default (freeze=True): the movie embeddings are "
                   "never updated. Pass freeze=False to fine-tune them.",
                   "The item embedding weights have requires_grad=False because from_pretrained was called without "
                   "freeze=False; only the user side is trained."))
def movies_from_pretrained_frozen(fixed: bool = False) -> dict:
    seed(0)
    ids, r, content = _ratings(30000, 41)
    n = 27000
    model = RatingMF(content, fine_tune=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(ids[:n], r[:n]), 256),
                val_loader=loader(TensorDataset(ids[n:], r[n:]), 1000, False),
                loss_fn=nn.MSELoss(), max_steps=3000)


fix("trained_movies_from_pretrained_frozen", fixed_of(movies_from_pretrained_frozen),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val rating RMSE", steps=400, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# 3. Loan default: a "from scratch" first layer whose weights are plain tensors, not nn.Parameter.


def _loans(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 30, generator=g)
    score = (x[:, 0] * x[:, 1] + torch.tanh(x[:, 2] - x[:, 3]) * 1.5 + (x[:, 4] ** 2 - 1) - x[:, 5] * x[:, 6]
             + 0.5 * x[:, 7])
    return x, (score > 0).long()


class ScratchLayer(nn.Module):
    """y = relu(x W + b), written out by hand."""

    def __init__(self, d_in: int, d_out: int, as_parameters: bool):
        super().__init__()
        w = torch.randn(d_in, d_out) * (2.0 / d_in) ** 0.5
        b = torch.zeros(d_out)
        if as_parameters:
            self.W, self.b = nn.Parameter(w), nn.Parameter(b)
        else:
            self.W, self.b = w.requires_grad_(), b.requires_grad_()

    def forward(self, x):
        return torch.relu(x @ self.W.to(x.device) + self.b.to(x.device))


class LoanNet(nn.Module):
    def __init__(self, as_parameters: bool):
        super().__init__()
        self.hidden = ScratchLayer(30, 96, as_parameters)
        self.out = nn.Linear(96, 2)

    def forward(self, x):
        return self.out(self.hidden(x))


@case("trained_loans_tensor_not_parameter", "what_is_trained",
      bug="The hand-written hidden layer stores its weight and bias as plain tensors with requires_grad=True instead of "
          "nn.Parameter, so they are not registered in model.parameters(), the optimizer never sees them and the "
          "30x96 layer keeps its random initial values.",
      fix_line="Register them as parameters: self.W = nn.Parameter(w); self.b = nn.Parameter(b).",
      source="https://runebook.dev/zh/docs/pytorch/generated/torch.nn.parameter.parameter",
      cause_pattern=r"(wrap|register|declare|make|as)\w*.{0,40}nn\.Parameter|not (registered|a parameter|an? "
                    r"nn\.Parameter)|instead of nn\.Parameter|nn\.Parameter\(|plain tensors?|ordinary tensors?|"
                    r"(tensor )?attributes?.{0,80}(not (in|registered|part of)|missing from).{0,40}(parameters|optimi[sz]er)|"
                    r"(not|never) (in|part of|returned by) (model\.)?parameters\(\)",
      paraphrases=("ScratchLayer keeps W and b as ordinary tensors (requires_grad=True) rather than nn.Parameter, so "
                   "they are not in model.parameters() and the optimizer never updates them.",
                   "The hidden weights are plain tensor attributes, not registered parameters: wrap them in "
                   "nn.Parameter."))
def loans_tensor_not_parameter(fixed: bool = False) -> dict:
    seed(0)
    x, y = _loans(3000, 22)
    (xt, yt), (xv, yv) = split(x, y, 2500)
    model = LoanNet(as_parameters=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 250, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


fix("trained_loans_tensor_not_parameter", fixed_of(loans_tensor_not_parameter),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)

# --------------------------------------------------------------------------------------------------------------------
# 4. Speaker identification: the output layer is constructed inside forward(), a fresh random layer every call.

N_SPEAKERS = 12


def _utterances(n: int, s: int):
    g = gen(50)
    centers = torch.randn(N_SPEAKERS, 40, generator=g)
    g = gen(s)
    spk = torch.randint(0, N_SPEAKERS, (n,), generator=g)
    return centers[spk] + 0.8 * torch.randn(n, 40, generator=g), spk


class SpeakerNet(nn.Module):
    def __init__(self, head_in_init: bool):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(40, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU())
        self.n_speakers = N_SPEAKERS
        self.head = nn.Linear(64, N_SPEAKERS) if head_in_init else None

    def forward(self, mfcc_stats):
        emb = self.body(mfcc_stats)
        if self.head is not None:
            return self.head(emb)
        return nn.Linear(64, self.n_speakers).to(emb.device)(emb)   # sized from the data, built on the fly


@case("trained_speakers_layer_built_in_forward", "what_is_trained",
      bug="The speaker classification layer is constructed inside forward() (nn.Linear(64, n_speakers)(emb)), so every "
          "call uses a new randomly initialised layer that is not a registered submodule: it is never trained and the "
          "body chases a different random head at each step.",
      fix_line="Create the layer once in __init__ (self.head = nn.Linear(64, n_speakers)) and call self.head(emb).",
      source="https://thecodeforge.io/ml-ai/pytorch-neural-network/",
      cause_pattern=r"(created|constructed|built|defined|instantiated|new\b).{0,80}(in|inside) (the )?forward|"
                    r"(in|inside) forward\(?\)?.{0,80}(new|fresh|random(ly)? init\w*|re-?initiali[sz]ed|(created|"
                    r"constructed|built|instantiated))|(every|each) (call|forward|step|pass).{0,60}(new|fresh|"
                    r"re-?initiali[sz]ed|random) (layer|weights|linear)|forward\(?\)?\s+(builds|creates|constructs|"
                    r"instantiates|makes)|(builds|creates|constructs|instantiates) an? (fresh|new) (nn\.)?(Linear|layer)",
      paraphrases=("forward() builds a fresh nn.Linear on every call, so the classifier layer is re-initialised "
                   "randomly at each step and never learns; define it in __init__.",
                   "The output layer is instantiated inside forward instead of __init__: it is not registered, the "
                   "optimizer never sees it, and each pass uses new random weights."))
def speakers_layer_built_in_forward(fixed: bool = False) -> dict:
    seed(0)
    x, y = _utterances(2400, 51)
    (xt, yt), (xv, yv) = split(x, y, 2000)
    model = SpeakerNet(head_in_init=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 200, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("trained_speakers_layer_built_in_forward", fixed_of(speakers_layer_built_in_forward),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# 5. Land-use transfer: the optimizer is built over the old head, then the head is replaced for the new classes.


def _tiles(n: int, s: int):
    """3x16x16 aerial tiles: water / forest / field / urban differ in colour and texture."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    base = torch.tensor([[0.1, 0.2, 0.6], [0.1, 0.5, 0.1], [0.6, 0.5, 0.2], [0.5, 0.5, 0.5]])
    x = base[y][:, :, None, None] + 0.15 * torch.randn(n, 3, 16, 16, generator=g)
    stripes = torch.sin(torch.arange(16.0) * 1.6)[None, None, None, :]
    x = x + 0.3 * (y == 2).float()[:, None, None, None] * stripes
    x = x + 0.3 * (y == 3).float()[:, None, None, None] * torch.randn(n, 3, 16, 16, generator=g)
    return x, y


class TileNet(nn.Module):
    def __init__(self, n_classes: int):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten())
        self.head = nn.Linear(32, n_classes)

    def forward(self, x):
        return self.head(self.backbone(x))


@case("trained_landuse_optimizer_before_head_swap", "what_is_trained",
      bug="The optimizer is created over model.head.parameters() of the 10-class checkpoint head and only then is "
          "model.head replaced by a new nn.Linear(32, 4): the optimizer keeps updating the detached old head, while "
          "the new head (the only trainable part, the backbone is frozen) is never stepped.",
      fix_line="Replace the head first, then build the optimizer: optimizer = SGD(model.head.parameters(), ...) after "
               "model.head = nn.Linear(32, 4).",
      source="https://github.com/microsoft/nni/issues/4521",
      cause_pattern=r"(optimi[sz]er).{0,140}(before|prior to).{0,80}(replac|swap|reassign|new (head|layer|classifier))|"
                    r"(replac|swap|reassign)\w*.{0,140}after.{0,60}(optimi[sz]er)|(old|previous|stale|replaced|"
                    r"detached|orphan\w*|former) (head|layer|classifier|parameters|modules?).{0,100}(optimi[sz]er)|"
                    r"(optimi[sz]er).{0,100}(old|previous|stale|replaced|detached|orphan\w*|former) (head|layer|"
                    r"classifier|parameters|modules?)|(new|current) (head|classifier|layer).{0,100}(not|never|isn't)"
                    r".{0,40}(in|part of|registered (with|in)|known to|stepped by) the optimi[sz]er",
      paraphrases=("The optimizer was built before model.head was replaced, so it holds the parameters of the old "
                   "head; the new classifier is not in the optimizer and never changes.",
                   "Model.head was swapped after creating the optimizer: the optimizer steps stale parameters that "
                   "are no longer part of the model."))
def landuse_optimizer_before_head_swap(fixed: bool = False) -> dict:
    seed(0)
    x, y = _tiles(1500, 23)
    (xt, yt), (xv, yv) = split(x, y, 1200)
    model = TileNet(n_classes=10)                     # the checkpoint's 10 source classes
    for p in model.backbone.parameters():
        p.requires_grad = False                       # feature extraction: train the head only
    if fixed:
        model.head = nn.Linear(32, 4)
        optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9)
    else:
        optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9)
        model.head = nn.Linear(32, 4)                 # the new task has 4 land-use classes
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(xt, yt), 32), val_loader=loader(TensorDataset(xv, yv), 100, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("trained_landuse_optimizer_before_head_swap", fixed_of(landuse_optimizer_before_head_swap),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)
