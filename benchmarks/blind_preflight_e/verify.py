"""Facts behind set e's broken cases, checked without the preflight: the shapes and values the loss sees,
what the data holds, what the optimizer holds, and the case trained next to its one-line fix (same data,
same steps).

    .venv/bin/python -m benchmarks.blind_preflight_e.verify [NAME ...]
"""

from __future__ import annotations

import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_e import cases_data as D
from benchmarks.blind_preflight_e import cases_mechanics as M
from benchmarks.blind_preflight_e import cases_shapes as S
from benchmarks.blind_preflight_e import cases_targets as T
from benchmarks.blind_preflight_e import cases_trained as W
from benchmarks.blind_preflight_e.registry import load_all, loader
from benchmarks.blind_preflight_e.sanity import loss_of, run_case

CASES = load_all()


def train(kw, steps=200):
    class C:  # a Case-like wrapper for sanity.run_case
        build = staticmethod(lambda: kw)
    losses, model = run_case(C, steps)
    return sum(losses[:3]) / 3, sum(losses[-10:]) / 10, model


def build(name):
    return CASES[name].build()


@torch.no_grad()
def val_loss(model, kw):
    model.eval()
    losses = [loss_of(kw.get("loss_fn"), model, b).item() for b in kw["val_loader"]]
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def accuracy(model, val_loader, fwd=None):
    model.eval()
    right = n = 0
    for batch in val_loader:
        x, y = batch[0], batch[-1]
        out = fwd(model, x) if fwd else model(x)
        right += (out.argmax(-1) == y).sum().item()
        n += y.numel()
    model.train()
    return right / n


def compare(name, fixed, steps=200, metric=None, label="val acc"):
    broken = build(name)
    b0, b1, bm = train(broken, steps)
    f0, f1, fm = train(fixed, steps)
    line = f"  broken loss {b0:.4g} -> {b1:.4g}; fixed loss {f0:.4g} -> {f1:.4g} ({steps} steps)"
    if metric:
        line += f" | {label}: broken {metric(bm, broken):.3f}, fixed {metric(fm, fixed):.3f}"
    print(line)
    return bm, fm


def val_acc(model, kw):
    return accuracy(model, kw["val_loader"])


def fresh(kw, model, lr=None, opt=torch.optim.Adam):
    kw["model"] = model
    kw["optimizer"] = opt(model.parameters(), lr=lr or kw["optimizer"].param_groups[0]["lr"])
    return kw


# --------------------------------------------------------------------------- shapes


def v_gesture():
    name = "gesture_lstm_time_major_output_reshaped"
    kw = build(name)
    m = kw["model"].eval()
    x, _ = next(iter(kw["train_loader"]))
    x2 = x.clone()
    x2[1:] = torch.randn_like(x2[1:])
    print("  sample 0's logits move when only the other samples change:", not torch.allclose(m(x)[0], m(x2)[0]))

    class Fixed(S.GestureLSTM):
        def forward(self, x):
            out, _ = self.lstm(x.transpose(0, 1))
            return self.head(out.transpose(0, 1).reshape(x.size(0), -1))
    torch.manual_seed(0)
    compare(name, fresh(build(name), Fixed()), 300, val_acc)


def v_infonce():
    name = "query_doc_infonce_normalize_over_batch"
    kw = build(name)
    a, b = kw["train_loader"].dataset.tensors
    z = F.normalize(kw["model"](a[:64]), dim=0)
    print(f"  row norms after normalize(dim=0): min {z.norm(dim=1).min():.3f} max {z.norm(dim=1).max():.3f}")

    def fixed_loss(model, batch):
        za, zb = F.normalize(model(batch[0]), dim=1), F.normalize(model(batch[1]), dim=1)
        return F.cross_entropy(za @ zb.t() / 0.1, torch.arange(batch[0].size(0)))
    fixed = build(name)
    fixed["loss_fn"] = fixed_loss

    def retrieval(model, _kw):   # 1000 queries vs 1000 documents, embedded one at a time as at serving time
        with torch.no_grad():
            norm_dim = 0 if _kw["loss_fn"] is S.infonce_dim0 else 1
            q = torch.cat([F.normalize(model(a[i:i + 1]), dim=norm_dim) for i in range(1000)])
            d = torch.cat([F.normalize(model(b[i:i + 1]), dim=norm_dim) for i in range(1000)])
            return ((q @ d.t()).argmax(1) == torch.arange(1000)).float().mean().item()
    compare(name, fixed, 300, retrieval, "top-1 retrieval, items embedded one at a time")


