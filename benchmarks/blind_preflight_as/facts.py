"""The fact each broken case of set as rests on, printed by ``verify.py`` before the case is trained next to its fix
(no preflight involved). Importing this module fills ``FIXES[name]["fact"]``."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_as import domains as D
from benchmarks.blind_preflight_as.registry import FIXES, load_all

CASES = load_all()
FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        FIXES[name]["fact"] = fn
        return fn
    return register


def first_batch(name, fixed=False):
    kw = CASES[name].build() if not fixed else FIXES[name]["fixed"]()
    return kw, next(iter(kw["train_loader"]))


@fact("pinn_forcing_broadcast")
def _():
    kw, (x, f) = first_batch("pinn_forcing_broadcast")
    print(f"  fact: u_xx {tuple(x.shape)} - f {tuple(f.shape)} -> residual {tuple((x - f).shape)}")


@fact("operator_channels_last_view")
def _():
    g = torch.arange(2 * 6).reshape(1, 6, 2).float()       # (B, N, C): channel 0 = even numbers
    print(f"  fact: view -> channel 0 {g.view(1, 2, 6)[0, 0].tolist()}; permute -> {g.permute(0, 2, 1)[0, 0].tolist()}")


@fact("dqn_gather_broadcast")
def _():
    q, y = torch.zeros(64, 1), torch.zeros(64)
    print(f"  fact: gathered Q {tuple(q.shape)} - TD target {tuple(y.shape)} -> {tuple((q - y).shape)}")


@fact("bpr_user_column_broadcast")
def _():
    kw, (u, p, q) = first_batch("bpr_user_column_broadcast")
    print(f"  fact: users {tuple(u.shape)}, items {tuple(p.shape)} -> scores {tuple(kw['model'](u, p).shape)}")


@fact("bc_gru_seq_first")
def _():
    kw, (x, y) = first_batch("bc_gru_seq_first")
    print(f"  fact: window batch {tuple(x.shape)} (B, T, d); gru.batch_first = {kw['model'].gru.batch_first}")


@fact("dqn_no_terminal_mask")
def _():
    *_, done = D.chain_transitions()
    print(f"  fact: {int(done.sum())} of {len(done)} logged transitions end the episode; their targets bootstrap anyway")


@fact("bc_tanh_unscaled_actions")
def _():
    kw, (x, y) = first_batch("bc_tanh_unscaled_actions")
    print(f"  fact: expert actions in [{y.min():.2f}, {y.max():.2f}]; policy ends in tanh, range [-1, 1]")


@fact("bpr_sign_flipped")
def _():
    pos, neg = torch.tensor(2.0), torch.tensor(-2.0)
    print(f"  fact: correct ranking (pos 2 > neg -2) costs {-F.logsigmoid(neg - pos).item():.3f} under the written "
          f"loss, the reversed one {-F.logsigmoid(pos - neg).item():.3f}")


@fact("surrogate_unscaled_channels")
def _():
    kw, (x, y) = first_batch("surrogate_unscaled_channels")
    print(f"  fact: target std per channel (pressure, velocity) = {y.transpose(0, 1).reshape(2, -1).std(1).tolist()}")


@fact("pinn_poisson_sign")
def _():
    x = torch.linspace(0.1, 0.9, 5).unsqueeze(1)
    q = -D.poisson_forcing(x)
    print(f"  fact: exact u'' + q = {float((D.poisson_forcing(x) + q).abs().max()):.1e}; u'' - q = "
          f"{float((D.poisson_forcing(x) - q).abs().max()):.2f} (the written residual is not zero at the solution)")


@fact("pinn_second_grad_no_create_graph")
def _():
    x = torch.rand(8, 1).requires_grad_(True)
    u = D.pinn_mlp()(x)
    u_x = torch.autograd.grad(u, x, torch.ones_like(u), create_graph=True)[0]
    u_xx = torch.autograd.grad(u_x, x, torch.ones_like(u_x))[0]
    print(f"  fact: u_xx without create_graph: requires_grad={u_xx.requires_grad}, grad_fn={u_xx.grad_fn}")


@fact("pinn_inverse_coeff_not_in_optimizer")
def _():
    kw = CASES["pinn_inverse_coeff_not_in_optimizer"].build()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  fact: log_kappa in optimizer: {id(kw['model'].log_kappa) in in_opt}")


@fact("rec_item_from_pretrained_frozen")
def _():
    kw = CASES["rec_item_from_pretrained_frozen"].build()
    print(f"  fact: item.weight.requires_grad = {kw['model'].item.weight.requires_grad}")


@fact("fno_spectral_python_list")
def _():
    kw = CASES["fno_spectral_python_list"].build()
    m = kw["model"]
    print(f"  fact: spectral is {type(m.spectral).__name__}; parameters counted {sum(p.numel() for p in m.parameters())}, "
          f"spectral weights {sum(s.weight.numel() for s in m.spectral)} outside")


@fact("bc_log_std_plain_tensor")
def _():
    kw = CASES["bc_log_std_plain_tensor"].build()
    names = [n for n, _ in kw["model"].named_parameters()]
    print(f"  fact: 'log_std' in named_parameters: {'log_std' in names}")


@fact("pinn_relu_activation")
def _():
    x = torch.rand(16, 1).requires_grad_(True)
    u = D.pinn_mlp(nn.ReLU)(x)
    u_xx = D.d_dx(D.d_dx(u, x), x)
    print(f"  fact: ReLU network u_xx max |.| = {u_xx.abs().max().item():.1e}")


@fact("dqn_target_sync_reversed")
def _():
    kw = CASES["dqn_target_sync_reversed"].build()
    m, loss = kw["model"], kw["loss_fn"]
    before = copy.deepcopy(m.state_dict())
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)
    loss.sync(m)
    print(f"  fact: after a sync the online weights equal their initial values: "
          f"{all(torch.equal(before[k], v) for k, v in m.state_dict().items())}")


@fact("dqn_target_never_synced")
def _():
    kw = CASES["dqn_target_never_synced"].build()
    m, loss = kw["model"], kw["loss_fn"]
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)
    loss.sync(m)
    same = all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), loss.target.state_dict().values()))
    print(f"  fact: after a sync target == online: {same}")


@fact("surrogate_lr_decay_per_step")
def _():
    kw = CASES["surrogate_lr_decay_per_step"].build()
    for _ in range(100):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print(f"  fact: LR after 100 batches: {kw['optimizer'].param_groups[0]['lr']:.2e} (from 2e-3)")


@fact("rec_zero_init_embeddings")
def _():
    kw, (u, p, q) = first_batch("rec_zero_init_embeddings")
    loss = kw["loss_fn"](kw["model"], (u, p, q))
    loss.backward()
    print(f"  fact: loss {loss.item():.4f}; |grad| user {kw['model'].user.weight.grad.abs().max().item()}, "
          f"item {kw['model'].item.weight.grad.abs().max().item()}")


@fact("bc_action_shifted")
def _():
    states, actions = D.expert_trajectories(n_traj=100, length=40, s=0)
    w = torch.randn(6, 4, generator=D.gen(999))
    print(f"  fact: expert(s_t) == a_t: {((states @ w).argmax(-1) == actions).float().mean():.2f}; "
          f"expert(s_t) == a_t+1: {((states[:, :-1] @ w).argmax(-1) == actions[:, 1:]).float().mean():.2f}")


@fact("dqn_next_state_rolled")
def _():
    from benchmarks.blind_preflight_as.cases_data import logged_episodes
    obs, *_ = logged_episodes(3, 0)
    print(f"  fact: roll(obs, 1)[5] is obs[4]: {torch.equal(torch.roll(obs, 1, 0)[5], obs[4])}")


@fact("rec_neg_sampler_wrong_range")
def _():
    kw = CASES["rec_neg_sampler_wrong_range"].build()
    negs = torch.tensor([kw["train_loader"].dataset[i][2] for i in range(len(kw["train_loader"].dataset))])
    print(f"  fact: largest sampled negative id {negs.max().item()} of {kw['model'].item.num_embeddings} items")


@fact("pinn_collocation_unscaled")
def _():
    kw, (x,) = first_batch("pinn_collocation_unscaled")
    print(f"  fact: collocation x in [{x.min():.2f}, {x.max():.2f}], domain [0, 3]")


@fact("surrogate_per_sample_norm")
def _():
    kw = CASES["surrogate_per_sample_norm"].build()
    ds = kw["train_loader"].dataset
    a = ds.a[0]
    x1, _ = ds[0]
    ds.a = torch.stack([a * 3] + [ds.a[i] for i in range(1, 3)])
    x3, _ = ds[0]
    print(f"  fact: input of a and of 3a identical: {torch.allclose(x1, x3, atol=1e-5)}")
