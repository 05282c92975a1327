"""What is trained: parameters the optimizer never sees, graphs cut from autograd, a model replaced after the
optimizer was built."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aw.registry import (
    Enhancer,
    SmallSeg3d,
    SumGNN,
    case,
    collate_graphs,
    fix,
    fixed_of,
    graph_acc,
    graph_rmse,
    loader,
    make_graphs,
    make_volumes,
    noisy_clean,
    seed,
    si_snr,
    val_dice,
    val_si_snr,
)


def _graph_kw(model, s, key="cls", lr=3e-3):
    graphs = make_graphs(1200, s=s)
    if key == "pairs":
        for gr in graphs:
            gr["pairs"] = gr["pairs"] / 3.0
    coll = partial(collate_graphs, key=key)

    def loss_fn(model, batch):
        x, ei, bt, y = batch
        out = model(x, ei, bt)
        return F.cross_entropy(out, y) if key == "cls" else F.mse_loss(out.squeeze(-1), y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr),
                train_loader=loader(graphs[:1000], 32, collate_fn=coll),
                val_loader=loader(graphs[1000:], 64, shuffle=False, collate_fn=coll), loss_fn=loss_fn, max_steps=300)


# ------------------------------------------------------------------------------------------------------------------
class ListGNN(SumGNN):
    def __init__(self, fixed):
        super().__init__(out=2)
        del self.convs
        convs = [nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32)) for _ in range(2)]
        # the message-passing layers kept in a plain list "so they can be looped over"
        self.convs = nn.ModuleList(convs) if fixed else convs


def build_gnn_layers_list(fixed=False):
    """Graph classification with a hand-written GIN whose message-passing layers live in a Python list."""
    seed(0)
    return _graph_kw(ListGNN(fixed), s=21)


case("gnn_layers_list", "what_is_trained",
     "The message-passing layers are stored in a plain Python list, so they are not registered submodules: "
     "model.parameters() does not contain them, the optimizer never updates them and they stay at their random "
     "initialisation (use nn.ModuleList).",
     r"ModuleList|python list|plain list|not (a )?register|unregistered|(not|never) (in|part of|seen by|passed to) "
     r"(the )?(optimizer|model\.parameters|parameters\(\))|(missing|absent) from (the )?(optimizer|parameters)|"
     r"(never|not) (updated|trained)|random init")(build_gnn_layers_list)
fix("gnn_layers_list", fixed_of(build_gnn_layers_list), graph_acc, "val accuracy")


# ------------------------------------------------------------------------------------------------------------------
def build_model_recreated(fixed=False):
    """3D segmentation; the notebook re-creates the model after the optimizer, 'to re-seed it'."""
    seed(0)
    vols, labels = make_volumes(480, s=22)
    model = SmallSeg3d(out=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    if not fixed:
        seed(0)
        model = SmallSeg3d(out=1)          # fresh, reproducible weights ... but the optimizer holds the old ones
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(vols[:400], labels[:400]), 8),
                val_loader=loader(TensorDataset(vols[400:], labels[400:]), 20, shuffle=False),
                loss_fn=lambda m, b: F.binary_cross_entropy_with_logits(m(b[0])[:, 0], b[1].float()), max_steps=300)


case("model_recreated", "what_is_trained",
     "The model is instantiated again after the optimizer was built, so the optimizer holds the parameters of the "
     "first, discarded instance: the model that is run and scored never changes (build the optimizer from the "
     "model you train).",
     r"(optimizer|optimiser).{0,80}(different|other|old|previous|first|stale|discarded|another) (model|instance|"
     r"parameters|copy)|(re-?creat|re-?instantiat|re-?buil|redefin|replac|overwr).{0,60}(model|after)|"
     r"(parameters|weights).{0,40}(not|never) (in|held by|updated by|registered with|part of) (the )?optimi[sz]er|"
     r"(model|instance).{0,60}(after|since) (the )?optimi[sz]er (was )?(built|created|constructed)")(build_model_recreated)
fix("model_recreated", fixed_of(build_model_recreated), val_dice(), "val Dice")


# ------------------------------------------------------------------------------------------------------------------
class NoGradGNN(SumGNN):
    def __init__(self, fixed):
        super().__init__(out=2)
        self.fixed = fixed

    def forward(self, x, edge_index, batch):
        src, dst = edge_index
        ctx = torch.enable_grad() if self.fixed else torch.no_grad()
        with ctx:                  # "propagation is a fixed operator, it needs no gradient"
            h = torch.relu(self.inp(x))
            for conv in self.convs:
                agg = torch.zeros_like(h).index_add_(0, dst, h[src])
                h = torch.relu(conv(h + agg))
        g = torch.zeros(int(batch.max()) + 1, h.size(1), device=h.device).index_add_(0, batch, h)
        return self.readout(g / 10)


def build_gnn_no_grad(fixed=False):
    """Graph classification; the node-encoding and propagation block is wrapped in torch.no_grad()."""
    seed(0)
    return _graph_kw(NoGradGNN(fixed), s=23)


case("gnn_no_grad", "what_is_trained",
     "The input encoder and the message-passing layers run inside torch.no_grad(), so no graph is recorded through "
     "them: their weights get no gradient and only the readout MLP trains on random node features.",
     r"no_grad|inference_mode|(no|without) (autograd )?graph|not recorded|detach|cut (from|out of) the (graph|autograd)|"
     r"(outside|not tracked by|cut from) autograd|(message.?passing|conv|encoder|propagation|gnn) (layers? )?.{0,60}"
     r"(no gradient|grad is none|not trained|never updated|frozen|not updated)")(build_gnn_no_grad)
fix("gnn_no_grad", fixed_of(build_gnn_no_grad), graph_acc, "val accuracy")


# ------------------------------------------------------------------------------------------------------------------
def build_freeze_slice(fixed=False):
    """Speech enhancement; the user means to freeze the first (pretrained-like) layer and slices parameters()."""
    seed(0)
    noisy, clean = noisy_clean(1200, s=24)
    model = Enhancer()
    params = list(model.parameters())
    frozen = params[:2] if fixed else params[:-1]      # meant: "all but the last layer" -> all but its bias
    for p in frozen:
        p.requires_grad = False

    def loss_fn(model, batch):
        noisy, clean = batch
        return -si_snr(model(noisy), clean).mean()

    return dict(model=model,
                optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3),
                train_loader=loader(TensorDataset(noisy[:1000], clean[:1000]), 16),
                val_loader=loader(TensorDataset(noisy[1000:], clean[1000:]), 50, shuffle=False), loss_fn=loss_fn,
                max_steps=300)


case("freeze_slice", "what_is_trained",
     "list(model.parameters())[:-1] is frozen to 'freeze all but the last layer', but parameters() yields weights and "
     "biases separately: everything except the last bias has requires_grad=False, so only one bias vector trains.",
     r"(only|just) (one|a single|the last|the output) (bias|parameter tensor|tensor)|\[\s*:\s*-1\s*\]|slic|"
     r"parameters\(\)\s*\)?\s*\[|(weights? and bias(es)?|bias(es)? and weights?).{0,40}separate|"
     r"(only|just) .{0,30}bias.{0,30}(trainable|trained|train)|(everything|all) (but|except) (the|one|a) (last )?bias")(build_freeze_slice)
fix("freeze_slice", fixed_of(build_freeze_slice), val_si_snr(), "val SI-SNR (dB)")


# ------------------------------------------------------------------------------------------------------------------
class BufferGCN(nn.Module):
    """Hand-written GCN: weights kept with register_buffer (they 'move with .to(device)')."""

    def __init__(self, fixed, f_in=8, hidden=32):
        super().__init__()
        dims = [(f_in, hidden), (hidden, hidden)]
        for i, (a, b) in enumerate(dims):
            w = nn.init.xavier_uniform_(torch.empty(a, b))
            if fixed:
                setattr(self, f"w{i}", nn.Parameter(w))
            else:
                self.register_buffer(f"w{i}", w)
        self.readout = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x, edge_index, batch):
        n = x.size(0)
        loop = torch.arange(n, device=x.device)
        src = torch.cat([edge_index[0], loop])
        dst = torch.cat([edge_index[1], loop])
        deg = torch.zeros(n, device=x.device).index_add_(0, dst, torch.ones_like(dst, dtype=x.dtype))
        norm = deg[src].rsqrt() * deg[dst].rsqrt()
        h = x
        for w in (self.w0, self.w1):
            hw = h @ w
            h = torch.relu(torch.zeros_like(hw).index_add_(0, dst, hw[src] * norm[:, None]))
        g = torch.zeros(int(batch.max()) + 1, h.size(1), device=h.device).index_add_(0, batch, h)
        return self.readout(g / 10)


def build_gcn_buffer_weights(fixed=False):
    """Graph regression with a hand-written GCN (self-loops, symmetric degree normalisation)."""
    seed(0)
    return _graph_kw(BufferGCN(fixed), s=25, key="pairs")


case("gcn_buffer_weights", "what_is_trained",
     "The GCN weight matrices are created with register_buffer instead of nn.Parameter: buffers are not returned by "
     "model.parameters(), so the optimizer never updates them and both graph convolutions stay random.",
     r"register_buffer|buffer|nn\.Parameter|not (a )?(registered )?parameters?|(not|never) (in|part of|seen by|passed "
     r"to) (the )?(optimizer|model\.parameters|parameters\(\))|(never|not) (updated|trained)|random init")(
    build_gcn_buffer_weights)
fix("gcn_buffer_weights", fixed_of(build_gcn_buffer_weights), graph_rmse, "val RMSE", higher=False)
