"""What is trained: parameters that the optimizer never sees or that never get a gradient."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aq.registry import (
    BoxNet,
    CtcNet,
    DepthNet,
    SegNet,
    box_data,
    box_metric,
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


class RangeDepthNet(DepthNet):
    """Depth = sigmoid(head) * learned depth range (initial guess 2 m)."""

    def __init__(self, fixed):
        super().__init__()
        start = torch.full((1,), math.log(2.0))
        if fixed:
            self.log_range = nn.Parameter(start)
        else:
            self.log_range = start.requires_grad_()     # a plain tensor: not registered, never optimised

    def forward(self, x):
        return torch.sigmoid(self.head(self.backbone(x))) * self.log_range.to(x.device).exp()


@case("depth_range_plain_tensor", "what_is_trained",
      bug="The learnable depth range is a plain tensor with requires_grad=True assigned as a module attribute, not "
          "an nn.Parameter, so it is not in model.parameters(), the optimizer never updates it and depth stays "
          "capped at the initial 2 m guess.",
      cause_pattern=r"(?i)(nn\.Parameter|register_(parameter|buffer)|plain tensor|not (registered|in "
                    r"model\.parameters)|requires_grad=True.{0,60}(attribute|tensor)|log_range)")
def depth_range_plain_tensor(fixed=False):
    seed(0)
    x, d = depth_data(800, 4)
    vx, vd = depth_data(200, 5)
    model = RangeDepthNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x, d.unsqueeze(1)), 32), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(vx, vd.unsqueeze(1)), 64, shuffle=False), max_steps=300)


fix("depth_range_plain_tensor", fixed_of(depth_range_plain_tensor), rmse_metric(), "val RMSE (m)", higher=False)


@case("seg_optimizer_before_head_swap", "what_is_trained",
      bug="The optimizer is built from the frozen 'pretrained' model's trainable parameters before its 5-class head "
          "is replaced by a new 3-class nn.Conv2d, so the new head's weights are not in the optimizer and nothing "
          "that matters is updated.",
      cause_pattern=r"(?i)((optimi[sz]er|param(eter)?s?).{0,80}(before|prior to).{0,60}(head|replac|swap|new "
                    r"layer)|(new|replaced) (head|layer|classifier).{0,80}(not|never|missing).{0,30}"
                    r"(in|from|by) the optimi[sz]er|rebuild the optimi[sz]er|stale param)")
def seg_optimizer_before_head_swap(fixed=False):
    seed(0)
    x, m = seg_data(1000, 6)
    vx, vm = seg_data(250, 7)
    model = SegNet(classes=5)                        # stand-in for the pretrained checkpoint
    for p in model.backbone.parameters():
        p.requires_grad = False
    if fixed:
        model.head = nn.Conv2d(16, 3, 1)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    if not fixed:
        model.head = nn.Conv2d(16, 3, 1)             # new head for our 3 classes
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x, m), 32), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(vx, vm), 64, shuffle=False), max_steps=300)


fix("seg_optimizer_before_head_swap", fixed_of(seg_optimizer_before_head_swap), seg_metric(), "val pixel acc")


@case("ctc_freeze_by_name_substring", "what_is_trained",
      bug="Meaning to freeze only the pretrained feature_conv front end, the user freezes every parameter whose "
          "name contains 'conv', which also freezes encoder_conv, so only the final classifier is trained on "
          "random features.",
      cause_pattern=r"(?i)((substring|name).{0,60}('conv'|\"conv\"|conv\b).{0,80}(also|too|more|match)|"
                    r"encoder_conv.{0,60}(frozen|freez|requires_grad)|(frozen|freez)\w*.{0,60}encoder_conv|"
                    r"startswith\(.?feature_conv|too broad|over.?match)")
def ctc_freeze_by_name_substring(fixed=False):
    seed(0)
    model = CtcNet(width=16)
    for name, p in model.named_parameters():
        if (name.startswith("feature_conv") if fixed else "conv" in name):
            p.requires_grad = False
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad],
                                                        lr=3e-3),
                train_loader=loader(ctc_dataset(960, 2), 32),
                loss_fn=lambda m, b: F.ctc_loss(m(b[0]).log_softmax(-1).transpose(0, 1).float(), b[1], b[2], b[3],
                                                zero_infinity=True),
                val_loader=loader(ctc_dataset(240, 3), 32, shuffle=False), max_steps=300)


fix("ctc_freeze_by_name_substring", fixed_of(ctc_freeze_by_name_substring), ctc_metric(), "val 1-CER")


class DetachedBoxNet(BoxNet):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed

    def forward(self, x):
        feats = self.backbone(x)
        if not self.fixed:
            feats = feats.detach()                   # "no need to keep the backbone graph"
        return self.head(feats)


@case("box_backbone_detached", "what_is_trained",
      bug="The forward calls .detach() on the backbone features before the box head, so no gradient reaches the "
          "backbone and only the last nn.Linear learns, on random features.",
      cause_pattern=r"(?i)(\.?detach\(\)|detached|no gradient (reaches|flows to|to) the backbone|gradient.{0,40}"
                    r"(cut|stopped|blocked).{0,40}backbone)")
def box_backbone_detached(fixed=False):
    seed(0)
    x, b = box_data(1200, 2)
    vx, vb = box_data(300, 3)
    model = DetachedBoxNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, b), 32), loss_fn=nn.SmoothL1Loss(beta=0.05),
                val_loader=loader(TensorDataset(vx, vb), 64, shuffle=False), max_steps=300)


fix("box_backbone_detached", fixed_of(box_backbone_detached), box_metric(), "val mean IoU")


class TwoHeadDetector(nn.Module):
    """Classifies the object (wide vs tall) and regresses its box."""

    def __init__(self, fixed):
        super().__init__()
        self.body = BoxNet().backbone
        self.cls_head = nn.Linear(64, 2)
        self.box_head = nn.Linear(64, 4)
        self.fixed = fixed

    def forward(self, x):
        f = self.body(x)
        if self.fixed:
            boxes = self.box_head(f).sigmoid()
        else:
            with torch.no_grad():                    # decoding step, "no grad needed"
                boxes = self.box_head(f).sigmoid()
        return self.cls_head(f), boxes


@case("box_head_under_no_grad", "what_is_trained",
      bug="The box head's forward and sigmoid decoding sit inside torch.no_grad(), so the box regression loss has no "
          "graph back to box_head and only the classification head is trained.",
      cause_pattern=r"(?i)(no_grad|inference_mode|box_head.{0,80}(no grad|never|not).{0,40}(train|updat|gradient)|"
                    r"(regression|box) loss.{0,60}(no|without) (a )?(graph|gradient))")
def box_head_under_no_grad(fixed=False):
    seed(0)
    x, b = box_data(1200, 4)
    vx, vb = box_data(300, 5)
    cls = ((b[:, 2] - b[:, 0]) > (b[:, 3] - b[:, 1])).long()
    vcls = ((vb[:, 2] - vb[:, 0]) > (vb[:, 3] - vb[:, 1])).long()
    model = TwoHeadDetector(fixed)

    def loss_fn(m, batch):
        images, labels, boxes = batch
        logits, pred = m(images)
        return F.cross_entropy(logits.float(), labels) + 5 * F.l1_loss(pred.float(), boxes)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, cls, b), 32), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(vx, vcls, vb), 64, shuffle=False), max_steps=300)


fix("box_head_under_no_grad", fixed_of(box_head_under_no_grad), box_metric(lambda m, b: (m(b[0])[1], b[2])),
    "val mean IoU")