def v_keyword():
    name = "keyword_attention_mask_repeat_not_interleave"
    kw = build(name)
    m = kw["model"].eval()
    ids, _ = next(iter(kw["train_loader"]))
    ids2 = ids.clone()
    ids2[1:, 4:] = 0          # shorten every other sequence
    print("  sample 0's logits move when only the other samples' padding changes:",
          not torch.allclose(m(ids)[0], m(ids2)[0], atol=1e-6))

    class Fixed(S.KeywordSpotter):
        def forward(self, ids):
            B, T = ids.shape
            mask = (ids == 0)[:, None, :].expand(B, T, T).repeat_interleave(self.heads, 0)
            h = self.embed(ids) + self.pos(torch.arange(T))
            a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
            return self.head(self.norm(h + a)[:, 0])
    torch.manual_seed(0)
    bm, fm = compare(name, fresh(build(name), Fixed()), 400, val_acc)
    ids_v, y_v = build(name)["val_loader"].dataset.tensors
    bm.eval()
    with torch.no_grad():
        single = torch.cat([bm(ids_v[i:i + 1]) for i in range(len(ids_v))]).argmax(1)
        batched = torch.cat([bm(ids_v[i:i + 32]) for i in range(0, len(ids_v), 32)]).argmax(1)
    print(f"  broken model: val acc in batches of 32 {(batched == y_v).float().mean():.3f}, one sequence at a time "
          f"{(single == y_v).float().mean():.3f}; predictions that change with the batching "
          f"{(single != batched).float().mean():.3f}")


def v_tagger():
    name = "pos_tagger_time_major_tags_vs_batch_major_logits"
    text, tags = next(iter(build(name)["train_loader"]))
    print("  batch text", tuple(text.shape), "tags", tuple(tags.shape), "(T, B)")
    fixed = build(name)
    fixed["loss_fn"] = lambda m, b: F.cross_entropy(m(b[0].t()).reshape(-1, 5), b[1].t().reshape(-1))
    compare(name, fixed, 300)


def v_gap():
    name = "bar_cnn_global_pool_over_channels_and_height"
    kw = build(name)
    x, _ = next(iter(kw["train_loader"]))
    h = kw["model"].features(x)
    print("  feature map", tuple(h.shape), "pooled by mean(dim=(1,2)) ->", tuple(h.mean(dim=(1, 2)).shape))

    class Fixed(S.BarCNN):
        def forward(self, x):
            return self.head(self.features(x).mean(dim=(2, 3)))
    torch.manual_seed(0)
    compare(name, fresh(build(name), Fixed()), 400, val_acc)


def v_marking():
    name = "marking_segmentation_image_transposed_mask_not"

    def fixed_collate(batch):
        return torch.stack([b[0] for b in batch]).permute(0, 3, 1, 2), torch.stack([b[1] for b in batch])
    fixed = build(name)
    fixed["train_loader"] = loader(fixed["train_loader"].dataset, 32, collate_fn=fixed_collate)
    fixed["val_loader"] = loader(fixed["val_loader"].dataset, 64, shuffle=False, collate_fn=fixed_collate)
    x, m = next(iter(build(name)["train_loader"]))
    red = (x[:, 0] > 0.5).long()
    print(f"  agreement of red pixels with the mask: as batched {((red == m) & (m == 1)).sum() / (m == 1).sum():.3f}, "
          f"transposed back {((red.transpose(1, 2) == m) & (m == 1)).sum() / (m == 1).sum():.3f}")

    def iou(model, kw):
        inter = union = 0
        with torch.no_grad():
            for xb, mb in kw["val_loader"]:
                p = model(xb).argmax(1)
                inter += ((p == 1) & (mb == 1)).sum().item()
                union += ((p == 1) | (mb == 1)).sum().item()
        return inter / max(union, 1)
    compare(name, fixed, 300, iou, "marking IoU")


