"""Family shapes: axes and lengths of the domain's tensors."""

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_bg.registry import (CTCNet, SSLNet, case, ctc_exact_match, ctc_kwargs, ctc_sequences,
                                                    fix, fixed_of, knn_accuracy, latent_signal, nt_xent,
                                                    retrieval_top1, seed, ssl_kwargs, augment, loader, DIN, SSLNet)
from torch.utils.data import Dataset


@case("ctc_logprobs_reshaped_not_transposed", "shapes",
      "The (N, T, C) log-probabilities are turned into the (T, N, C) layout ctc_loss expects with .reshape(T, N, C) "
      "instead of .transpose(0, 1), so frames of different samples and time steps are scrambled.",
      r"(reshape|view).{0,80}(transpose|permute)|(transpose|permute)\(0, ?1\).{0,60}(instead|not|rather)|"
      r"scrambl|interleav|(time|frame)s? (and|of) (different )?(samples|batch)|(T, ?N, ?C).{0,80}(reshap|view)|"
      r"reshap\w* .{0,40}(batch|time).{0,40}(axis|axes|dimension)")
def ctc_logprobs_reshaped_not_transposed(fixed=False):
    seed(0)
    model = CTCNet()

    def loss_fn(m, batch):
        x, xl, y, yl = batch
        lp = m(x)
        b, t, c = lp.shape
        lp = lp.transpose(0, 1) if fixed else lp.reshape(t, b, c)
        return F.ctc_loss(lp, y, xl, yl, blank=0)
    return ctc_kwargs(model, loss_fn, ctc_sequences(1024, 0))


@case("ctc_log_softmax_over_batch", "shapes",
      "The CTC head's log_softmax is taken over dim=1 of the (T, N, C) tensor (the batch) instead of the class axis, "
      "so ctc_loss receives per-frame scores that are not log-probabilities over the classes.",
      r"log_?softmax.{0,80}(dim ?= ?1|batch|wrong (axis|dim))|(normali[sz]\w*|softmax) (over|across|along) the batch|"
      r"(class|vocab\w*|label)\w* (axis|dim\w*).{0,80}(log_?softmax|normali[sz])|"
      r"not (log.?probabilities|normali[sz]ed) over the (classes|vocabulary|labels)")
def ctc_log_softmax_over_batch(fixed=False):
    seed(0)

    class Net(CTCNet):
        def forward(self, x):
            h = F.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
            logits = self.out(self.rnn(h)[0]).transpose(0, 1)            # (T, N, C)
            return F.log_softmax(logits, dim=-1 if fixed else 1)

    def loss_fn(m, batch):
        x, xl, y, yl = batch
        return F.ctc_loss(m(x), y, xl, yl, blank=0)
    kw = ctc_kwargs(Net(), loss_fn, ctc_sequences(1024, 0))
    return kw


def _ctc_tnc_metric(model, kw):
    class View(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x).transpose(0, 1)
    return ctc_exact_match()(View(model), kw)


fix("ctc_log_softmax_over_batch", fixed_of(ctc_log_softmax_over_batch), _ctc_tnc_metric, "val exact match")
fix("ctc_logprobs_reshaped_not_transposed", fixed_of(ctc_logprobs_reshaped_not_transposed), ctc_exact_match(),
    "val exact match")


@case("ctc_downsampled_lengths_wrong", "shapes",
      "The encoder's stride-2 Conv1d halves the frames, but the input_lengths given to ctc_loss are divided by 4, so "
      "CTC aligns every target inside the first half of each sequence and the rest of the frames are never trained.",
      r"input_lengths?.{0,120}(stride|downsampl|subsampl|halv|divid|// ?[24]|output length)|"
      r"(stride|downsampl|subsampl)\w*.{0,120}(input_lengths?|lengths? (passed|given)|length)|"
      r"lengths? (do not|don't|does not) match the (encoder|model)'?s? output")
def ctc_downsampled_lengths_wrong(fixed=False):
    seed(0)
    model = CTCNet(stride=2)

    def loss_fn(m, batch):
        x, xl, y, yl = batch
        lp = m(x).transpose(0, 1)
        out_len = (xl + 1) // 2 if fixed else (xl + 3) // 4
        return F.ctc_loss(lp, y, out_len, yl, blank=0, zero_infinity=True)
    return ctc_kwargs(model, loss_fn, ctc_sequences(1024, 0))


