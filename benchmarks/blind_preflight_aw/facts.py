"""The fact each broken case of set aw rests on, printed before verify trains it next to its fix (no preflight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_aw.registry import (
    FIXES,
    load_all,
    make_graphs,
    make_volumes,
    si_snr,
    two_speakers,
)

FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


def _kw(name):
    return load_all()[name].build()


@fact("graph_reg_broadcast")
def _():
    kw = _kw("graph_reg_broadcast")
    x, ei, bt, y = next(iter(kw["train_loader"]))
    pred = kw["model"](x, ei, bt)
    print(f"  prediction {tuple(pred.shape)} - target {tuple(y.shape)} -> {tuple((pred - y).shape)}")


@fact("edge_index_view")
def _():
    bonds = torch.tensor([[0, 1], [1, 0], [1, 2], [2, 1]])
    print(f"  bonds (E, 2) {bonds.tolist()} -> .view(2, -1) {bonds.view(2, -1).tolist()} vs .t() {bonds.t().tolist()}")


@fact("stft_mask_reshape")
def _():
    m = torch.arange(6).reshape(1, 2, 3)   # (B, T=2, F=3)
    print(f"  mask (B, T, F) {m.tolist()} -> reshape(B, F, T) {m.reshape(1, 3, 2).tolist()} vs transpose "
          f"{m.transpose(1, 2).tolist()}")


@fact("dice_broadcast")
def _():
    p, y = torch.rand(4, 1, 16, 16, 16), torch.rand(4, 16, 16, 16)
    print(f"  probs {tuple(p.shape)} * mask {tuple(y.shape)} -> {tuple((p * y).shape)}")


@fact("channels_last_reshape")
def _():
    x = torch.stack([torch.zeros(2, 2, 2), torch.ones(2, 2, 2)], -1)[None]   # modality 0 = 0, modality 1 = 1
    r = x.reshape(1, 2, 2, 2, 2)
    print(f"  channel 0 after reshape holds values {r[0, 0].flatten().tolist()} (should be all 0)")


@fact("label_trilinear")
def _():
    _, lab = make_volumes(20, s=11, size=32, r_lo=3.0, r_hi=6.0)
    tri = F.interpolate(lab[:, None].float(), size=(16,) * 3, mode="trilinear", align_corners=False)[:, 0].long()
    near = F.interpolate(lab[:, None].float(), size=(16,) * 3, mode="nearest")[:, 0].long()
    print(f"  foreground voxels: nearest {int(near.sum())}, trilinear + .long() {int(tri.sum())}")


@fact("noisy_target")
def _():
    kw = _kw("noisy_target")
    a, b = next(iter(kw["train_loader"]))
    print(f"  training pair unpacked as (noisy, clean): 'noisy' power {a.pow(2).mean():.2f}, 'clean' power "
          f"{b.pow(2).mean():.2f} (the target is the noisier one)")


@fact("no_pit")
def _():
    _, refs = two_speakers(1000, s=13)
    low_first = (torch.fft.rfft(refs[:, 0]).abs()[:, :60].sum(1) > torch.fft.rfft(refs[:, 1]).abs()[:, :60].sum(1))
    print(f"  low-pitched speaker is reference 0 in {low_first.float().mean():.2f} of the mixtures")


@fact("wrong_target_column")
def _():
    graphs = make_graphs(4, s=14)
    print("  (num_atoms, bonds) per graph:", [(gr["n"], gr["pairs"]) for gr in graphs], "-> column 0 is num_atoms")


@fact("si_snr_sign")
def _():
    x = torch.randn(1, 2048)
    print(f"  si_snr(x, x) = {si_snr(x, x).item():.1f} dB (higher is better); loss returned = +si_snr")


@fact("gnn_layers_list")
def _():
    kw = _kw("gnn_layers_list")
    n = sum(p.numel() for p in kw["model"].parameters())
    print(f"  parameters seen by the optimizer: {n}; conv layers in a list: {type(kw['model'].convs).__name__}")


@fact("model_recreated")
def _():
    kw = _kw("model_recreated")
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  model parameters held by the optimizer: {sum(id(p) in ids for p in kw['model'].parameters())} of "
          f"{len(list(kw['model'].parameters()))}")


@fact("gnn_no_grad")
def _():
    kw = _kw("gnn_no_grad")
    model = kw["model"]
    loss = kw["loss_fn"](model, next(iter(kw["train_loader"])))
    loss.backward()
    print(f"  conv weight grad: {model.convs[0][0].weight.grad}; readout grad norm "
          f"{model.readout[0].weight.grad.norm():.3g}")


@fact("freeze_slice")
def _():
    kw = _kw("freeze_slice")
    print("  trainable:", [n for n, p in kw["model"].named_parameters() if p.requires_grad])


@fact("gcn_buffer_weights")
def _():
    kw = _kw("gcn_buffer_weights")
    print("  parameters:", [n for n, _ in kw["model"].named_parameters()], "buffers:",
          [n for n, _ in kw["model"].named_buffers()])


@fact("steplr_epochs")
def _():
    kw = _kw("steplr_epochs")
    for _ in range(150):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print(f"  LR after 150 steps: {kw['optimizer'].param_groups[0]['lr']:.3g} (from 1e-3)")


@fact("dice_softmax_dim")
def _():
    logits = torch.randn(1, 2, 4, 4, 4)
    p = logits.softmax(dim=-1)
    print(f"  softmax(dim=-1): sum over classes {p.sum(1).flatten()[:3].tolist()}, sum over W "
          f"{p.sum(-1).flatten()[:3].tolist()}")


@fact("gcn_no_self_loops")
def _():
    ei = torch.tensor([[0, 1], [1, 0]])
    print(f"  edges {ei.tolist()}: without self-loops node 0 aggregates only from node 1 (A has a zero diagonal)")


@fact("scatter_overwrite")
def _():
    out = torch.zeros(2).scatter(0, torch.tensor([0, 0, 0]), torch.tensor([1.0, 2.0, 3.0]))
    add = torch.zeros(2).scatter_add(0, torch.tensor([0, 0, 0]), torch.tensor([1.0, 2.0, 3.0]))
    print(f"  three messages 1, 2, 3 into node 0: scatter -> {out[0].item()}, scatter_add -> {add[0].item()}")


@fact("batch_level_pit")
def _():
    _, refs = two_speakers(16, s=35)
    print("  the best permutation is chosen once for 16 utterances whose speaker order is random")


@fact("mask_axis_order")
def _():
    _, lab = make_volumes(50, s=41)
    t = lab.permute(0, 3, 2, 1)
    inter = ((lab == 1) & (t == 1)).sum().item()
    print(f"  overlap of each mask with its (x, y, z) copy: Dice {2 * inter / ((lab == 1).sum() + (t == 1).sum()):.2f}")


@fact("flip_image_only")
def _():
    print("  FlipAug flips x only; the label of a flipped volume is the unflipped mask")


@fact("edge_offset_missing")
def _():
    kw = _kw("edge_offset_missing")
    x, ei, bt, _ = next(iter(kw["train_loader"]))
    print(f"  {x.size(0)} nodes in the batch, largest node id used by edge_index: {int(ei.max())}")


@fact("sorted_graphs_labels")
def _():
    graphs = make_graphs(32, s=44)
    y = [gr["cls"] for gr in graphs]
    ys = [gr["cls"] for gr in sorted(graphs, key=lambda gr: gr["n"], reverse=True)]
    print(f"  labels agreeing after the sort: {sum(a == b for a, b in zip(y, ys))} of 32")


@fact("independent_crops")
def _():
    kw = _kw("independent_crops")
    ds = kw["train_loader"].dataset
    noisy, clean = ds[0]
    print(f"  correlation of the noisy and clean crops of one recording: "
          f"{torch.corrcoef(torch.stack([noisy, clean]))[0, 1]:.2f}")


load_all()
for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