def v_triplet():
    name = "product_triplet_embeddings_chunked_on_feature_dim"
    kw = build(name)
    a, p, n = next(iter(kw["train_loader"]))
    emb = kw["model"](torch.cat([a, p, n]))
    print("  chunks:", [tuple(c.shape) for c in emb.chunk(3, dim=-1)], "for a batch of", a.size(0))

    def fixed_loss(model, batch):
        emb = model(torch.cat(batch))
        return S._triplet(*emb.chunk(3, dim=0))
    fixed = build(name)
    fixed["loss_fn"] = fixed_loss
    _, _, _, base = S.product_triplets(s=7)
    g = torch.Generator().manual_seed(99)
    view = lambda: torch.cat([base + 0.2 * torch.randn(base.shape, generator=g),  # noqa: E731
                              3.0 * torch.randn(len(base), 24, generator=g)], 1)
    queries, gallery = view(), view()
    print("  top-1 retrieval on the raw features:",
          (torch.cdist(queries, gallery).argmin(1) == torch.arange(len(base))).float().mean().item())

    def retrieval(model, _kw):
        with torch.no_grad():
            return (torch.cdist(model(queries), model(gallery)).argmin(1) == torch.arange(len(base))).float().mean().item()
    compare(name, fixed, 300, retrieval, "top-1 item retrieval")


# --------------------------------------------------------------------------- targets


def v_housing():
    name = "housing_value_targets_cast_to_long"
    kw = build(name)
    ys = torch.stack([kw["train_loader"].dataset[i][1] for i in range(2560)])
    X, y = T.housing_arrays(s=11)
    print(f"  target dtype {ys.dtype}; exactly 0: {(ys == 0).float().mean():.2f}; distinct {sorted(set(ys.tolist()))}")

    class FloatDS(T.HousingDataset):
        def __getitem__(self, i):
            return torch.tensor(self.X[i]), torch.tensor(self.y[i])
    fixed = build(name)
    fixed["train_loader"] = loader(FloatDS(X[:2560], y[:2560]), 64)
    true_val = TensorDataset(torch.tensor(X[2560:]), torch.tensor(y[2560:]))

    def mse_true(model, _kw):
        with torch.no_grad():
            return F.mse_loss(model(true_val.tensors[0]).squeeze(-1), true_val.tensors[1]).item()
    compare(name, fixed, 400, mse_true, "MSE against the true float targets")


def v_ticket():
    name = "ticket_labels_encoded_per_split"
    (tx, tn), (vx, vn) = T.ticket_splits(s=12)
    classes = sorted(set(tn))
    consistent = torch.tensor([classes.index(n) for n in vn])
    kw = build(name)
    _, _, m = train(kw, 400)
    print(f"  val classes present: {sorted(set(vn))}; val accuracy with the per-split ids "
          f"{accuracy(m, kw['val_loader']):.3f}, with the training ids "
          f"{accuracy(m, loader(TensorDataset(vx, consistent), 128, shuffle=False)):.3f}")


def v_rating():
    name = "rating_regressor_sigmoid_head_on_1_to_5_stars"
    kw = build(name)
    x, stars = kw["train_loader"].dataset.tensors
    print(f"  target range {stars.min():.0f}-{stars.max():.0f}; prediction range (0, 1)")
    fixed = build(name)
    torch.manual_seed(0)
    fresh(fixed, nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1)))
    compare(name, fixed, 400)


def v_mlm():
    name = "bert_mlm_labels_cloned_after_masking"
    batch = next(iter(build(name)["train_loader"]))
    lab = batch["labels"][batch["labels"] != -100]
    print(f"  labels at masked positions equal to [MASK]={T.MASK_ID}: {(lab == T.MASK_ID).float().mean():.2f}")

    def fixed_collate(b):
        ids = torch.stack([x[0] for x in b])
        labels = ids.clone()
        masked = torch.rand(ids.shape) < 0.15
        ids = ids.clone()
        ids[masked] = T.MASK_ID
        labels[~masked] = -100
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    fixed = build(name)
    fixed["train_loader"] = loader(fixed["train_loader"].dataset, 32, collate_fn=fixed_collate)
    ids = T.mlm_corpus(n=256, s=99)

    def recon(model, _kw):   # hide one middle token per sequence, can the model restore it?
        model.eval()
        inp = ids.clone()
        inp[:, 8] = T.MASK_ID
        with torch.no_grad():
            pred = model(input_ids=inp, attention_mask=torch.ones_like(inp)).logits[:, 8].argmax(-1)
        model.train()
        return (pred == ids[:, 8]).float().mean().item()
    bm, fm = compare(name, fixed, 800, recon, "masked-token reconstruction")
    inp = ids.clone()
    inp[:, 8] = T.MASK_ID
    with torch.no_grad():
        pred = bm.eval()(input_ids=inp, attention_mask=torch.ones_like(inp)).logits[:, 8].argmax(-1)
    print(f"  broken model predicts the [MASK] id itself at a masked position: {(pred == T.MASK_ID).float().mean():.2f}")


