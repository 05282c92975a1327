"""Family ``shapes``: axes and broadcasting in distillation losses, pruning masks and students."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_be.registry import acc_of, case, fix, fixed_of, loader, plain_acc, seed
from benchmarks.blind_preflight_be.synth import blobs, mlp, split, teacher


def _kd_data(s):
    x, y = blobs(3000, 16, 5, s)
    (xt, yt), (xv, yv) = split(x, y, 2400)
    return teacher(3000, 16, 5, s), loader(TensorDataset(xt, yt), 64), loader(TensorDataset(xv, yv), 256, False)


# --- 1. KD: log_softmax / softmax over the batch axis ------------------------------------------------------------------
def kd_softmax_over_batch(fixed: bool = False):
    seed(0)
    t, tl, vl = _kd_data(1)
    student = mlp(16, 32, 5)
    T, dim = 4.0, (1 if fixed else 0)

    def kd_loss(model, batch):
        x, y = batch
        s_logits = model(x)
        with torch.no_grad():
            t_logits = t(x)
        soft = F.kl_div(F.log_softmax(s_logits / T, dim=dim), F.softmax(t_logits / T, dim=dim),
                        reduction="batchmean") * T * T
        return soft                       # unlabeled transfer set: soft loss only
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=3e-3), train_loader=tl,
                val_loader=vl, loss_fn=kd_loss, max_steps=300)


case("kd_softmax_over_batch", "shapes",
     "The distillation loss takes log_softmax and softmax with dim=0, over the batch axis of the (64, 5) logits "
     "instead of over the classes, so each class column is normalised across samples and the soft targets say "
     "nothing about which class a sample is; use dim=1 (dim=-1).",
     r"dim\s*=\s*0|over the batch|batch (axis|dim)|across (the )?(samples|batch)|normali[sz]\w* (over|across) "
     r"(the )?(wrong|batch)|dim\s*=\s*-?1|class (axis|dim)",
     )(kd_softmax_over_batch)
fix("kd_softmax_over_batch", fixed_of(kd_softmax_over_batch), plain_acc, "val acc")


# --- 2. KD: student returns (B, 1, C) "sequence" logits, KL broadcasts against (B, C) teacher probs ------------------
class SeqStudent(nn.Module):
    def __init__(self, squeeze):
        super().__init__()
        self.body, self.squeeze = mlp(16, 32, 5), squeeze

    def forward(self, x):
        out = self.body(x).unsqueeze(1)          # (B, 1, C): same interface as the sequence student
        return out.squeeze(1) if self.squeeze else out


def kd_student_extra_axis_broadcast(fixed: bool = False):
    seed(0)
    t, tl, vl = _kd_data(2)
    student = SeqStudent(squeeze=fixed)
    T = 2.0

    def kd_loss(model, batch):
        x, _ = batch
        with torch.no_grad():
            p_t = F.softmax(t(x) / T, dim=-1)                       # (B, C)
        log_p_s = F.log_softmax(model(x) / T, dim=-1)                # (B, 1, C) when not squeezed
        return F.kl_div(log_p_s, p_t, reduction="batchmean") * T * T   # unlabeled transfer set: soft loss only
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=3e-3), train_loader=tl,
                val_loader=vl, loss_fn=kd_loss, max_steps=300)


case("kd_student_extra_axis_broadcast", "shapes",
     "The student returns (64, 1, 5) logits while the teacher probabilities are (64, 5): F.kl_div broadcasts them "
     "to (64, 64, 5), every student row against every teacher row, so the student learns the average teacher "
     "distribution; squeeze the extra axis so both are (B, C).",
     r"broadcast|[(\[]\s*64\s*,\s*1\s*,\s*5\s*[)\]]|[(\[]\s*64\s*,\s*64\s*,\s*5\s*[)\]]|every (student )?row against|"
     r"all pairs|extra (axis|dim)|squeeze|shape mismatch",
     )(kd_student_extra_axis_broadcast)
fix("kd_student_extra_axis_broadcast", fixed_of(kd_student_extra_axis_broadcast),
    acc_of(lambda m, b: (m(b[0]).reshape(b[0].shape[0], -1).argmax(-1), b[1])), "val acc")


# --- 3. structured pruning: neuron norms over the wrong axis prune input features -------------------------------------
class PrunedMLP(nn.Module):
    def __init__(self, axis):
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 5)
        self.axis = axis

    def forward(self, x):
        w = self.fc1.weight                                        # (out=64, in=16)
        norms = w.norm(dim=self.axis, keepdim=True)                # row norms = one per neuron
        keep = (norms >= norms.flatten().kthvalue(int(0.75 * norms.numel())).values).float()
        h = F.relu(F.linear(x, w * keep, self.fc1.bias))            # 75% structured sparsity
        return self.out(F.relu(self.fc2(h)))


def structured_prune_wrong_axis(fixed: bool = False):
    seed(0)
    x, y = blobs(3000, 16, 5, 3)
    (xt, yt), (xv, yv) = split(x, y, 2400)
    model = PrunedMLP(axis=1 if fixed else 0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 256, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("structured_prune_wrong_axis", "shapes",
     "The structured-pruning mask takes weight.norm(dim=0) of the (64, 16) fc1 weight, one norm per input feature "
     "instead of one per output neuron, so the mask zeroes 75% of the input columns and the network never sees most "
     "features; take the norm over dim=1 to prune neurons (rows).",
     r"norm\s*\(\s*dim\s*=\s*[01]|dim\s*=\s*0|input (features|columns)|columns instead of rows|wrong (axis|dim)|"
     r"prun\w* (the )?inputs?|per input",
     )(structured_prune_wrong_axis)
fix("structured_prune_wrong_axis", fixed_of(structured_prune_wrong_axis), plain_acc, "val acc")


# --- 4. GRU student fed channels-first windows meant for the conv teacher --------------------------------------------
def _seq_data(s):
    g = torch.Generator().manual_seed(s)
    n, C, L = 2400, 8, 8
    x = torch.randn(n, C, L, generator=g).cumsum(2) * 0.3          # (N, channels, time): conv1d layout
    w = torch.randn(C, generator=g)
    score = (x[:, :, -3:].mean(2) @ w)                              # class from the last time steps
    y = torch.bucketize(score, score.quantile(torch.tensor([0.33, 0.66])))
    return x, y


class GRUStudent(nn.Module):
    def __init__(self, transpose):
        super().__init__()
        self.gru, self.head, self.transpose = nn.GRU(8, 32, batch_first=True), nn.Linear(32, 3), transpose

    def forward(self, x):                      # x: (B, C, L) from the loader
        if self.transpose:
            x = x.transpose(1, 2)              # (B, L, C)
        out, _ = self.gru(x)
        return self.head(out[:, -1])


def gru_student_channels_first(fixed: bool = False):
    seed(0)
    x, y = _seq_data(4)
    (xt, yt), (xv, yv) = split(x, y, 1900)
    model = GRUStudent(transpose=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 250, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("gru_student_channels_first", "shapes",
     "The windows are stored (batch, channels, time) for the Conv1d teacher and the batch_first GRU student gets "
     "them untransposed, so it reads the 8 channels as time steps and the time steps as features and its 'last step' "
     "is the last channel; transpose(1, 2) to (batch, time, channels).",
     r"transpose|permute|channels?[- ]first|\(batch, channels, time\)|(channels|time) (as|for) (the )?(time|feature)|"
     r"swapp?ed (axes|dims)|batch_first",
     )(gru_student_channels_first)
fix("gru_student_channels_first", fixed_of(gru_student_channels_first), plain_acc, "val acc")
