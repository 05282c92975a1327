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
    T, dim = 1.0, (1 if fixed else 0)

    def kd_loss(model, batch):
        x, y = batch
        s_logits = model(x)
        with torch.no_grad():
            t_logits = t(x)
        soft = F.kl_div(F.log_softmax(s_logits / T, dim=dim), F.softmax(t_logits / T, dim=dim),
                        reduction="batchmean") * T * T
        return soft                       # unlabeled transfer set: soft loss only
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=3e-3),
                train_loader=loader(tl.dataset, 16), val_loader=vl, loss_fn=kd_loss, max_steps=300)


case("kd_softmax_over_batch", "shapes",
     "The distillation loss takes log_softmax and softmax with dim=0, over the batch axis of the (16, 5) logits "
     "instead of over the classes, so each class column is normalised across samples and the soft targets say "
     "little about which class a sample is; use dim=1 (dim=-1).",
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
     r"kl_div.{0,80}broadcast|broadcast\w*.{0,80}(teacher|KL|kl_div|distill)|[(\[]\s*64\s*,\s*1\s*,\s*5\s*["
     r")\]]|[(\[]\s*64\s*,\s*64\s*,\s*5\s*[)\]]|\(B, 1, C\)|every (student )?row against|(extra|singleton) "
     r"(axis|dim)|squeeze the (extra|student)",
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
     r"prun\w* (the )?input|input (features|columns) (instead|rather)|columns instead of rows|wrong (axis|d"
     r"im)|norm\w*.{0,40}dim\s*=\s*0|dim\s*=\s*0 of the weight|per input (feature|column)",
     )(structured_prune_wrong_axis)
fix("structured_prune_wrong_axis", fixed_of(structured_prune_wrong_axis), plain_acc, "val acc")


# --- 4. SVD compression of a trained layer applied as x @ W instead of x @ W.T ----------------------------------------
class SVDLinear(nn.Module):
    def __init__(self, layer: nn.Linear, rank: int, right: bool):
        super().__init__()
        U, S, Vh = torch.linalg.svd(layer.weight.detach(), full_matrices=False)
        self.a = nn.Parameter(U[:, :rank] * S[:rank])          # (out, r)
        self.b = nn.Parameter(Vh[:rank].clone())               # (r, in)
        self.bias = nn.Parameter(layer.bias.detach().clone())
        self.right = right

    def forward(self, x):
        if self.right:
            return x @ self.b.T @ self.a.T + self.bias           # x W^T with W = a b
        return x @ (self.a @ self.b) + self.bias                # "y = x W", the textbook way round


def svd_compressed_transposed(fixed: bool = False):
    seed(0)
    x, y = blobs(3000, 16, 5, 24)
    (xt, yt), (xv, yv) = split(x, y, 2400)
    model = teacher(3000, 16, 5, 24)                          # the trained 16-128-128-5 net to compress
    model.train().requires_grad_(True)
    model[2] = SVDLinear(model[2], 24, right=fixed)           # the square 128x128 layer, rank 24
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-4),   # a short, gentle fine-tune
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 256, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("svd_compressed_transposed", "shapes",
     "The SVD-compressed square 128x128 layer computes x @ (U S V^T), i.e. x @ W, while nn.Linear computes x @ W.T, "
     "so the low-rank layer applies the transpose of the trained weight and the short fine-tune starts from a "
     "scrambled network; use x @ W.T (x @ V.T @ (U S).T).",
     r"transpos\w*|\.T\b|W\^?T|x\s*@\s*W|wrong (orientation|side)|(in|out)_features|out, in",
     )(svd_compressed_transposed)
fix("svd_compressed_transposed", fixed_of(svd_compressed_transposed), plain_acc, "val acc")


# --- 5. per-time-step distillation from a seq-first GRU teacher, flattened without transposing back --------------------
def _tag_data(s):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(2000, 12, 4, generator=g)                              # (batch, time, features)
    y = ((x[..., 0] + 0.5 * x[..., 1]).cumsum(1) > 0).long() + (x[..., 2] > 1).long()   # 3 tags per step
    return x, y


class Tagger(nn.Module):
    def __init__(self, hidden, batch_first=True):
        super().__init__()
        self.gru, self.head = nn.GRU(4, hidden, batch_first=batch_first), nn.Linear(hidden, 3)

    def forward(self, x):
        return self.head(self.gru(x)[0])


def _seq_teacher(x, y):
    torch.manual_seed(31)
    t = Tagger(64, batch_first=False)                                      # the teacher's own training code was seq-first
    opt = torch.optim.Adam(t.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(4)
    for _ in range(250):
        i = torch.randint(0, len(x), (64,), generator=g)
        loss = F.cross_entropy(t(x[i].transpose(0, 1)).reshape(-1, 3), y[i].transpose(0, 1).reshape(-1))
        opt.zero_grad(), loss.backward(), opt.step()
    return t.eval().requires_grad_(False)


def seq_kd_teacher_time_major(fixed: bool = False):
    seed(0)
    x, y = _tag_data(30)
    (xt, yt), (xv, yv) = split(x, y, 1600)
    t = _seq_teacher(xt, yt)
    student = Tagger(24)
    T = 2.0

    def kd_loss(model, batch):
        xb, _ = batch
        s = model(xb).reshape(-1, 3)                                       # (B*T, 3), batch-major
        with torch.no_grad():
            tl = t(xb.transpose(0, 1))                                     # (T, B, 3)
            tl = (tl.transpose(0, 1) if fixed else tl).reshape(-1, 3)
        return F.kl_div(F.log_softmax(s / T, -1), F.softmax(tl / T, -1), reduction="batchmean") * T * T
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(xt, yt), 12), val_loader=loader(TensorDataset(xv, yv), 200, False),
                loss_fn=kd_loss, max_steps=300)


case("seq_kd_teacher_time_major", "shapes",
     "The seq-first GRU teacher returns (time, batch, 3) logits that are reshaped to (-1, 3) without transposing back, "
     "while the batch_first student's (batch, time, 3) logits are reshaped the same way, so row k of the student is "
     "matched with another sample and time step of the teacher; transpose(0, 1) the teacher logits before flattening.",
     r"transpos\w*|permute|time[- ]major|seq[- ]first|batch_first|\(time, batch|misalign\w*|"
     r"(another|different|wrong) (sample|time step|position)",
     )(seq_kd_teacher_time_major)
fix("seq_kd_teacher_time_major", fixed_of(seq_kd_teacher_time_major),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val per-step acc")