def v_num_labels():
    name = "bert_intent_classifier_num_labels_1"
    kw = build(name)
    print("  problem_type after a forward:", end=" ")
    b = next(iter(kw["train_loader"]))
    kw["model"](**b)
    print(kw["model"].config.problem_type, "| logits", tuple(kw["model"](**b).logits.shape))
    from transformers import BertForSequenceClassification
    fixed = build(name)
    torch.manual_seed(0)
    fixed["model"] = BertForSequenceClassification(T.tiny_bert_config(num_labels=4))
    fixed["optimizer"] = torch.optim.AdamW(fixed["model"].parameters(), lr=1e-3)

    def acc(model, _kw):
        model.eval()
        right = n = 0
        with torch.no_grad():
            for b in _kw["val_loader"]:
                logits = model(**{k: v for k, v in b.items() if k != "labels"}).logits
                pred = logits.argmax(-1)
                right += (pred.long() == b["labels"]).sum().item()
                n += len(b["labels"])
        model.train()
        return right / n
    bm, _ = compare(name, fixed, 300, acc, "intent accuracy from logits.argmax(-1)")
    b = next(iter(fixed["val_loader"]))
    with torch.no_grad():
        score = bm.eval()(**{k: v for k, v in b.items() if k != "labels"}).logits.squeeze(-1)
    print(f"  the broken model's single score: a regression of the intent id (rounded accuracy "
          f"{(score.round().clamp(0, 3).long() == b['labels']).float().mean():.3f}), argmax over one logit is always 0")


def v_causal():
    name = "char_gpt_encoder_stack_without_causal_mask"
    seq, probs = T.markov_text(s=17)
    ent = -(probs * probs.log()).sum(1)
    stationary = torch.bincount(seq[:, 1:].flatten(), minlength=probs.size(0)).float()
    rate = (stationary / stationary.sum() * ent).sum().item()
    print(f"  entropy rate of the chain: {rate:.3f} nats (no honest model can go below it)")
    fixed = build(name)
    torch.manual_seed(0)
    fresh(fixed, T.TinyCharGPT(causal=True), lr=2e-3, opt=torch.optim.AdamW)

    def gen_loss(model, _kw):   # predict token 16 from the first 16 tokens only, as at generation time
        with torch.no_grad():
            v = seq[1024:]
            return F.cross_entropy(model(v[:, :16])[:, -1], v[:, 16]).item()
    compare(name, fixed, 300, gen_loss, "next-token loss from a prefix")


