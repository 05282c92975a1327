"""Mechanics: the schedule, the clipping and the aggregation/permutation machinery work against the run."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aw.registry import (
    Enhancer,
    Separator,
    SmallSeg3d,
    SumGNN,
    case,
    collate_graphs,
    fix,
    fixed_of,
    graph_acc,
    loader,
    make_graphs,
    make_volumes,
    noisy_clean,
    seed,
    si_snr,
    two_speakers,
    val_dice,
    val_pit_si_snr,
    val_si_snr,
)


# ------------------------------------------------------------------------------------------------------------------
def build_steplr_epochs(fixed=False):
    """Speech enhancement with a StepLR written in epochs ("halve every 5 epochs"), stepped every batch."""
    seed(0)
    noisy, clean = noisy_clean(1200, s=31)
    model = Enhancer()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps_per_epoch = 1000 // 16 + 1
    step_size = 5 * steps_per_epoch if fixed else 5
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=0.5)

    def loss_fn(model, batch):
        noisy, clean = batch
        return -si_snr(model(noisy), clean).mean()

    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(noisy[:1000], clean[:1000]), 16),
                val_loader=loader(TensorDataset(noisy[1000:], clean[1000:]), 50, shuffle=False), loss_fn=loss_fn,
                max_steps=300)


case("steplr_epochs", "mechanics",
     "StepLR(step_size=5, gamma=0.5) is sized in epochs but stepped after every optimizer step: the LR halves every "
     "5 batches and is ~1e-9 of its value after 150 steps, so training stalls almost at once (size step_size in "
     "steps or step per epoch).",
     r"StepLR|step_size|(lr|learning rate).{0,60}(decay|collaps|vanish|shrink|drop|halv|tiny|near zero|too (small|low)"
     r"|decreas)|(schedul).{0,80}(per (batch|step|iteration)|every (batch|step|iteration)|epoch)|"
     r"(decay|halv).{0,40}too (fast|quickly|often)")(build_steplr_epochs)
fix("steplr_epochs", fixed_of(build_steplr_epochs), val_si_snr(), "val SI-SNR (dB)")


# ------------------------------------------------------------------------------------------------------------------
def build_dice_softmax_dim(fixed=False):
    """3D segmentation with two output channels (background, lesion) and a soft Dice on the lesion probability."""
    seed(0)
    vols, labels = make_volumes(480, s=32)
    model = SmallSeg3d(out=2)

    def loss_fn(model, batch):
        x, y = batch
        logits = model(x)                                  # (B, 2, D, H, W)
        probs = logits.softmax(dim=1) if fixed else logits.softmax(dim=-1)
        fg, target = probs[:, 1], (y == 1).float()
        inter = (fg * target).sum()
        return 1 - (2 * inter + 1) / (fg.sum() + target.sum() + 1)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(vols[:400], labels[:400]), 8),
                val_loader=loader(TensorDataset(vols[400:], labels[400:]), 20, shuffle=False), loss_fn=loss_fn,
                max_steps=300)


case("dice_softmax_dim", "mechanics",
     "The Dice loss takes softmax(dim=-1), over the W axis of the (B, C, D, H, W) logits, instead of dim=1, the class "
     "axis: the 'probabilities' sum to 1 along each image row, the background channel never gets a gradient and the "
     "argmax over classes is meaningless.",
     r"dim\s*=\s*-1|dim\s*=\s*1|(softmax|normali[sz]).{0,80}(wrong|last|spatial|width|W) (dim|axis|dimension)|"
     r"(softmax|normali[sz]).{0,80}(instead of|rather than|not) (over |along )?(the )?(class|channel)|"
     r"(class|channel) (dim|axis|dimension).{0,60}softmax|softmax.{0,60}(class|channel) (dim|axis|dimension)")(
    build_dice_softmax_dim)
fix("dice_softmax_dim", fixed_of(build_dice_softmax_dim), val_dice(), "val Dice")


# ------------------------------------------------------------------------------------------------------------------
class GCNNoLoops(nn.Module):
    """One hand-written GCN layer, D^-1/2 A D^-1/2 X W, then sum pooling."""

    def __init__(self, fixed, f_in=8, hidden=64):
        super().__init__()
        self.fixed = fixed
        self.lin = nn.Linear(f_in, hidden)
        self.readout = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, x, edge_index, batch):
        n = x.size(0)
        src, dst = edge_index
        if self.fixed:                                   # A + I
            loop = torch.arange(n, device=x.device)
            src, dst = torch.cat([src, loop]), torch.cat([dst, loop])
        deg = torch.zeros(n, device=x.device).index_add_(0, dst, torch.ones(dst.numel(), device=x.device))
        dinv = deg.pow(-0.5)
        dinv[torch.isinf(dinv)] = 0                      # isolated nodes
        hw = self.lin(x)
        h = torch.zeros_like(hw).index_add_(0, dst, hw[src] * (dinv[src] * dinv[dst])[:, None])
        h = torch.relu(h)
        g = torch.zeros(int(batch.max()) + 1, h.size(1), device=h.device).index_add_(0, batch, h)
        return self.readout(g / 10)


def build_gcn_no_self_loops(fixed=False):
    """Graph classification with one GCN layer and a symmetric degree normalisation."""
    seed(0)
    graphs = make_graphs(1200, s=33)
    model = GCNNoLoops(fixed)

    def loss_fn(model, batch):
        x, ei, bt, y = batch
        return F.cross_entropy(model(x, ei, bt), y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(graphs[:1000], 32, collate_fn=collate_graphs),
                val_loader=loader(graphs[1000:], 64, shuffle=False, collate_fn=collate_graphs), loss_fn=loss_fn,
                max_steps=300)


case("gcn_no_self_loops", "mechanics",
     "The GCN propagates with D^-1/2 A D^-1/2 without adding self-loops (A + I): each node's new state is built only "
     "from its neighbours, never from its own features, so a node cannot relate its own type to its neighbours'.",
     r"self.?loops?|add_self_loops|A\s*\+\s*I|identity (matrix|term)|(own|node'?s?) (own )?(features?|state|"
     r"embedding).{0,60}(dropped|lost|ignored|missing|not (included|used))|(without|ignores?|exclud\w*|drops?) "
     r"(the node'?s? )?(own|itself|self)")(build_gcn_no_self_loops)
fix("gcn_no_self_loops", fixed_of(build_gcn_no_self_loops), graph_acc, "val accuracy")


# ------------------------------------------------------------------------------------------------------------------
class ScatterGNN(SumGNN):
    def __init__(self, fixed):
        super().__init__(out=2)
        self.fixed = fixed

    def forward(self, x, edge_index, batch):
        h = torch.relu(self.inp(x))
        src, dst = edge_index
        for conv in self.convs:
            msg = h[src]
            idx = dst[:, None].expand_as(msg)
            agg = torch.zeros_like(h)
            agg = agg.scatter_add(0, idx, msg) if self.fixed else agg.scatter(0, idx, msg)
            h = torch.relu(conv(h + agg))
        g = torch.zeros(int(batch.max()) + 1, h.size(1), device=h.device).index_add_(0, batch, h)
        return self.readout(g / 10)


def build_scatter_overwrite(fixed=False):
    """Graph classification; neighbour messages are summed into each target node with scatter."""
    seed(0)
    graphs = make_graphs(1200, s=34)
    coll = partial(collate_graphs, key="cls")
    model = ScatterGNN(fixed)

    def loss_fn(model, batch):
        x, ei, bt, y = batch
        return F.cross_entropy(model(x, ei, bt), y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(graphs[:1000], 32, collate_fn=coll),
                val_loader=loader(graphs[1000:], 64, shuffle=False, collate_fn=coll), loss_fn=loss_fn, max_steps=300)


case("scatter_overwrite", "mechanics",
     "Messages are aggregated with Tensor.scatter (overwrite) instead of scatter_add / index_add_: with several "
     "edges into the same node only one message survives (which one is unspecified), so the sum over neighbours "
     "the task needs is never computed.",
     r"scatter_add|index_add|scatter_reduce|reduce\s*=\s*['\"]?(sum|add)|(scatter|aggregat).{0,60}(overwrit|"
     r"replac|last|single|one) (message|value|write|neighbo)|overwrit|duplicate (indices|index)|"
     r"(only|just) one (message|neighbo)")(build_scatter_overwrite)
fix("scatter_overwrite", fixed_of(build_scatter_overwrite), graph_acc, "val accuracy")


# ------------------------------------------------------------------------------------------------------------------
def build_batch_level_pit(fixed=False):
    """Two-speaker separation with a hand-written PIT loss."""
    seed(0)
    mix, refs = two_speakers(1200, s=35)
    model = Separator()

    def loss_fn(model, batch):
        mix, refs = batch
        est = model(mix)
        a = (si_snr(est[:, 0], refs[:, 0]) + si_snr(est[:, 1], refs[:, 1])) / 2
        b = (si_snr(est[:, 0], refs[:, 1]) + si_snr(est[:, 1], refs[:, 0])) / 2
        if fixed:
            return -torch.maximum(a, b).mean()            # best permutation per utterance
        return -torch.maximum(a.mean(), b.mean())          # best permutation for the whole batch

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(mix[:1000], refs[:1000]), 16),
                val_loader=loader(TensorDataset(mix[1000:], refs[1000:]), 50, shuffle=False), loss_fn=loss_fn,
                max_steps=300)


case("batch_level_pit", "mechanics",
     "The PIT loss averages each permutation's SI-SNR over the batch and then takes the best permutation, so one "
     "speaker assignment is imposed on all utterances: with the speaker order random per utterance this is no "
     "better than a fixed order (take the max/min per utterance, then the mean).",
     r"per.?(utterance|sample|example|mixture|item)|(batch|whole batch).{0,60}(permutation|assignment)|"
     r"(permutation|assignment).{0,60}(batch|whole|all utterances|every utterance|each (utterance|sample))|"
     r"(mean|average).{0,40}before.{0,40}(min|max)|\bPIT\b|permutation.?invarian")(build_batch_level_pit)
fix("batch_level_pit", fixed_of(build_batch_level_pit), val_pit_si_snr, "val PIT SI-SNR (dB)")
