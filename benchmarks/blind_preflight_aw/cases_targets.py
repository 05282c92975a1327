"""Targets: what the loss is asked to reproduce is not what the task means."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
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
    graph_rmse,
    loader,
    make_graphs,
    make_volumes,
    noisy_clean,
    pit_si_snr,
    seed,
    si_snr,
    two_speakers,
    val_dice,
    val_pit_si_snr,
    val_si_snr,
)


# ------------------------------------------------------------------------------------------------------------------
def build_label_trilinear(fixed=False):
    """Scans acquired at 32^3 are resampled to 16^3 for the network; image and label map go through F.interpolate."""
    seed(0)
    vols, labels = make_volumes(480, s=11, size=32, r_lo=3.0, r_hi=6.0)
    small = F.interpolate(vols, size=(16, 16, 16), mode="trilinear", align_corners=False)

    def resample_labels(lab, mode):
        kw = {} if mode == "nearest" else dict(align_corners=False)
        return F.interpolate(lab[:, None].float(), size=(16, 16, 16), mode=mode, **kw)[:, 0].long()

    train_lab = resample_labels(labels[:400], "nearest" if fixed else "trilinear")
    val_lab = resample_labels(labels[400:], "nearest")     # the reference masks, resampled as labels must be
    model = SmallSeg3d(out=1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(small[:400], train_lab), 8),
                val_loader=loader(TensorDataset(small[400:], val_lab), 20, shuffle=False),
                loss_fn=lambda m, b: F.binary_cross_entropy_with_logits(m(b[0])[:, 0], b[1].float()), max_steps=300)


case("label_trilinear", "targets",
     "The label volumes are downsampled with F.interpolate(mode='trilinear') and cast with .long(): the fractional "
     "values at every object border are truncated to 0, so the training masks are eroded (most foreground voxels of "
     "small objects vanish); labels must be resampled with mode='nearest'.",
     r"nearest|trilinear|(interpolat|resampl|resiz|downsampl).{0,80}(label|mask|segmentation)|"
     r"(label|mask|segmentation).{0,80}(interpolat|resampl|resiz|downsampl)|erod|(truncat|floor|\.long\(\)).{0,60}"
     r"(label|mask|fraction|border|boundar)|(label|mask).{0,40}(shrunk|shrink|lost|missing foreground)")(
    build_label_trilinear)
fix("label_trilinear", fixed_of(build_label_trilinear), val_dice(), "val Dice")


# ------------------------------------------------------------------------------------------------------------------
def build_noisy_target(fixed=False):
    """Speech enhancement; the training pairs are written (clean, noisy) while the loop unpacks (noisy, clean)."""
    seed(0)
    noisy, clean = noisy_clean(1200, s=12)
    train = TensorDataset(noisy[:1000], clean[:1000]) if fixed else TensorDataset(clean[:1000], noisy[:1000])
    model = Enhancer()

    def loss_fn(model, batch):
        noisy, clean = batch
        return -si_snr(model(noisy), clean).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), train_loader=loader(train, 16),
                val_loader=loader(TensorDataset(noisy[1000:], clean[1000:]), 50, shuffle=False), loss_fn=loss_fn,
                max_steps=300)


case("noisy_target", "targets",
     "The training dataset holds (clean, noisy) pairs but the loss unpacks (noisy, clean): the model is fed the clean "
     "speech and asked to reproduce the noisy mixture, so it learns to pass everything through instead of removing "
     "noise (input and target swapped).",
     r"swap|revers|(input|feature)s?.{0,40}(and|/).{0,10}targets?.{0,40}(order|exchang|switch|mix)|"
     r"(clean|noisy).{0,80}(as|is|are) (the )?(input|target)|(target|label).{0,40}(is|are) (the )?(noisy|input|mixture)|"
     r"(input|target).{0,40}(order|tuple).{0,40}(wrong|mismatch)|identity|pass.?through")(build_noisy_target)
fix("noisy_target", fixed_of(build_noisy_target), val_si_snr(), "val SI-SNR (dB)")


# ------------------------------------------------------------------------------------------------------------------
def build_no_pit(fixed=False):
    """Two-speaker separation: the reference sources come in arbitrary order."""
    seed(0)
    mix, refs = two_speakers(1200, s=13)
    model = Separator()

    def loss_fn(model, batch):
        mix, refs = batch
        est = model(mix)
        if fixed:
            return -pit_si_snr(est, refs).mean()
        return -(si_snr(est[:, 0], refs[:, 0]) + si_snr(est[:, 1], refs[:, 1])).mean() / 2

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(mix[:1000], refs[:1000]), 16),
                val_loader=loader(TensorDataset(mix[1000:], refs[1000:]), 50, shuffle=False), loss_fn=loss_fn,
                max_steps=300)


case("no_pit", "targets",
     "The separation loss compares output 0 with reference 0 and output 1 with reference 1, but the order of the "
     "speakers in the references is arbitrary: without permutation-invariant training (the best assignment per "
     "utterance) the outputs learn the average of both speakers.",
     r"permutation|\bPIT\b|speaker order|order of (the )?(speaker|source|reference|output)|\bassign\w*.{0,40}(speaker|source|output)|best (match|assignment)|label (ambiguit|permut)|(source|speaker)s?.{0,40}(arbitrar|random) order|"
     r"(average|mean) of (both|the two|all) (speaker|source)")(build_no_pit)
fix("no_pit", fixed_of(build_no_pit), val_pit_si_snr, "val PIT SI-SNR (dB)")


# ------------------------------------------------------------------------------------------------------------------
def build_wrong_target_column(fixed=False):
    """Graph regression: each graph's label row is [num_atoms, bond_count/3] (the table's column order)."""
    seed(0)
    graphs = make_graphs(1200, s=14)
    for gr in graphs:
        gr["row"] = [gr["n"] / 3.0, gr["pairs"] / 3.0]

    def collate(items, col):
        x, ei, bt, _ = collate_graphs(items)
        return x, ei, bt, torch.tensor([gr["row"][col] for gr in items])

    model = SumGNN(out=1)

    def loss_fn(model, batch):
        x, ei, bt, y = batch
        return F.mse_loss(model(x, ei, bt).squeeze(-1), y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(graphs[:1000], 32, collate_fn=partial(collate, col=1 if fixed else 0)),
                val_loader=loader(graphs[1000:], 64, shuffle=False, collate_fn=partial(collate, col=1)),
                loss_fn=loss_fn, max_steps=300)


case("wrong_target_column", "targets",
     "The collate takes column 0 of each graph's label row, which is the atom count, instead of column 1, the bond "
     "count the model is meant to predict: the model regresses the number of nodes (a target read from the wrong "
     "column).",
     r"(wrong|incorrect|other|first) (target )?(column|field|index)|column (0|1)|\[\s*:?\s*,?\s*0\s*\]|"
     r"(number of|count of) (nodes|atoms)|num_atoms|atom count|node count|(target|label).{0,60}(wrong|not the|"
     r"different) (quantity|property|variable|column)")(build_wrong_target_column)
fix("wrong_target_column", fixed_of(build_wrong_target_column), graph_rmse, "val RMSE", higher=False)


# ------------------------------------------------------------------------------------------------------------------
def build_si_snr_sign(fixed=False):
    """Speech enhancement trained on SI-SNR."""
    seed(0)
    noisy, clean = noisy_clean(1200, s=15)
    model = Enhancer()

    def loss_fn(model, batch):
        noisy, clean = batch
        score = si_snr(model(noisy), clean).mean()
        return -score if fixed else score

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(noisy[:1000], clean[:1000]), 16),
                val_loader=loader(TensorDataset(noisy[1000:], clean[1000:]), 50, shuffle=False), loss_fn=loss_fn,
                max_steps=300)


case("si_snr_sign", "targets",
     "SI-SNR is a quality (higher is better) but it is returned as the loss without a minus sign, so the optimizer "
     "minimises the SI-SNR and makes the estimate as unlike the clean speech as it can (loss = -si_snr).",
     r"sign|negat|minus|maximi[sz]|minimi[sz].{0,40}(si.?snr|sdr|snr|quality|similarity)|"
     r"(higher|larger) is better|-\s*si_?snr|(loss|objective).{0,40}(increas|wrong direction|invert)|"
     r"ascen")(build_si_snr_sign)
fix("si_snr_sign", fixed_of(build_si_snr_sign), val_si_snr(), "val SI-SNR (dB)")