def v_crack():
    name = "crack_segmentation_png_masks_255_ignored"
    kw = build(name)
    x, m = kw["train_loader"].dataset.tensors
    print(f"  mask values {sorted(m.unique().tolist())}; crack pixels {(m == 255).float().mean():.3f} of all, all ignored")
    fixed = build(name)
    fixed["train_loader"] = loader(TensorDataset(x, m // 255), 32)
    fixed["loss_fn"] = nn.CrossEntropyLoss()

    def recall(model, _kw):
        xv, mv = _kw["val_loader"].dataset.tensors
        with torch.no_grad():
            p = model(xv).argmax(1)
        return ((p == 1) & (mv > 0)).sum().item() / (mv > 0).sum().item()
    compare(name, fixed, 300, recall, "crack-pixel recall")


# --------------------------------------------------------------------------- what is trained


def opt_ids(opt):
    return {id(p) for g in opt.param_groups for p in g["params"]}


def v_init():
    name = "cnn_init_helper_replaces_parameters_after_optimizer"
    kw = build(name)
    ids = opt_ids(kw["optimizer"])
    named = list(kw["model"].named_parameters())
    print(f"  model parameters held by the optimizer: {sum(id(p) in ids for _, p in named)}/{len(named)} "
          f"({[n for n, p in named if id(p) in ids]})")
    fixed = build(name)
    fixed["optimizer"] = torch.optim.SGD(fixed["model"].parameters(), lr=0.05, momentum=0.9)
    compare(name, fixed, 300, val_acc)


def v_hash():
    name = "hashing_autoencoder_round_without_straight_through"
    kw = build(name)
    (x,) = next(iter(kw["train_loader"]))
    F.mse_loss(kw["model"](x), x).backward()
    print("  encoder gradient norm:", sum(p.grad.norm() for p in kw["model"].encoder.parameters()).item())
    fixed = build(name)
    torch.manual_seed(0)
    fresh(fixed, W.HashingAutoencoder(straight_through=True))
    compare(name, fixed, 400)


def v_lora():
    name = "lora_adapters_both_factors_zero_init"
    kw = build(name)
    x, y = next(iter(kw["train_loader"]))
    F.cross_entropy(kw["model"](x), y).backward()
    print("  adapter gradient norms:",
          sorted({round(p.grad.norm().item(), 6) for n, p in kw["model"].named_parameters() if "lora" in n}))
    fixed = build(name)
    for mod in fixed["model"].modules():
        if isinstance(mod, W.LoRALinear):
            nn.init.kaiming_uniform_(mod.lora_A, a=5 ** 0.5)
    compare(name, fixed, 300, val_acc)


def v_dropout():
    name = "churn_mlp_functional_dropout_never_off"
    kw = build(name)
    m = kw["model"].eval()
    x, _ = next(iter(kw["val_loader"]))
    print("  two eval-mode forwards of the same batch equal:", torch.equal(m(x), m(x)))

    class Fixed(W.ChurnMLP):
        def forward(self, x):
            h = F.dropout(F.relu(self.fc1(x)), self.p, training=self.training)
            return self.out(F.dropout(F.relu(self.fc2(h)), self.p, training=self.training))
    torch.manual_seed(0)
    bm, _ = compare(name, fresh(build(name), Fixed()), 400, val_acc)
    bm.eval()
    xv, _ = build(name)["val_loader"].dataset.tensors
    with torch.no_grad():
        flips = (bm(xv).argmax(1) != bm(xv).argmax(1)).float().mean().item()
    print(f"  broken model in eval mode: validation predictions that change between two identical passes {flips:.3f}")


def v_mf():
    name = "mf_recommender_parameter_cast_after_wrapping"
    kw = build(name)
    m = kw["model"]
    print("  registered parameters:", [n for n, _ in m.named_parameters()], "| user_factors is a leaf:",
          m.user_factors.is_leaf, type(m.user_factors).__name__)
    before = m.user_factors.detach().clone()
    _, _, bm = train(kw, 20)
    print("  user factors unchanged after 20 steps:", torch.equal(before, bm.user_factors.detach()))

    class Fixed(W.MatrixFactorization):
        def __init__(self):
            super().__init__()
            self.user_factors = nn.Parameter(self.user_factors.detach().clone())
            self.item_factors = nn.Parameter(self.item_factors.detach().clone())
    torch.manual_seed(0)
    fixed = fresh(build(name), Fixed())
    compare(name, fixed, 600, val_loss, "val MSE")


def v_ckpt():
    name = "cnn_reentrant_checkpoint_on_raw_images"
    kw = build(name)
    before = [p.detach().clone() for p in kw["model"].features.parameters()]
    _, _, m = train(kw, 20)
    print("  conv/BN weights unchanged after 20 steps:",
          all(torch.equal(a, b) for a, b in zip(before, m.features.parameters())))

    class Fixed(W.BarNet):
        def forward(self, x):
            h = W.checkpoint(self.features[:3], x, use_reentrant=False)
            return self.head(W.checkpoint(self.features[3:], h, use_reentrant=False))
    torch.manual_seed(0)
    compare(name, fresh(build(name), Fixed()), 300, val_acc)


def v_filter():
    name = "gru_param_group_from_consumed_filter"
    kw = build(name)
    print("  parameters per group:", [len(g["params"]) for g in kw["optimizer"].param_groups])
    fixed = build(name)
    m = fixed["model"]
    fixed["optimizer"] = torch.optim.AdamW([{"params": [p for p in m.encoder.parameters() if p.requires_grad],
                                             "lr": 1e-3}, {"params": m.head.parameters(), "lr": 3e-3}],
                                           weight_decay=0.01)
    compare(name, fixed, 300, val_acc)


# --------------------------------------------------------------------------- mechanics


def v_betas():
    name = "adam_betas_swapped_0999_09"
    fixed = build(name)
    fixed["optimizer"] = torch.optim.Adam(fixed["model"].parameters(), lr=3e-3)
    compare(name, fixed, 600, val_loss, "val MSE")


def v_steplr():
    name = "steplr_epoch_step_size_stepped_every_batch"
    kw = build(name)
    for _ in range(60):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print("  lr after 60 steps:", kw["optimizer"].param_groups[0]["lr"])
    fixed = build(name)
    fixed["scheduler"] = torch.optim.lr_scheduler.StepLR(fixed["optimizer"], step_size=10 * 32, gamma=0.1)
    compare(name, fixed, 300, val_acc)


def v_lambdalr():
    name = "lambdalr_returns_learning_rate_not_factor"
    kw = build(name)
    for _ in range(150):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print("  lr after the warmup:", kw["optimizer"].param_groups[0]["lr"])
    fixed = build(name)
    fixed["scheduler"] = torch.optim.lr_scheduler.LambdaLR(fixed["optimizer"], lambda s: min(1.0, (s + 1) / M.WARMUP))
    compare(name, fixed, 400, val_acc)


def v_item():
    name = "loss_item_plus_l2_penalty_only_penalty_trains"
    kw = build(name)
    x, y = next(iter(kw["train_loader"]))
    loss = M.ce_item_plus_l2(kw["model"], (x, y))
    loss.backward()
    g_reg = kw["model"][2].weight.grad.clone()
    expected = 5e-4 * 2 * kw["model"][2].weight.detach()
    print("  gradient equals the L2 term's alone:", torch.allclose(g_reg, expected))
    fixed = build(name)
    fixed["loss_fn"] = lambda m, b: F.cross_entropy(m(b[0]), b[1]) + 5e-4 * sum(p.pow(2).sum() for p in m.parameters())
    compare(name, fixed, 300, val_acc)


def v_sum():
    name = "tagger_token_ce_reduction_sum_with_sgd"
    fixed = build(name)
    fixed["loss_fn"] = lambda m, b: F.cross_entropy(m(b[0]).reshape(-1, 5), b[1].reshape(-1))
    bm, fm = compare(name, fixed, 200)
    print("  broken weights finite:", all(torch.isfinite(p).all().item() for p in bm.parameters()))


def v_adam_lr():
    name = "adam_keeps_adadelta_lr_1"
    fixed = build(name)
    fixed["optimizer"] = torch.optim.Adam(fixed["model"].parameters(), lr=1e-3)
    compare(name, fixed, 300, val_acc)


def v_ema():
    name = "ema_step_hook_overwrites_live_weights"
    kw = build(name)
    before = [p.detach().clone() for p in kw["model"].parameters()]
    _, _, m = train(kw, 200)
    moved = sum((a - b).norm() ** 2 for a, b in zip(before, m.parameters())).sqrt().item()

    fixed = build(name)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    model.load_state_dict(fixed["model"].state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    import copy
    ema = copy.deepcopy(model).requires_grad_(False)

    @torch.no_grad()
    def good(o, a, k):
        for e, p in zip(ema.parameters(), model.parameters()):
            e.copy_(0.999 * e + 0.001 * p)
    opt.register_step_post_hook(good)
    fixed["model"], fixed["optimizer"] = model, opt
    before_f = [p.detach().clone() for p in model.parameters()]
    _, _, fm = train(dict(fixed), 200)
    moved_f = sum((a - b).norm() ** 2 for a, b in zip(before_f, fm.parameters())).sqrt().item()
    print(f"  weight distance from the start after 200 steps: broken {moved:.4f}, fixed {moved_f:.4f}")
    compare(name, fixed_again(name), 300, val_acc)


def fixed_again(name):
    kw = build(name)
    kw["optimizer"]._optimizer_step_post_hooks.clear()   # the fix: no hook writing into the live weights
    return kw


# --------------------------------------------------------------------------- data


def v_scans():
    name = "scans_split_by_scan_not_by_patient"
    kw = build(name)
    x, y, pid = D.patient_scans(s=41)
    tr = set(pid[kw["train_loader"].dataset.indices].tolist())
    va = set(pid[kw["val_loader"].dataset.indices].tolist())
    print(f"  validation patients with scans in training: {len(va & tr)}/{len(va)}")
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(0))
    in_train = torch.isin(pid, perm[:160])
    fixed = build(name)
    fixed["train_loader"] = loader(TensorDataset(x[in_train], y[in_train]), 64)
    fixed["val_loader"] = loader(TensorDataset(x[~in_train], y[~in_train]), 256, shuffle=False)
    compare(name, fixed, 800, val_acc, "val acc as each split reports it (fixed: 40 unseen patients)")


def v_minmax():
    name = "churn_minmax_scaled_with_global_min_max"
    x, _ = build(name)["train_loader"].dataset.tensors
    print("  per-column std after scaling:", [f"{v:.1e}" for v in x.std(0).tolist()])
    X, y = D.customer_table(s=42)
    X = (X - X.min(0).values) / (X.max(0).values - X.min(0).values)
    fixed = build(name)
    fixed["train_loader"] = loader(TensorDataset(X[:2560], y[:2560]), 64)
    fixed["val_loader"] = loader(TensorDataset(X[2560:], y[2560:]), 128, shuffle=False)
    compare(name, fixed, 400, val_acc)


def v_mulstd():
    name = "sensor_standardise_multiplies_by_std"
    x, _ = build(name)["train_loader"].dataset.tensors
    print("  per-column std of the inputs:", [f"{v:.0e}" for v in x.std(0).tolist()])
    X, y = D.plant_sensors(s=43)
    X = (X - X[:2560].mean(0)) / X[:2560].std(0)
    fixed = build(name)
    fixed["train_loader"] = loader(TensorDataset(X[:2560], y[:2560]), 64)
    fixed["val_loader"] = loader(TensorDataset(X[2560:], y[2560:]), 128, shuffle=False)
    compare(name, fixed, 400, val_acc)


def v_droplast():
    name = "fewshot_drop_last_batch_larger_than_dataset"
    kw = build(name)
    print(f"  dataset {len(kw['train_loader'].dataset)} examples, batch_size 64, drop_last=True: "
          f"len(loader) = {len(kw['train_loader'])}, batches yielded = {sum(1 for _ in kw['train_loader'])}")
    fixed = build(name)
    fixed["train_loader"] = DataLoader(fixed["train_loader"].dataset, batch_size=16, shuffle=True)
    f0, f1, fm = train(fixed, 100)
    print(f"  fixed (batch_size=16, no drop_last): loss {f0:.3f} -> {f1:.3f}, val acc {val_acc(fm, fixed):.3f}")


def v_truncate():
    name = "reviews_truncated_to_shared_template_prefix"
    x, _ = build(name)["train_loader"].dataset.tensors
    print("  distinct training inputs:", torch.unique(x, dim=0).shape[0], "of", len(x))
    texts, y = D.reviews(3000, s=45, template=True)
    vocab = {w: i + 2 for i, w in enumerate(sorted({w for t in texts for w in t.split()}))}
    ids = D.encode(texts, vocab, max_length=32)
    fixed = build(name)
    fixed["train_loader"] = loader(TensorDataset(ids[:2560], y[:2560]), 64)
    fixed["val_loader"] = loader(TensorDataset(ids[2560:], y[2560:]), 128, shuffle=False)
    compare(name, fixed, 300, val_acc)


def v_vocab():
    name = "reviews_vocab_keyed_by_most_common_tuples"
    x, _ = build(name)["train_loader"].dataset.tensors
    print("  distinct token ids in the training inputs:", sorted(x.unique().tolist()))
    texts, y = D.reviews(3000, s=46)
    from collections import Counter
    counts = Counter(w for t in texts[:2560] for w in t.split())
    vocab = {w: i + 2 for i, (w, _) in enumerate(counts.most_common(500))}
    ids = D.encode(texts, vocab, max_length=16)
    fixed = build(name)
    fixed["train_loader"] = loader(TensorDataset(ids[:2560], y[:2560]), 64)
    fixed["val_loader"] = loader(TensorDataset(ids[2560:], y[2560:]), 128, shuffle=False)
    compare(name, fixed, 300, val_acc)


def v_sampler():
    name = "fraud_sampler_weights_are_class_counts"
    kw = build(name)
    ys = torch.cat([b[1] for b in kw["train_loader"]])
    print(f"  fraud share: in the data {kw['train_loader'].dataset.tensors[1].float().mean():.3f}, "
          f"drawn in one epoch {ys.float().mean():.4f}")
    fixed = build(name)
    ty = fixed["train_loader"].dataset.tensors[1]
    w = 1.0 / torch.bincount(ty).float()[ty]
    fixed["train_loader"] = DataLoader(fixed["train_loader"].dataset, batch_size=64, sampler=torch.utils.data.
                                       WeightedRandomSampler(w, len(ty), generator=torch.Generator().manual_seed(0)))

    def recall(model, _kw):
        xv, yv = _kw["val_loader"].dataset.tensors
        with torch.no_grad():
            p = model(xv).argmax(1)
        return ((p == 1) & (yv == 1)).sum().item() / (yv == 1).sum().item()
    compare(name, fixed, 300, recall, "fraud recall")


CHECKS = {
    "gesture_lstm_time_major_output_reshaped": v_gesture, "query_doc_infonce_normalize_over_batch": v_infonce,
    "keyword_attention_mask_repeat_not_interleave": v_keyword,
    "pos_tagger_time_major_tags_vs_batch_major_logits": v_tagger,
    "bar_cnn_global_pool_over_channels_and_height": v_gap, "marking_segmentation_image_transposed_mask_not": v_marking,
    "product_triplet_embeddings_chunked_on_feature_dim": v_triplet,
    "housing_value_targets_cast_to_long": v_housing, "ticket_labels_encoded_per_split": v_ticket,
    "rating_regressor_sigmoid_head_on_1_to_5_stars": v_rating, "bert_mlm_labels_cloned_after_masking": v_mlm,
    "bert_intent_classifier_num_labels_1": v_num_labels,
    "char_gpt_encoder_stack_without_causal_mask": v_causal, "crack_segmentation_png_masks_255_ignored": v_crack,
    "cnn_init_helper_replaces_parameters_after_optimizer": v_init,
    "hashing_autoencoder_round_without_straight_through": v_hash, "lora_adapters_both_factors_zero_init": v_lora,
    "churn_mlp_functional_dropout_never_off": v_dropout, "mf_recommender_parameter_cast_after_wrapping": v_mf,
    "cnn_reentrant_checkpoint_on_raw_images": v_ckpt, "gru_param_group_from_consumed_filter": v_filter,
    "adam_betas_swapped_0999_09": v_betas, "steplr_epoch_step_size_stepped_every_batch": v_steplr,
    "lambdalr_returns_learning_rate_not_factor": v_lambdalr,
    "loss_item_plus_l2_penalty_only_penalty_trains": v_item, "tagger_token_ce_reduction_sum_with_sgd": v_sum,
    "adam_keeps_adadelta_lr_1": v_adam_lr, "ema_step_hook_overwrites_live_weights": v_ema,
    "scans_split_by_scan_not_by_patient": v_scans, "churn_minmax_scaled_with_global_min_max": v_minmax,
    "sensor_standardise_multiplies_by_std": v_mulstd, "fewshot_drop_last_batch_larger_than_dataset": v_droplast,
    "reviews_truncated_to_shared_template_prefix": v_truncate,
    "reviews_vocab_keyed_by_most_common_tuples": v_vocab, "fraud_sampler_weights_are_class_counts": v_sampler,
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    missing = [n for n, c in CASES.items() if not c.healthy and n not in CHECKS]
    if missing:
        print("no check for:", missing)
    for n in sys.argv[1:] or list(CHECKS):
        print(n, flush=True)
        try:
            CHECKS[n]()
        except Exception as e:  # noqa: BLE001
            print(f"  RAISED {type(e).__name__}: {str(e)[:200]}")
