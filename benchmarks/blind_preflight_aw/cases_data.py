"""Data: volumes and masks, noisy and clean signals, graphs and labels that no longer belong together."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_aw.registry import (
    SIG_LEN,
    Enhancer,
    SmallSeg3d,
    SumGNN,
    case,
    collate_graphs,
    fix,
    fixed_of,
    gen,
    graph_acc,
    harmonic,
    loader,
    make_graphs,
    make_volumes,
    seed,
    si_snr,
    val_dice,
    val_si_snr,
)


def _seg_kw(train_ds, vols, labels, batch=8):
    model = SmallSeg3d(out=1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train_ds, batch),
                val_loader=loader(TensorDataset(vols[400:], labels[400:]), 20, shuffle=False),
                loss_fn=lambda m, b: F.binary_cross_entropy_with_logits(m(b[0])[:, 0], b[1].float()), max_steps=300)


# ------------------------------------------------------------------------------------------------------------------
def build_mask_axis_order(fixed=False):
    """3D segmentation; images read with one library (z, y, x), training masks with another (x, y, z)."""
    seed(0)
    vols, labels = make_volumes(480, s=41)
    masks_xyz = labels.permute(0, 3, 2, 1)              # as the second reader returns them
    train_masks = masks_xyz.permute(0, 3, 2, 1) if fixed else masks_xyz   # (cubic volumes: no shape error)
    return _seg_kw(TensorDataset(vols[:400], train_masks[:400]), vols, labels)


case("mask_axis_order", "data",
     "The images are (z, y, x) arrays while the training masks come from a reader returning (x, y, z); the volumes are "
     "cubic so nothing fails, but every mask is transposed relative to its image (transpose the mask with "
     "permute/transpose(2, 1, 0) or read both with the same library).",
     r"axis order|axes order|(z\s*,\s*y\s*,\s*x)|(x\s*,\s*y\s*,\s*z)|transpos|permut|(mask|label)s?.{0,80}"
     r"(misalign|not aligned|do not (line up|align|match)|don't (line up|align|match)|swapped|flipped|rotated)|"
     r"(nibabel|simpleitk|sitk|itk)|orientation")(build_mask_axis_order)
fix("mask_axis_order", fixed_of(build_mask_axis_order), val_dice(), "val Dice")


# ------------------------------------------------------------------------------------------------------------------
class FlipAug(Dataset):
    """Random left-right flip augmentation in __getitem__."""

    def __init__(self, vols, labels, fixed, s=0):
        self.vols, self.labels, self.fixed, self.g = vols, labels, fixed, gen(s)

    def __len__(self):
        return len(self.vols)

    def __getitem__(self, i):
        x, y = self.vols[i], self.labels[i]
        if torch.rand(1, generator=self.g) < 0.5:
            x = x.flip(-1)
            if self.fixed:
                y = y.flip(-1)
        return x, y


def build_flip_image_only(fixed=False):
    """3D segmentation with a random-flip augmentation written by hand."""
    seed(0)
    vols, labels = make_volumes(480, s=42)
    return _seg_kw(FlipAug(vols[:400], labels[:400], fixed, s=42), vols, labels)


case("flip_image_only", "data",
     "The random flip is applied to the image volume but not to its mask, so in half of the training samples the "
     "label no longer lines up with the anatomy (apply the same geometric transform to image and mask).",
     r"(flip|augment|transform).{0,80}(mask|label|target)|(mask|label|target).{0,80}(not (flipped|transformed|"
     r"augmented)|misalign|out of sync)|same (geometric )?(transform|augmentation|flip)|image (only|but not)|"
     r"(misalign|not aligned|do not line up|don't line up)")(build_flip_image_only)
fix("flip_image_only", fixed_of(build_flip_image_only), val_dice(), "val Dice")


# ------------------------------------------------------------------------------------------------------------------
def build_edge_offset_missing(fixed=False):
    """Graph classification with a hand-written collate that concatenates each graph's edge_index."""
    seed(0)
    graphs = make_graphs(1200, s=43)

    def collate(items):
        if fixed:
            return collate_graphs(items)
        xs = torch.cat([gr["x"] for gr in items])
        ei = torch.cat([gr["edge_index"] for gr in items], 1)        # local node ids, not shifted
        batch = torch.cat([torch.full((gr["n"],), i, dtype=torch.long) for i, gr in enumerate(items)])
        return xs, ei, batch, torch.tensor([gr["cls"] for gr in items])

    model = SumGNN(out=2)

    def loss_fn(model, batch):
        x, ei, bt, y = batch
        return F.cross_entropy(model(x, ei, bt), y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(graphs[:1000], 32, collate_fn=collate),
                val_loader=loader(graphs[1000:], 64, shuffle=False, collate_fn=collate), loss_fn=loss_fn,
                max_steps=300)


