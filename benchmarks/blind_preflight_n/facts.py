"""The fact each of set n's bugs rests on, printed by ``verify.py`` before the broken case trains next to its fix.

Importing this module loads the case table and attaches one function per broken case to ``FIXES[name]["fact"]``.
Each builds the broken case (and, where it helps, its fix) and prints what the bug does to the tensors, the
optimizer or the data, without training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_n.registry import FIXES, load_all

CASES = load_all()


def fact(name):
    def register(fn):
        FIXES[name]["fact"] = fn
        return fn
    return register


def built(name, fixed=False):
    return FIXES[name]["fixed"]() if fixed else CASES[name].build()


def first_batch(kw):
    return next(iter(kw["train_loader"]))


@fact("keyword_transformer_seq_first")
def _():
    kw = built("keyword_transformer_seq_first")
    x, _ = first_batch(kw)
    with torch.no_grad():
        out = kw["model"](x)
    print(f"  batch_first={kw['model'].encoder.layers[0].self_attn.batch_first}; input {tuple(x.shape)} read as "
          f"(seq={x.size(0)}, batch={x.size(1) + 1}); spread of the [CLS] logits across the batch: "
          f"{out.std(0).max().item():.2e}")


@fact("gesture_conv1d_view_not_permute")
def _():
    x, _ = first_batch(built("gesture_conv1d_view_not_permute"))
    viewed, permuted = x.view(x.size(0), 3, -1), x.permute(0, 2, 1)
    fmt = lambda t: [round(v, 2) for v in t.tolist()]          # noqa: E731
    print(f"  window {tuple(x.shape)}: view's channel 0 starts {fmt(viewed[0, 0, :4])}, the x axis starts "
          f"{fmt(permuted[0, 0, :4])} (view == permute: {torch.equal(viewed, permuted)})")


@fact("review_gru_last_step_is_padding")
def _():
    x, _ = first_batch(built("review_gru_last_step_is_padding"))
    lengths = (x != 0).sum(1).float()
    print(f"  reviews padded to {x.size(1)}, mean length {lengths.mean():.1f}: h[:, -1] is a pad step for "
          f"{(lengths < x.size(1)).float().mean():.0%} of them, {x.size(1) - lengths.mean():.0f} steps after the text")


@fact("intrusion_logsoftmax_over_batch")
def _():
    kw = built("intrusion_logsoftmax_over_batch")
    x, _ = first_batch(kw)
    with torch.no_grad():
        p = kw["model"](x).exp()
    print(f"  output {tuple(p.shape)}: sums over dim 0 {p.sum(0)[:3].tolist()}, over dim 1 {p.sum(1)[:3].tolist()}")


@fact("ratings_dot_product_summed_over_batch")
def _():
    kw = built("ratings_dot_product_summed_over_batch")
    x, y = first_batch(kw)
    with torch.no_grad():
        out = kw["model"](x)
    print(f"  prediction shape {tuple(out.shape)} for {len(y)} ratings (targets {tuple(y.shape)})")


@fact("gpt2_labels_shifted_twice")
def _():
    batch = first_batch(built("gpt2_labels_shifted_twice"))
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    print(f"  input_ids {ids[:6].tolist()}; labels {labels[:6].tolist()}; the model scores logits[t] against "
          f"labels[t + 1] = input_ids[t + 2]: position 0 is trained towards {labels[1].item()}, not {ids[1].item()}")


@fact("signature_cosine_loss_zero_labels")
def _():
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    for target in (1, 0, -1):
        loss = F.cosine_embedding_loss(a, b, torch.full((4,), target), reduction="none")
        print(f"  cosine_embedding_loss, target {target:+d}: {[round(v, 3) for v in loss.tolist()]}")


@fact("topics_nllloss_on_softmax")
def _():
    logits, y = torch.randn(4, 100), torch.randint(0, 100, (4,))
    p = logits.softmax(1)
    print(f"  NLLLoss(softmax) = {F.nll_loss(p, y).item():.4f} = -mean p[target]; "
          f"NLLLoss(log_softmax) = {F.nll_loss(p.log(), y).item():.3f}")


@fact("defect_sigmoid_boxes_pixel_targets")
def _():
    kw = built("defect_sigmoid_boxes_pixel_targets")
    x, boxes = first_batch(kw)
    with torch.no_grad():
        out = kw["model"](x)
    print(f"  predictions in ({out.min().item():.2f}, {out.max().item():.2f}); targets in "
          f"[{boxes.min().item():.0f}, {boxes.max().item():.0f}] pixels")


@fact("cells_bce_on_255_masks")
def _():
    x, mask = first_batch(built("cells_bce_on_255_masks"))
    print(f"  mask values {mask.unique().tolist()}; BCEWithLogitsLoss at target 255: logit 0 -> "
          f"{F.binary_cross_entropy_with_logits(torch.tensor(0.), torch.tensor(255.)).item():.1f}, logit 10 -> "
          f"{F.binary_cross_entropy_with_logits(torch.tensor(10.), torch.tensor(255.)).item():.1f}")


@fact("bert_tagger_head_group_not_appended")
def _():
    kw = built("bert_tagger_head_group_not_appended")
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    missing = [n for n, p in kw["model"].named_parameters() if id(p) not in in_opt]
    print(f"  parameters not in the optimizer: {missing}; groups' lr: "
          f"{[g['lr'] for g in kw['optimizer'].param_groups]}")


@fact("clip_cnn_under_no_grad")
def _():
    kw = built("clip_cnn_under_no_grad")
    x, y = first_batch(kw)
    kw["loss_fn"](kw["model"](x), y).backward()
    cnn_grads = [p.grad for p in kw["model"].cnn.parameters()]
    print(f"  after backward: CNN grads all None: {all(g is None for g in cnn_grads)}; LSTM grad norm "
          f"{kw['model'].lstm.weight_ih_l0.grad.norm().item():.3f}")


@fact("ctr_wide_weights_plain_tensor")
def _():
    model = built("ctr_wide_weights_plain_tensor")["model"]
    print(f"  model.wide is a {type(model.wide).__name__} with requires_grad={model.wide.requires_grad}; named "
          f"parameters: {[n for n, _ in model.named_parameters()]}")


@fact("birdcall_numpy_loss_rewrapped")
def _():
    kw = built("birdcall_numpy_loss_rewrapped")
    loss = kw["loss_fn"](kw["model"], first_batch(kw))
    loss.backward()
    print(f"  loss {loss.item():.3f}, grad_fn {loss.grad_fn}, is_leaf {loss.is_leaf}; model grads all None: "
          f"{all(p.grad is None for p in kw['model'].parameters())}")


@fact("ratings_item_vectors_frozen_by_default")
def _():
    model = built("ratings_item_vectors_frozen_by_default")["model"]
    print(f"  item.weight.requires_grad = {model.item.weight.requires_grad} "
          f"(nn.Embedding.from_pretrained freezes by default)")


@fact("gcn_functional_dropout_in_eval")
def _():
    model = built("gcn_functional_dropout_in_eval")["model"]
    x = torch.randn(1, 800, 16)
    model.eval()
    with torch.no_grad():
        a, b = model(x), model(x)
    print(f"  model.training={model.training}; two eval forwards of the same input differ by "
          f"{(a - b).abs().max().item():.3f} (F.dropout's training defaults to True)")


@fact("traffic_exponentiallr_per_batch")
def _():
    for fixed in (False, True):
        kw = built("traffic_exponentiallr_per_batch", fixed)
        opt, sched = kw["optimizer"], kw["scheduler"]
        for _ in range(300):
            opt.step()
            sched.step()
        print(f"  {'fixed ' if fixed else 'broken'}: gamma {sched.gamma:.4f}, lr after 300 batches "
              f"{opt.param_groups[0]['lr']:.2e} ({len(kw['train_loader'])} batches per epoch)")


@fact("defects_lambdalr_returns_lr")
def _():
    kw = built("defects_lambdalr_returns_lr")
    opt, sched = kw["optimizer"], kw["scheduler"]
    for _ in range(40):
        opt.step()
        sched.step()
    print(f"  Adam lr 1e-3; after the 30-step warm-up LambdaLR gives lr {opt.param_groups[0]['lr']:.1e}")


@fact("t5_adam_eps_too_large")
def _():
    kw = built("t5_adam_eps_too_large")
    kw["model"](**first_batch(kw)).loss.backward()
    grads = torch.cat([p.grad.abs().flatten() for p in kw["model"].parameters() if p.grad is not None])
    print(f"  Adam eps {kw['optimizer'].param_groups[0]['eps']}; median |grad| {grads.median().item():.1e}, "
          f"90th percentile {grads.quantile(0.9).item():.1e}")


@fact("credit_mlp_zero_init")
def _():
    kw = built("credit_mlp_zero_init")
    x, y = first_batch(kw)
    kw["loss_fn"](kw["model"](x), y).backward()
    layers = [m for m in kw["model"] if isinstance(m, nn.Linear)]
    print(f"  grad norms of the Linear weights after one backward: "
          f"{[round(m.weight.grad.norm().item(), 4) for m in layers]}; output bias grad "
          f"{layers[-1].bias.grad.norm().item():.3f}")


@fact("fields_image_mask_flipped_separately")
def _():
    ds = built("fields_image_mask_flipped_separately")["train_loader"].dataset
    torch.manual_seed(0)
    aligned = 0
    for i in range(200):
        img, mask = ds[i]
        aligned += ((img > 0.5).float() * mask).sum() > 0.5 * mask.sum()
    print(f"  {int(aligned)} of 200 training pairs have the mask over its field")


@fact("plankton_val_labels_numeric_train_lexicographic")
def _():
    names = [str(k) for k in range(1, 13)]
    lexicographic = {n: k for k, n in enumerate(sorted(names))}
    print(f"  folder -> training index: {lexicographic}; validation index = int(folder) - 1; classes that "
          f"agree: {[n for n in names if lexicographic[n] == int(n) - 1]}")


@fact("bearing_split_sorted_rows")
def _():
    kw = built("bearing_split_sorted_rows")
    train = torch.cat([y for _, y in kw["train_loader"]]).unique().tolist()
    val = torch.cat([y for _, y in kw["val_loader"]]).unique().tolist()
    print(f"  classes in training: {train}; in validation: {val}")


@fact("whale_sampler_weights_per_class")
def _():
    kw = built("whale_sampler_weights_per_class")
    drawn = torch.tensor(list(iter(kw["train_loader"].sampler)))
    print(f"  sampler weights {len(kw['train_loader'].sampler.weights)} for {len(kw['train_loader'].dataset)} "
          f"rows; distinct indices drawn in an epoch: {drawn.unique().tolist()}")


@fact("load_rows_shuffled_before_windowing")
def _():
    for fixed in (False, True):
        x, y = first_batch(built("load_rows_shuffled_before_windowing", fixed))
        corr = torch.corrcoef(torch.stack([x[:, -1], y]))[0, 1].item()
        print(f"  {'fixed ' if fixed else 'broken'}: correlation of a window's last hour with its target {corr:+.2f}")