fix("ctc_downsampled_lengths_wrong", fixed_of(ctc_downsampled_lengths_wrong),
    ctc_exact_match(lengths_of=lambda xl, t: (xl + 1) // 2), "val exact match")


@case("simclr_normalize_over_batch", "shapes",
      "NT-Xent L2-normalises the stacked projections with F.normalize(z, dim=0), over the batch, instead of dim=1, so "
      "the similarities are not cosine similarities and the temperature scales nothing meaningful.",
      r"normali[sz]\w*.{0,60}(dim ?= ?0|over the batch|across the batch|batch (axis|dim)|wrong (axis|dim))|"
      r"not (a )?cosine simil|(per.?sample|row.?wise|each (embedding|row|sample)).{0,40}(unit|l2|norm)|"
      r"(dim ?= ?1|feature (axis|dim\w*)).{0,40}normali[sz]")
def simclr_normalize_over_batch(fixed=False):
    seed(0)
    model = SSLNet()

    def loss_fn(m, batch):
        z1, z2 = m.project(batch[0]), m.project(batch[1])
        b = z1.size(0)
        z = F.normalize(torch.cat([z1, z2]), dim=1 if fixed else 0)
        sim = (z @ z.T / 0.2).masked_fill(torch.eye(2 * b, dtype=torch.bool), -1e9)
        return F.cross_entropy(sim, (torch.arange(2 * b) + b) % (2 * b))
    return ssl_kwargs(model, loss_fn, latent_signal(1024, 0)[0])


fix("simclr_normalize_over_batch", fixed_of(simclr_normalize_over_batch), retrieval_top1, "val retrieval top-1")


class TripletSet(Dataset):
    """(anchor, positive of the same class, negative of another class) rows, views augmented."""

    def __init__(self, sig, y, any_positive=False):
        self.sig, self.y, self.any = sig, y, any_positive
        self.by = {int(c): (y == c).nonzero().flatten() for c in y.unique()}

    def __len__(self):
        return len(self.sig)

    def __getitem__(self, i):
        c = int(self.y[i])
        same = self.by[c]
        j = int(torch.randint(len(self.sig), ())) if self.any else int(same[torch.randint(len(same), ())])
        k = int(torch.randint(len(self.sig), ()))
        while int(self.y[k]) == c:
            k = int(torch.randint(len(self.sig), ()))
        return augment(self.sig[i]), augment(self.sig[j]), augment(self.sig[k])


def triplet_kwargs(model, loss_fn, any_positive=False, lr=3e-3):
    sig, y = latent_signal(1024, 0, classes=12)
    sv, yv = latent_signal(384, 5, classes=12)
    knn = (augment(sig, torch.Generator().manual_seed(3)), y, augment(sv, torch.Generator().manual_seed(4)), yv)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr),
                train_loader=loader(TripletSet(sig, y, any_positive), 64, drop_last=True), loss_fn=loss_fn,
                val_loader=loader(TripletSet(sv, yv), 64, shuffle=False), knn_data=knn)


@case("triplet_distance_summed_over_batch", "shapes",
      "The triplet loss computes its distances as (a - p).pow(2).sum(0), summing over the batch axis instead of the "
      "embedding axis, so it compares per-dimension batch totals rather than each anchor with its own positive and "
      "negative.",
      r"(sum|norm|reduc)\w*.{0,60}(dim ?= ?0|\(0\)|over the batch|batch (axis|dim))|"
      r"(per.?(sample|anchor|triplet)|each anchor).{0,60}distance|distance.{0,60}(per.?(sample|anchor|triplet)|"
      r"embedding (axis|dim))|(dim ?= ?1|-1|feature axis).{0,40}(distance|sum)")
def triplet_distance_summed_over_batch(fixed=False):
    seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIN, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))

    def loss_fn(m, batch):
        a, p, n = (F.normalize(m(t), dim=1) for t in batch)
        ax = 1 if fixed else 0
        d_ap, d_an = (a - p).pow(2).sum(ax), (a - n).pow(2).sum(ax)
        return F.relu(d_ap - d_an + 0.5).mean()
    return triplet_kwargs(model, loss_fn)


fix("triplet_distance_summed_over_batch", fixed_of(triplet_distance_summed_over_batch), knn_accuracy,
    "val 1-NN accuracy")
