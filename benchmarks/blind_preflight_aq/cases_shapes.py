"""Shapes: layouts that broadcast or reinterpret silently (CTC time/batch layout, views instead of permutes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aq.registry import (
    CtcNet,
    DepthNet,
    SegNet,
    case,
    ctc_dataset,
    ctc_metric,
    depth_data,
    fix,
    fixed_of,
    loader,
    rmse_metric,
    seed,
    seg_data,
    seg_metric,
)


@case("ctc_batch_first_layout", "shapes",
      bug="The batch-first (N, T, C) log-probabilities go straight into nn.CTCLoss, which expects time-major "
          "(T, N, C); with a batch size equal to T (24) nothing fails and time and batch are swapped.",
      cause_pattern=r"(?i)(ctc.{0,80}(\(T, ?N, ?C\)|time.?major|batch.?first|\(N, ?T, ?C\)|transpose\(0, ?1\)|"
                    r"swap.{0,20}(time|batch))|(\(N, ?T, ?C\)|batch.?first).{0,80}ctc|"
                    r"(time|batch) (and|vs\.?|with) (batch|time) (dimensions? )?(are )?swapped)")
def ctc_batch_first_layout(fixed=False):
    seed(0)
    model = CtcNet()
    ctc = nn.CTCLoss(zero_infinity=True)

    def loss_fn(m, batch):
        feats, targets, ilen, tlen = batch
        log_probs = m(feats).log_softmax(-1)          # (N, T, C), like Keras
        if fixed:
            log_probs = log_probs.transpose(0, 1)     # (T, N, C) for nn.CTCLoss
        return ctc(log_probs.float(), targets, ilen, tlen)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ctc_dataset(960, 0), 24, drop_last=True), loss_fn=loss_fn,
                val_loader=loader(ctc_dataset(240, 1), 24, shuffle=False), max_steps=300)


fix("ctc_batch_first_layout", fixed_of(ctc_batch_first_layout), ctc_metric(), "val 1-CER")


@case("ctc_log_softmax_batch_dim", "shapes",
      bug="log_softmax(dim=1) is taken on the time-major (T, N, C) CTC output, normalising over the batch "
          "instead of over the C classes (dim=2 / -1).",
      cause_pattern=r"(?i)(log_?softmax.{0,80}(dim ?= ?1|over the (batch|wrong)|wrong (dim|axis)|dim ?= ?(2|-1)|"
                    r"class(es)? (dim|axis))|normali[sz]\w* over the batch)")
def ctc_log_softmax_batch_dim(fixed=False):
    seed(0)
    model = CtcNet()

    def loss_fn(m, batch):
        feats, targets, ilen, tlen = batch
        out = m(feats).transpose(0, 1)               # (T, N, C)
        log_probs = out.log_softmax(2 if fixed else 1)
        return F.ctc_loss(log_probs.float(), targets, ilen, tlen, zero_infinity=True)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ctc_dataset(960, 0), 32), loss_fn=loss_fn,
                val_loader=loader(ctc_dataset(240, 1), 32, shuffle=False), max_steps=300)


fix("ctc_log_softmax_batch_dim", fixed_of(ctc_log_softmax_batch_dim), ctc_metric(), "val 1-CER")


class TileSegNet(SegNet):
    """Takes channels-last (N, H, W, 3) tiles as they come out of the numpy pipeline."""

    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed

    def forward(self, x):
        if self.fixed:
            x = x.permute(0, 3, 1, 2)
        else:
            x = x.view(x.size(0), 3, x.size(1), x.size(2))
        return super().forward(x)


@case("seg_channels_last_view", "shapes",
      bug="Channels-last (N, H, W, 3) tiles are turned into (N, 3, H, W) with .view instead of "
          ".permute(0, 3, 1, 2), scrambling pixels and channels so the input no longer lines up with the masks.",
      cause_pattern=r"(?i)(\.?view\(.{0,80}(instead of|rather than|not).{0,20}permute|permute\(0, ?3, ?1, ?2\)|"
                    r"channels?.?last.{0,80}(view|reshape)|(view|reshape).{0,80}channels?.?last|"
                    r"(view|reshape) (does not|doesn't|cannot) (move|transpose|permute))")
def seg_channels_last_view(fixed=False):
    seed(0)
    x, m = seg_data(1000, 0)
    vx, vm = seg_data(250, 1)
    model = TileSegNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x.permute(0, 2, 3, 1).contiguous(), m), 32),
                loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(vx.permute(0, 2, 3, 1).contiguous(), vm), 64, shuffle=False),
                max_steps=300)


fix("seg_channels_last_view", fixed_of(seg_channels_last_view), seg_metric(), "val pixel acc")


@case("depth_mse_broadcast", "shapes",
      bug="The depth head returns (N, 1, H, W) while the depth maps are (N, H, W); nn.MSELoss broadcasts them "
          "to (N, N, H, W) and every prediction is pulled towards every image's depth.",
      cause_pattern=r"(?i)(broadcast\w*.{0,120}(\(N, ?1, ?H, ?W\)|\(N, ?H, ?W\)|\(N, ?N, ?H, ?W\)|unsqueeze\(1\)|"
                    r"squeeze\(1\)|channel dim)|\(N, ?1, ?H, ?W\).{0,80}\(N, ?H, ?W\)|"
                    r"(unsqueeze|squeeze)\(1\).{0,80}(depth|target))")
def depth_mse_broadcast(fixed=False):
    seed(0)
    x, d = depth_data(800, 0)
    vx, vd = depth_data(200, 1)
    if fixed:
        d, vd = d.unsqueeze(1), vd.unsqueeze(1)
    model = DepthNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, d), 32), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(vx, vd), 64, shuffle=False), max_steps=300)


fix("depth_mse_broadcast", fixed_of(depth_mse_broadcast), rmse_metric(), "val RMSE (m)", higher=False)


@case("seg_logits_view_no_permute", "shapes",
      bug="The (N, C, H, W) segmentation logits are flattened with logits.view(-1, C) without moving the class "
          "axis last (permute(0, 2, 3, 1)), so each row mixes classes of different pixels and no longer matches "
          "mask.view(-1).",
      cause_pattern=r"(?i)(view\(-1, ?(C|3|num_classes)\).{0,120}(permute|class (axis|dim))|"
                    r"permute\(0, ?2, ?3, ?1\)|class (axis|dim\w*) (is not|isn't|not) (moved )?last|"
                    r"rows? mix\w*.{0,40}(classes|pixels))")
def seg_logits_view_no_permute(fixed=False):
    seed(0)
    x, m = seg_data(1000, 2)
    vx, vm = seg_data(250, 3)
    model = SegNet()

    def loss_fn(mod, batch):
        images, masks = batch
        logits = mod(images)
        if fixed:
            flat = logits.permute(0, 2, 3, 1).reshape(-1, 3)
        else:
            flat = logits.view(-1, 3)
        return F.cross_entropy(flat, masks.view(-1))

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, m), 32), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(vx, vm), 64, shuffle=False), max_steps=300)


fix("seg_logits_view_no_permute", fixed_of(seg_logits_view_no_permute), seg_metric(), "val pixel acc")
