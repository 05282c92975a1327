"""The fact each broken case of set ab rests on, printed by ``verify.py`` before the case is trained next to its fix.
Importing this module attaches each function to ``FIXES[name]["fact"]``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_ab import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained  # noqa: F401
from benchmarks.blind_preflight_ab.registry import FIXES


def fact(name):
    def attach(fn):
        FIXES[name]["fact"] = fn
        return fn
    return attach


@fact("shapes_gpt2_first_token_pool")
def _():
    from transformers import GPT2Config, GPT2Model
    gpt = GPT2Model(GPT2Config(vocab_size=16, n_positions=8, n_embd=16, n_layer=1, n_head=2, bos_token_id=1,
                               eos_token_id=2)).eval()
    a, b = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[5, 9, 10, 11]])
    with torch.no_grad():
        ha, hb = gpt(a).last_hidden_state, gpt(b).last_hidden_state
    print(f"  fact: two inputs sharing only token 0: |h0(a) - h0(b)| = {(ha[0, 0] - hb[0, 0]).abs().max():.2e}, "
          f"|h_last(a) - h_last(b)| = {(ha[0, -1] - hb[0, -1]).abs().max():.2e}")


@fact("shapes_mf_matmul_scores")
def _():
    u, v, r = torch.randn(64, 16), torch.randn(64, 16), torch.randn(64)
    print(f"  fact: (u @ v.T).shape = {tuple((u @ v.T).shape)} vs ratings {tuple(r.shape)}; "
          f"(u * v).sum(1).shape = {tuple((u * v).sum(1).shape)}")


@fact("shapes_token_logits_view")
def _():
    x = torch.arange(2 * 3 * 4).view(2, 3, 4)        # (B, T, C)
    print(f"  fact: view(2, 4, 3) == permute(0, 2, 1)? {torch.equal(x.view(2, 4, 3), x.permute(0, 2, 1))}; "
          f"row 0 of the view: {x.view(2, 4, 3)[0, 0].tolist()} vs permute: {x.permute(0, 2, 1)[0, 0].tolist()}")


@fact("shapes_head_out_features_attr")
def _():
    head = nn.Linear(64, 40)
    head.out_features = 4
    print(f"  fact: after out_features = 4: weight {tuple(head.weight.shape)}, output "
          f"{tuple(head(torch.randn(2, 64)).shape)}")


@fact("shapes_two_tower_repeat")
def _():
    q = torch.arange(3)[:, None]
    print(f"  fact: rows of q.repeat(2, 1).view(3, 2) = {q.repeat(2, 1).view(3, 2).tolist()}; "
          f"repeat_interleave: {q.repeat_interleave(2, 0).view(3, 2).tolist()}")


@fact("targets_t5_decoder_inputs_unshifted")
def _():
    from benchmarks.blind_preflight_ab.cases_targets import _tiny_t5
    m = _tiny_t5()
    labels = torch.tensor([[7, 8, 9, 1]])
    print(f"  fact: T5 builds decoder_input_ids = {m._shift_right(labels).tolist()} from labels {labels.tolist()}; "
          f"the case feeds {labels.tolist()}")


@fact("targets_bce_star_ratings")
def _():
    z = torch.tensor([0.0, 5.0, 20.0])
    print(f"  fact: BCEWithLogits(z, 5) for z = {z.tolist()}: "
          f"{[round(F.binary_cross_entropy_with_logits(v, torch.tensor(5.0)).item(), 2) for v in z]} (no minimum)")


@fact("targets_multilabel_cross_entropy")
def _():
    logits = torch.tensor([[2.0, 2.0, 2.0, -5.0]])
    print(f"  fact: logits shifted by a constant give the same CrossEntropyLoss: "
          f"{F.cross_entropy(logits, torch.tensor([[1.0, 1, 1, 0]])).item():.4f} vs "
          f"{F.cross_entropy(logits - 10, torch.tensor([[1.0, 1, 1, 0]])).item():.4f}; sigmoid > 0.5 is not fixed")


@fact("targets_distill_kl_probabilities")
def _():
    t = torch.tensor([[0.5, 0.3, 0.2]])
    kl = nn.KLDivLoss(reduction="batchmean")
    for name, s in (("student = teacher", t), ("student one-hot on the top class: lower, so preferred", torch.tensor([[1.0, 0.0, 0.0]]))):
        print(f"  fact: KLDivLoss(probs={s.tolist()}) = {kl(s, t).item():.3f}  ({name})")


@fact("targets_multitask_price_unscaled")
def _():
    print("  fact: price target ~250000 vs a fresh linear output ~0: initial MSE ~6e10, Adam lr=1e-3 moves the bias "
          "~0.3 in 300 steps")


@fact("trained_bert_unfreeze_after_optimizer")
def _():
    kw = cases_trained.bert_unfreeze_after_optimizer()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    trainable = [p for p in kw["model"].parameters() if p.requires_grad]
    print(f"  fact: {len(trainable)} tensors require grad, {sum(id(p) in in_opt for p in trainable)} are in the "
          "optimizer")


@fact("trained_shared_task_heads")
def _():
    heads = nn.ModuleList([nn.Linear(4, 1)] * 3)
    print(f"  fact: heads[0] is heads[2]: {heads[0] is heads[2]}; distinct parameters: "
          f"{len(list(heads.parameters()))}")


@fact("trained_embedding_padding_idx_real_id")
def _():
    e = nn.Embedding(5, 3, padding_idx=0)
    e(torch.tensor([0, 1])).sum().backward()
    print(f"  fact: grad of row 0 with padding_idx=0: {e.weight.grad[0].tolist()}, row 1: {e.weight.grad[1].tolist()}")


@fact("trained_param_groups_name_mismatch")
def _():
    kw = cases_trained.param_groups_name_mismatch()
    print("  fact: " + "; ".join(f"group lr={g['lr']}: {len(g['params'])} tensors"
                                 for g in kw["optimizer"].param_groups))


@fact("trained_module_requires_grad_attr")
def _():
    block = nn.Linear(3, 3).requires_grad_(False)
    block.requires_grad = True
    print(f"  fact: after block.requires_grad = True: weight.requires_grad = {block.weight.requires_grad}")


@fact("mechanics_schedule_total_one_epoch")
def _():
    kw = cases_mechanics.distilbert_schedule_one_epoch()
    opt, sch = kw["optimizer"], kw["scheduler"]
    lrs = []
    for _ in range(kw["max_steps"]):
        opt.step()
        sch.step()
        lrs.append(opt.param_groups[0]["lr"])
    print(f"  fact: lr after {len(kw['train_loader'])} steps = {lrs[len(kw['train_loader']) - 1]:.2e}, "
          f"after {kw['max_steps']} = {lrs[-1]:.2e}")


@fact("mechanics_accumulation_divided_twice")
def _():
    print("  fact: the loop backpropagates loss_fn(...) / accumulation_steps; the case's loss_fn already returns "
          "loss / 4, so each micro-batch contributes loss / 16")


@fact("mechanics_pure_bf16_weights")
def _():
    w = torch.tensor(0.1, dtype=torch.bfloat16)
    print(f"  fact: bf16 0.1 - 1e-4 == 0.1? {(w - 1e-4) == w}; spacing near 0.1: "
          f"{(torch.nextafter(w.float(), torch.tensor(1.0)) - w.float()).item():.1e} in fp32, ~4.9e-04 in bf16")


@fact("mechanics_adam_eps_one")
def _():
    g = torch.tensor(0.01)
    print(f"  fact: Adam step with |g| = {g.item()}: lr * m / (sqrt(v) + eps) = {1e-3 * g / (g + 1.0):.1e} at eps=1 vs "
          f"{1e-3 * g / (g + 1e-8):.1e} at eps=1e-8")


@fact("mechanics_learnable_task_weights")
def _():
    w = nn.Parameter(torch.ones(2))
    (w[0] * 0.7 + w[1] * 0.2).backward()
    print(f"  fact: d(total)/d(task_w) = {w.grad.tolist()} (the task losses, always > 0: every step lowers the weights)")


@fact("data_category_codes_refit_on_val")
def _():
    city = cases_data._rentals(3000, 23)[0]
    tr = {c: i for i, c in enumerate(sorted(set(city[:2500])))}
    va = {c: i for i, c in enumerate(dict.fromkeys(city[2500:]))}
    print(f"  fact: cities whose code differs between train and val mappings: "
          f"{sum(tr[c] != va[c] for c in va)}/{len(va)}")


@fact("data_implicit_positives_only")
def _():
    kw = cases_data.implicit_positives_only()
    y = kw["train_loader"].dataset.tensors[1]
    print(f"  fact: training labels: {int(y.sum())} ones of {len(y)}")


@fact("data_flip_without_target")
def _():
    print("  fact: a flipped image's blob moves from x to 15 - x; the dataset returns x for both")


@fact("data_rowwise_normalize")
def _():
    x = torch.tensor([[10.0, 20.0], [100.0, 200.0]])
    print(f"  fact: normalize([[10, 20], [100, 200]]) = {cases_data.normalize(x).tolist()} (the 10x spend is gone)")


@fact("data_missing_labels_as_zero")
def _():
    y = cases_data._assays(3000, 27)[1][:2500]
    known = ~torch.isnan(y)
    print(f"  fact: positive rate among measured labels {y[known].mean():.2f}, after fillna(0) "
          f"{torch.nan_to_num(y, nan=0.0).mean():.2f}")
