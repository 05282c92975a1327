"""Shapes: broadcasting, edge lists, spectrogram axes and channel layouts that are wrong but do not crash."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aw.registry import (
    SmallSeg3d,
    SumGNN,
    case,
    collate_graphs,
    fix,
    fixed_of,
    graph_acc,
    graph_rmse,
    istft,
    loader,
    make_graphs,
    make_volumes,
    noisy_clean,
    seed,
    si_snr,
    stft,
    val_dice,
    val_si_snr,
)


# ------------------------------------------------------------------------------------------------------------------
def build_graph_reg_broadcast(fixed=False):
    """Graph regression (number of donor/acceptor bonds), GNN head Linear(h, 1) -> (G, 1) vs y (G,)."""
    seed(0)
    graphs = make_graphs(1200, s=1)
    for gr in graphs:
        gr["pairs"] = gr["pairs"] / 3.0
    coll = partial(collate_graphs, key="pairs")
    model = SumGNN(out=1)

    def loss_fn(model, batch):
        x, ei, bt, y = batch
        pred = model(x, ei, bt)
        if fixed:
            pred = pred.squeeze(-1)
        return F.mse_loss(pred, y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(graphs[:1000], 32, collate_fn=coll),
                val_loader=loader(graphs[1000:], 64, shuffle=False, collate_fn=coll), loss_fn=loss_fn, max_steps=300)


case("graph_reg_broadcast", "shapes",
     "The GNN regression head returns (G, 1) and the graph targets are (G,); F.mse_loss broadcasts them to (G, G), so "
     "every prediction is fitted to every graph's target in the batch and the model learns the batch mean "
     "(squeeze(-1) the prediction or unsqueeze the target).",
     r"broadcast|\(\s*G\s*,\s*1\s*\).{0,40}\(\s*G\s*,?\s*\)|\(\s*N\s*,\s*1\s*\).{0,40}\(\s*N\s*,?\s*\)|"
     r"\[\s*\d+\s*,\s*1\s*\].{0,60}\[\s*\d+\s*\]|squeeze.{0,30}(pred|output|-1)|unsqueeze.{0,30}(target|label|y\b)|target size.{0,40}differ|"
     r"different (size|shape).{0,40}(target|input)|(G|N|B|batch)\s*[x×,]\s*(G|N|B|batch)\b")(
    build_graph_reg_broadcast)
fix("graph_reg_broadcast", fixed_of(build_graph_reg_broadcast), graph_rmse, "val RMSE", higher=False)


# ------------------------------------------------------------------------------------------------------------------
def build_edge_index_view(fixed=False):
    """Bond tables come as (E, 2) rows of (src, dst); the collate turns them into edge_index with .view(2, -1)."""
    seed(0)
    graphs = make_graphs(1200, s=2)
    for gr in graphs:
        gr["bonds"] = gr["edge_index"].t().contiguous()       # (E, 2), as read from the file

    def collate(items):
        xs, bonds, batch, ys, off = [], [], [], [], 0
        for i, gr in enumerate(items):
            xs.append(gr["x"])
            bonds.append(gr["bonds"] + off)
            batch.append(torch.full((gr["n"],), i, dtype=torch.long))
            ys.append(gr["cls"])
            off += gr["n"]
        b = torch.cat(bonds)
        edge_index = b.t().contiguous() if fixed else b.view(2, -1)  # PyG wants (2, E)
        return torch.cat(xs), edge_index, torch.cat(batch), torch.tensor(ys)

    model = SumGNN(out=2)

    def loss_fn(model, batch):
        x, ei, bt, y = batch
        return F.cross_entropy(model(x, ei, bt), y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(graphs[:1000], 32, collate_fn=collate),
                val_loader=loader(graphs[1000:], 64, shuffle=False, collate_fn=collate), loss_fn=loss_fn,
                max_steps=300)


case("edge_index_view", "shapes",
     "The (E, 2) bond list is turned into edge_index with .view(2, -1) instead of .t(): view reinterprets the memory, "
     "so the rows become interleaved (src, dst, src, ...) node ids and every message goes along a wrong, random edge.",
     r"\.?view\(\s*2\s*,\s*-1\s*\)|\.t\(\)|transpose|\.T\b|\(\s*E\s*,\s*2\s*\)|edge.?index.{0,80}"
     r"(scrambl|wrong|interleav|random|reinterpret|garbl|corrupt|not .{0,10}(edge|pair)|layout)|"
     r"(wrong|random|scrambled|garbled|corrupt|invalid|spurious) (edges|edge.?index|connectivity|adjacency)|"
     r"(view|reshape).{0,60}(instead of|rather than|not).{0,20}(transpos|permut|\.t\(\))")(build_edge_index_view)
fix("edge_index_view", fixed_of(build_edge_index_view), graph_acc, "val accuracy")


# ------------------------------------------------------------------------------------------------------------------
class MaskOnFrames(torch.nn.Module):
    """A per-frame mask net on (B, T, F) frames; its mask is put back on the (B, F, T) STFT."""

    def __init__(self, fixed):
        super().__init__()
        from benchmarks.blind_preflight_aw.registry import FrameMasker
        self.masker, self.fixed = FrameMasker(), fixed

    def forward(self, noisy):
        spec = stft(noisy)                                    # (B, F, T)
        b, f, t = spec.shape
        feat = torch.log1p(spec.abs()).transpose(1, 2)        # (B, T, F)
        mask = self.masker(feat)                              # (B, T, F)
        mask = mask.transpose(1, 2) if self.fixed else mask.reshape(b, f, t)
        return istft(spec * mask)


def build_stft_mask_reshape(fixed=False):
    """Speech enhancement with a time-frequency mask."""
    seed(0)
    noisy, clean = noisy_clean(1200, s=3)
    model = MaskOnFrames(fixed)

    def loss_fn(model, batch):
        noisy, clean = batch
        return -si_snr(model(noisy), clean).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(noisy[:1000], clean[:1000]), 16),
                val_loader=loader(TensorDataset(noisy[1000:], clean[1000:]), 50, shuffle=False), loss_fn=loss_fn,
                max_steps=300)


case("stft_mask_reshape", "shapes",
     "The mask net returns (B, T, F) but the STFT is (B, F, T); mask.reshape(B, F, T) instead of mask.transpose(1, 2) "
     "reinterprets the memory, so each time-frequency bin gets the mask value of an unrelated bin.",
     r"reshape.{0,80}(instead of|rather than|not|vs\.?).{0,30}(transpose|permute)|(transpose|permute)\(\s*(0\s*,\s*)?"
     r"[12]\s*,\s*[12]|\(\s*B\s*,\s*T\s*,\s*F\s*\).{0,60}\(\s*B\s*,\s*F\s*,\s*T\s*\)|"
     r"\(\s*B\s*,\s*F\s*,\s*T\s*\).{0,60}\(\s*B\s*,\s*T\s*,\s*F\s*\)|(time|frame).{0,30}(freq|bin).{0,30}"
     r"(scrambl|mix|swap|misalign|wrong|axes|axis)|mask.{0,60}(scrambl|misalign|wrong (bin|axis|axes|order)|"
     r"axis order|axes order|transpos)|reinterpret")(build_stft_mask_reshape)
fix("stft_mask_reshape", fixed_of(build_stft_mask_reshape), val_si_snr(), "val SI-SNR (dB)")


# ------------------------------------------------------------------------------------------------------------------
def build_dice_broadcast(fixed=False):
    """3D foreground segmentation with a soft Dice loss: logits (B, 1, D, H, W), mask (B, D, H, W)."""
    seed(0)
    vols, labels = make_volumes(480, s=4)
    model = SmallSeg3d(out=1)

    def loss_fn(model, batch):
        x, y = batch
        probs = torch.sigmoid(model(x))                   # (B, 1, D, H, W)
        target = y.float().unsqueeze(1) if fixed else y.float()
        inter = (probs * target).flatten(1).sum(1)        # per volume
        dice = (2 * inter + 1) / (probs.flatten(1).sum(1) + target.flatten(1).sum(1) + 1)
        return 1 - dice.mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(vols[:400], labels[:400]), 16),
                val_loader=loader(TensorDataset(vols[400:], labels[400:]), 20, shuffle=False), loss_fn=loss_fn,
                max_steps=300)


case("dice_broadcast", "shapes",
     "The soft Dice multiplies probabilities of shape (B, 1, D, H, W) with a mask of shape (B, D, H, W); broadcasting "
     "makes (B, B, D, H, W), so the intersection pairs every prediction with every volume's mask in the batch "
     "(unsqueeze(1) the mask or squeeze the channel).",
     r"broadcast.{0,160}(\(\s*\d+\s*(,\s*\d+\s*){3,}\)|\(\s*B\s*,\s*B|volume|voxel|mask|dice|channel|5.?D\b|"
     r"D\s*,\s*H\s*,\s*W)|(volume|voxel|mask|dice|channel|5.?D\b|D\s*,\s*H\s*,\s*W|\(\s*\d+\s*(,\s*\d+\s*){3,}\))"
     r".{0,160}broadcast|\(\s*B\s*,\s*1\s*,\s*D\s*,\s*H\s*,\s*W\s*\).{0,80}\(\s*B\s*,\s*D\s*,\s*H\s*,\s*W\s*\)|"
     r"\(\s*B\s*,\s*B\s*,|unsqueeze.{0,30}(mask|target|label|y\b)|(?<!un)squeeze\(\s*1\s*\)|(?<!un)squeeze.{0,20}channel|channel (dim|axis|dimension).{0,40}(missing|mismatch|target|mask)|"
     r"(mask|target|label).{0,40}(missing|lacks|without).{0,20}channel|every (prediction|volume|sample).{0,40}"
     r"every (other )?(mask|target|volume|sample)")(build_dice_broadcast)
fix("dice_broadcast", fixed_of(build_dice_broadcast), val_dice(), "val Dice")


# ------------------------------------------------------------------------------------------------------------------
def build_channels_last_reshape(fixed=False):
    """Two-modality volumes (CT + PET-like) stacked channels-last, (B, D, H, W, 2), fed to Conv3d channels-first."""
    seed(0)
    vols, labels = make_volumes(480, s=5)
    g = torch.Generator().manual_seed(55)
    pet = (labels == 1).float() * 1.0 + torch.randn(labels.shape, generator=g)
    stacked = torch.stack([vols[:, 0], pet], dim=-1)        # np.stack(..., axis=-1) habit: (N, D, H, W, 2)

    class TwoModalSeg(SmallSeg3d):
        def __init__(self):
            super().__init__(out=1)
            self.body[0] = torch.nn.Conv3d(2, 8, 3, padding=1)

        def forward(self, x):                                  # x: (B, D, H, W, 2)
            b, d, h, w, c = x.shape
            x = x.permute(0, 4, 1, 2, 3) if fixed else x.reshape(b, c, d, h, w)
            return super().forward(x)

    model = TwoModalSeg()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(stacked[:400], labels[:400]), 8),
                val_loader=loader(TensorDataset(stacked[400:], labels[400:]), 20, shuffle=False),
                loss_fn=lambda m, b: F.binary_cross_entropy_with_logits(m(b[0])[:, 0], b[1].float()), max_steps=300)


case("channels_last_reshape", "shapes",
     "Channels-last volumes (B, D, H, W, 2) are made channels-first with reshape(B, 2, D, H, W) instead of "
     "permute(0, 4, 1, 2, 3): the voxels of both modalities are interleaved and scattered, so no channel is a "
     "modality and no voxel lines up with its label.",
     r"reshape.{0,80}(instead of|rather than|not|vs\.?).{0,30}(permute|transpose|movedim)|permute\(\s*0\s*,\s*4|"
     r"movedim|channels?.?last.{0,80}(reshape|interleav|scrambl|view)|\(\s*B\s*,\s*D\s*,\s*H\s*,\s*W\s*,\s*(C|2)\s*\)|"
     r"(modalit|channel).{0,60}(interleav|scrambl|mix|shuffl)|reinterpret")(build_channels_last_reshape)
fix("channels_last_reshape", fixed_of(build_channels_last_reshape), val_dice(), "val Dice")