case("edge_offset_missing", "data",
     "The collate concatenates the graphs' edge_index tensors without adding each graph's node offset (the number of "
     "nodes before it in the batch), so every edge points into the first graph's nodes and the other graphs get no "
     "messages.",
     r"offset|(increment|shift|add).{0,60}(node (count|offset|index|indices)|cumulative|cumsum|num_nodes)|"
     r"cumsum|edge.?index.{0,80}(first graph|not shifted|local|same node ids|overlap|collid)|"
     r"(first|same) (graph'?s?|nodes?).{0,40}(nodes|ids|indices)|block.?diagonal")(build_edge_offset_missing)
fix("edge_offset_missing", fixed_of(build_edge_offset_missing), graph_acc, "val accuracy")


# ------------------------------------------------------------------------------------------------------------------
def build_sorted_graphs_labels(fixed=False):
    """Graph classification; the collate sorts the graphs by size (for a bucketing trick), the labels are taken first."""
    seed(0)
    graphs = make_graphs(1200, s=44)

    def collate(items):
        y = torch.tensor([gr["cls"] for gr in items])
        items = sorted(items, key=lambda gr: gr["n"], reverse=True)
        if fixed:
            y = torch.tensor([gr["cls"] for gr in items])
        x, ei, bt, _ = collate_graphs(items)
        return x, ei, bt, y

    model = SumGNN(out=2)

    def loss_fn(model, batch):
        x, ei, bt, y = batch
        return F.cross_entropy(model(x, ei, bt), y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(graphs[:1000], 32, collate_fn=collate),
                val_loader=loader(graphs[1000:], 64, shuffle=False, collate_fn=collate_graphs), loss_fn=loss_fn,
                max_steps=300)


case("sorted_graphs_labels", "data",
     "The collate sorts the graphs of a batch by node count but builds the label vector before sorting, so the "
     "labels stay in the original order and most graphs are paired with another graph's label.",
     r"sort|(label|target|y)s?.{0,80}(order|misalign|mismatch|another graph|wrong graph|out of (sync|order)|"
     r"permut|shuffl|not (reordered|aligned))|reorder|(graphs?|inputs?).{0,40}(and|vs\.?) (labels?|targets?).{0,40}"
     r"(order|misalign|mismatch)")(build_sorted_graphs_labels)
fix("sorted_graphs_labels", fixed_of(build_sorted_graphs_labels), graph_acc, "val accuracy")


# ------------------------------------------------------------------------------------------------------------------
class CropPairs(Dataset):
    """4096-sample recordings; a random 2048-sample training segment is cut from noisy and clean."""

    def __init__(self, noisy, clean, fixed, s=0):
        self.noisy, self.clean, self.fixed, self.g = noisy, clean, fixed, gen(s)

    def __len__(self):
        return len(self.noisy)

    def __getitem__(self, i):
        span = self.noisy.size(1) - SIG_LEN
        a = int(torch.randint(0, span, (1,), generator=self.g))
        b = a if self.fixed else int(torch.randint(0, span, (1,), generator=self.g))
        return self.noisy[i, a:a + SIG_LEN], self.clean[i, b:b + SIG_LEN]


def build_independent_crops(fixed=False):
    """Speech enhancement on random crops of longer recordings."""
    seed(0)
    g = gen(45)
    clean = harmonic(g, 1200, 100, 400, length=2 * SIG_LEN)
    noisy = clean + torch.randn(clean.shape, generator=g)
    model = Enhancer()

    def loss_fn(model, batch):
        noisy, clean = batch
        return -si_snr(model(noisy), clean).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(CropPairs(noisy[:1000], clean[:1000], fixed, s=45), 16),
                val_loader=loader(TensorDataset(noisy[1000:, :SIG_LEN], clean[1000:, :SIG_LEN]), 50, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


case("independent_crops", "data",
     "The noisy and clean training segments are cut with two independent random offsets, so the target is a "
     "different stretch of the recording than the input (misaligned in time); crop both at the same offset.",
     r"(same|one|single|shared) (random )?(offset|start|crop|index|position)|independent(ly)? (random )?"
     r"(offset|crop|start)|(misalign|not aligned|out of sync|offset|shift|lag).{0,60}(time|sample|clean|noisy|target|"
     r"input)|(clean|noisy|target|input).{0,60}(misalign|not aligned|out of sync|different (segment|stretch|part))")(
    build_independent_crops)
fix("independent_crops", fixed_of(build_independent_crops), val_si_snr(), "val SI-SNR (dB)")
