"""The fact each of set y's broken cases rests on, printed by ``verify.py`` before the case is trained next to its
fix (shapes, what an index selects, what a loop stores, what the optimizer holds, ...). No preflight involved."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_y import cases_data, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_y.registry import FIXES, load_all

load_all()  # every case module registers its fix before the facts are attached


def _first_batch(builder, fixed=False):
    kw = builder(fixed=fixed)
    return kw, next(iter(kw["train_loader"]))


def dispatch():
    value, target = torch.zeros(64, 1), torch.zeros(64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        print(f"  value {tuple(value.shape)} - target {tuple(target.shape)} -> {tuple((value - target).shape)}")


def warehouse():
    q, a = torch.randn(64, 4), torch.randint(0, 4, (64,))
    print(f"  (q * one_hot(a)).sum() -> shape {tuple((q * F.one_hot(a, 4)).sum().shape)}; "
          f".sum(dim=1) -> {tuple((q * F.one_hot(a, 4)).sum(dim=1).shape)}")


def recsys():
    dist = torch.distributions.Categorical(logits=torch.randn(128, 5))
    print(f"  log_prob of (128, 1) actions -> {tuple(dist.log_prob(torch.zeros(128, 1, dtype=torch.long)).shape)}; "
          f"of (128,) -> {tuple(dist.log_prob(torch.zeros(128, dtype=torch.long)).shape)}")


def battery():
    out = nn.GaussianNLLLoss(reduction="none")(torch.zeros(64, 1), torch.zeros(64), torch.ones(64, 1))
    print(f"  GaussianNLLLoss(mean (64, 1), target (64,), var (64, 1)) per-element loss {tuple(out.shape)}, no error")


def churn():
    kw, (x, t, e) = _first_batch(cases_shapes.y_churn_cox_event_column)
    print(f"  event {tuple(e.shape)} x partial ({len(t)},) -> {tuple((torch.zeros(len(t)) * e).shape)}; "
          f"censored share in the batch {1 - e.float().mean():.2f}")


def inventory():
    r = torch.ones(1, 30)
    blog = cases_targets.discount_rewards_blog(r, 0.9)[0]
    rtg = cases_targets.reward_to_go(r, 0.9)[0]
    print(f"  all-ones rewards: blog G_0={blog[0]:.2f} G_20={blog[20]:.3f} G_29={blog[29]:.3f}; "
          f"reward-to-go G_0={rtg[0]:.2f} G_20={rtg[20]:.2f} G_29={rtg[29]:.2f}")


def lander():
    st, a, r, nx, done = cases_targets._LANDER.transitions(3000, s=71)
    print(f"  {int(done.sum())} of 3000 transitions end in a terminal state; their target keeps gamma * max Q(s')")


def relapse():
    terms = torch.arange(10.0)
    event = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0, 0, 1])
    print(f"  terms[event] with int64 event -> {terms[event].tolist()} ; terms[event.bool()] -> "
          f"{terms[event.bool()].tolist()}")


def labreport():
    y = torch.tensor([[0, 1, 0, 0, 1, 0]])
    idx = cases_targets.multi_hot_to_indices(y)
    print(f"  multi-hot {y.tolist()} read as indices -> positives {{0, 1}}; index form {idx.tolist()}")


def severity():
    print(f"  sorted(set(grades)) = {sorted(set(cases_targets._GRADES))} (true order {cases_targets._GRADES})")


def pump():
    kw = cases_trained.y_pump_distiller_optimizes_teacher()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  teacher parameters in the optimizer: "
          f"{sum(id(p) in held for p in kw['model'].teacher.parameters())} of 2")


def pricing():
    v = torch.tensor([0.0], requires_grad=True)
    logp = torch.tensor([-1.2])
    (-(logp * (torch.tensor([1.0]) - v))).sum().backward()
    print(f"  d(actor loss)/dV without detach = {v.grad.item():.2f} (with detach: 0)")


def pk():
    m = cases_trained.EliminationPINN(fixed=False)
    print(f"  k in model.parameters(): {any(p is m.k for p in m.parameters())}; k.requires_grad={m.k.requires_grad}")


def birdcall():
    kw = cases_trained.y_birdcall_arcface_centres_not_optimized()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    w = F.normalize(kw["loss_fn"].W.detach(), dim=1)
    cos = (w @ w.T).fill_diagonal_(-1)
    print(f"  ArcFace W in the optimizer: {id(kw['loss_fn'].W) in held}; closest pair of random centres "
          f"{torch.rad2deg(torch.acos(cos.max())).item():.1f} degrees apart")


def ik():
    m = cases_trained.MDN(fixed=False)
    x = torch.zeros(2, 1)
    a, b = m(x)[0], m(x)[0]
    print(f"  two forward calls, same input: mixing logits differ by {(a - b).abs().max().item():.3f}; "
          f"parameters: {sum(p.numel() for p in m.parameters())}")


def maze():
    net = nn.Linear(3, 2)
    before = net.weight.clone()
    net.load_state_dict(net.state_dict())
    print(f"  target.load_state_dict(target.state_dict()) changes the target: {not torch.equal(before, net.weight)}")


def route():
    print("  loss = log_prob * advantage: its gradient step raises log_prob where advantage < 0")


def release():
    t = torch.rand(5, 1, requires_grad=True)
    u = nn.Linear(1, 1)(t)
    d = torch.autograd.grad(u, t, torch.ones_like(u), retain_graph=True)[0]
    d2 = torch.autograd.grad(u, t, torch.ones_like(u), create_graph=True)[0]
    print(f"  without create_graph: du/dt.requires_grad={d.requires_grad}; with: {d2.requires_grad}")


def sleep():
    print("  soft-target gradients scale as 1/T**2: at T=6 the KL term is 36x weaker than with the T**2 factor")


def promo():
    print("  + beta * entropy: gradient descent lowers the entropy (the bonus should be subtracted)")


def hvac():
    kw = cases_data.y_hvac_replay_buffer_aliases_obs()
    obs = kw["train_loader"].dataset.tensors[0]
    print(f"  distinct stored states: {len(torch.unique(obs, dim=0))} of {len(obs)} rows")


def drone():
    kw = cases_data.y_drone_next_state_overwrites_state()
    obs, nobs = kw["train_loader"].dataset.tensors[0], kw["train_loader"].dataset.tensors[3]
    print(f"  rows with state == next_state: {int((obs == nobs).all(1).sum())} of {len(obs)}")


def blade():
    kw = cases_data.y_blade_triplet_batches_without_positives()
    _, y = next(iter(kw["train_loader"]))
    with_pos = ((y[:, None] == y[None, :]).sum(1) > 1).float().mean()
    print(f"  first shuffled batch: {with_pos:.2f} of anchors have a positive")


def discharge():
    _, rb = cases_data._export(1000, 243, drop="asthma")
    print(f"  export B classes_: {sorted({t for r in rb for t in r})} (export A has {len(cases_data._TAGS)})")


def adtte():
    _, _, cnsr, _ = cases_data._adtte()
    print(f"  CNSR = 1 (censored) share {cnsr.mean():.2f}: those rows are used as events")


for name, fn in {
    "y_dispatch_td_value_column_vs_target_vector": dispatch, "y_warehouse_dqn_qsa_summed_over_batch": warehouse,
    "y_recsys_logprob_action_column": recsys, "y_battery_gaussian_nll_target_vector": battery,
    "y_churn_cox_event_column": churn, "y_inventory_reinforce_discount_from_episode_start": inventory,
    "y_lander_dqn_no_done_mask": lander, "y_relapse_cox_event_int_index": relapse,
    "y_labreport_multilabel_margin_multihot": labreport, "y_severity_ordinal_alphabetical_codes": severity,
    "y_pump_distiller_optimizes_teacher": pump, "y_pricing_a2c_advantage_not_detached": pricing,
    "y_pk_pinn_rate_plain_tensor": pk, "y_birdcall_arcface_centres_not_optimized": birdcall,
    "y_ik_mdn_mixing_layer_in_forward": ik, "y_maze_dqn_target_copies_itself": maze,
    "y_route_reinforce_missing_minus": route, "y_release_pinn_grad_without_create_graph": release,
    "y_sleep_distill_missing_t_squared": sleep, "y_promo_entropy_bonus_wrong_sign": promo,
    "y_hvac_replay_buffer_aliases_obs": hvac, "y_drone_next_state_overwrites_state": drone,
    "y_blade_triplet_batches_without_positives": blade, "y_discharge_tags_binarizer_per_export": discharge,
    "y_adtte_cnsr_used_as_event": adtte,
}.items():
    FIXES[name]["fact"] = fn
