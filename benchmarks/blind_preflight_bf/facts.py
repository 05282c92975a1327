"""Facts behind set bf's broken cases, printed without the preflight, and each case's fix registered in FIXES
(the fixed builder, the case's own metric)."""

from __future__ import annotations

import torch

from benchmarks.blind_preflight.fixes import val_acc
from benchmarks.blind_preflight_bf import cases_data as D
from benchmarks.blind_preflight_bf import cases_mechanics as M
from benchmarks.blind_preflight_bf import cases_shapes as S
from benchmarks.blind_preflight_bf import cases_targets as T
from benchmarks.blind_preflight_bf import cases_trained as W
from benchmarks.blind_preflight_bf.registry import (
    collate_graphs,
    fix,
    fixed_of,
    graph_acc,
    hit_at,
    mean_over,
    node_acc,
    rmse,
    small_graphs,
)

HIT10 = hit_at(10, lambda m, u: m.score_all(u))


def _rating_pred(m, b):
    s = m.score(b[0], b[1])
    return s.diagonal() if s.dim() == 2 else s


def _ctr_acc(model, kw):
    return mean_over(model, kw["val_loader"], lambda m, b: (((m(b[0]) > 0).float() == b[1]).sum(), len(b[1])))


def f_bias():
    kw = S.rating_user_bias_broadcast()
    u, i, r = next(iter(kw["train_loader"]))
    print("  fact: score shape", tuple(kw["model"].score(u, i).shape), "vs rating shape", tuple(r.shape))


def f_ones():
    x = torch.zeros(4, 4)
    print("  fact: (zeros(4,4) + ones(4)).count_nonzero() =", int((x + torch.ones(4)).count_nonzero()),
          "vs + eye(4):", int((x + torch.eye(4)).count_nonzero()))


def f_directed():
    m = S.directed_adjacency_not_transposed()["model"]
    mf = S.directed_adjacency_not_transposed(fixed=True)["model"]
    print("  fact: aggregation matrices equal?", bool(torch.equal(m.a, mf.a)))


def f_gru():
    m = S.session_gru_not_batch_first()["model"]
    print("  fact: GRU batch_first =", m.gru.batch_first, "while inputs are (B, T)")


def f_ctr():
    e = torch.arange(2 * 3).reshape(2, 3)  # 2 samples, 3 fields (scalar embeddings)
    print("  fact: stack(dim 0) then reshape(B, -1) rows:", torch.stack([e[:, f] for f in range(3)], 0)
          .reshape(2, -1).tolist(), "vs dim 1:", torch.stack([e[:, f] for f in range(3)], 1).reshape(2, -1).tolist())


def f_link():
    print("  fact: labels of negatives are ones_like -> all targets 1")


def f_nodes():
    kw = T.node_labels_not_gathered_by_mask()
    from benchmarks.blind_preflight_bf.registry import sbm
    _, _, y = sbm(s=7)
    idx, t = kw["train_loader"].dataset.tensors
    print(f"  fact: share of train labels equal to y[idx]: {(t == y[idx]).float().mean():.2f}")


def f_swap():
    print("  fact: -logsigmoid(s_neg - s_pos) decreases as s_pos - s_neg decreases")


def f_zeros_labels():
    print("  fact: in-batch logits q @ k.T have the positive of row r at column r; targets are zeros(B)")


def f_sorted():
    gs = small_graphs(8, s=10)
    x, ei, b, y = collate_graphs(gs, sort_labels=True)
    print("  fact: graph labels", [g["y"] for g in gs], "collated labels", y.tolist())


def f_frozen():
    m = W.mf_tables_from_pretrained_frozen()["model"]
    print("  fact: requires_grad user/item:", m.user.weight.requires_grad, m.item.weight.requires_grad)


def f_nograd():
    m = W.two_tower_item_tower_under_no_grad()["model"]
    print("  fact: item embeddings require grad:", m.items(torch.arange(3)).requires_grad)


def f_offset():
    m = W.joint_table_item_ids_not_offset()["model"]
    print("  fact: item 5 row =", int(m.item_rows(torch.tensor(5))), "= user 5's row")


def f_replaced():
    kw = W.item_table_replaced_after_optimizer()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  fact: new item table in the optimizer:", id(kw["model"].item.weight) in ids)


def f_groups():
    kw = W.param_groups_name_filter_misses_items()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  fact: item table in any param group:", id(kw["model"].item.weight) in ids)


def f_scatter():
    m = M.message_passing_scatter_to_source()["model"]
    src, dst = m.ei
    print("  fact: edges with src != dst:", int((src != dst).sum()), "- scatter index is src")


def f_gat():
    print("  fact: softmax([1, 0, 0, 0]) =", [round(v, 2) for v in torch.softmax(torch.tensor([1., 0, 0, 0]), 0)
                                                .tolist()], "(non-edges masked with 0 keep mass)")


def f_qq():
    print("  fact: with logits q @ q.T the loss has no path to the item tower's parameters")


def f_pool():
    p = torch.zeros(2, 3)
    p.index_add(0, torch.tensor([0, 1]), torch.ones(2, 3))
    print("  fact: after out-of-place index_add the pooled tensor sums to", float(p.sum()))


def f_zero_init():
    m = M.mf_factor_tables_zero_init()["model"]
    s = m.score(torch.tensor([0]), torch.tensor([1]))
    s.sum().backward()
    print("  fact: grad norms user/item:", float(m.user.weight.grad.norm()), float(m.item.weight.grad.norm()))


def f_repeat():
    print("  fact: arange(3).repeat(2) =", torch.arange(3).repeat(2).tolist(), "vs repeat_interleave(2) =",
          torch.arange(3).repeat_interleave(2).tolist())


def f_offset_graph():
    gs = small_graphs(4, s=31)
    _, ei, _, _ = collate_graphs(gs, offset=False)
    print("  fact: max node id in the batch's edge_index:", int(ei.max()), "of", 4 * 10, "nodes")


def f_split():
    kw = D.node_split_by_id_on_class_sorted_graph()
    print("  fact: train classes", kw["train_loader"].dataset.tensors[1].unique().tolist(),
          "val classes", kw["val_loader"].dataset.tensors[1].unique().tolist())


def f_user_range():
    ds = D.bpr_negatives_drawn_from_user_range()["train_loader"].dataset
    print("  fact: max sampled negative id:", max(int(ds[k][2]) for k in range(500)), "of 400 items")


def f_reseed():
    ds = D.bpr_negative_sampler_reseeded_per_item()["train_loader"].dataset
    print("  fact: distinct negatives over 200 triples:", len({int(ds[k][2]) for k in range(200)}))


RMSE = rmse(_rating_pred)
for builder, metric, label, fact, higher in [
    (S.rating_user_bias_broadcast, RMSE, "val RMSE", f_bias, False),
    (S.gcn_self_loops_ones_vector, node_acc, "val acc", f_ones, True),
    (S.directed_adjacency_not_transposed, node_acc, "val acc", f_directed, True),
    (S.session_gru_not_batch_first, val_acc, "next-item acc", f_gru, True),
    (S.ctr_field_embeddings_stacked_on_batch_axis, _ctr_acc, "click acc", f_ctr, True),
    (T.link_pred_negatives_labelled_one, T.link_acc, "pos>neg acc", f_link, True),
    (T.node_labels_not_gathered_by_mask, node_acc, "val acc", f_nodes, True),
    (T.bpr_positive_negative_swapped, HIT10, "HR@10", f_swap, True),
    (T.two_tower_in_batch_labels_zero, HIT10, "HR@10", f_zeros_labels, True),
    (T.graph_labels_sorted_in_collate, graph_acc, "graph acc", f_sorted, True),
    (W.mf_tables_from_pretrained_frozen, HIT10, "HR@10", f_frozen, True),
    (W.two_tower_item_tower_under_no_grad, HIT10, "HR@10", f_nograd, True),
    (W.joint_table_item_ids_not_offset, HIT10, "HR@10", f_offset, True),
    (W.item_table_replaced_after_optimizer, HIT10, "HR@10", f_replaced, True),
    (W.param_groups_name_filter_misses_items, HIT10, "HR@10", f_groups, True),
    (M.message_passing_scatter_to_source, node_acc, "val acc", f_scatter, True),
    (M.gat_non_edges_masked_with_zero, node_acc, "val acc", f_gat, True),
    (M.two_tower_logits_query_against_query, HIT10, "HR@10", f_qq, True),
    (M.graph_pool_index_add_out_of_place, graph_acc, "graph acc", f_pool, True),
    (M.mf_factor_tables_zero_init, HIT10, "HR@10", f_zero_init, True),
    (D.graph_batch_vector_repeat, graph_acc, "graph acc", f_repeat, True),
    (D.graph_edge_index_not_offset, graph_acc, "graph acc", f_offset_graph, True),
    (D.node_split_by_id_on_class_sorted_graph, node_acc, "val acc", f_split, True),
    (D.bpr_negatives_drawn_from_user_range, HIT10, "HR@10", f_user_range, True),
    (D.bpr_negative_sampler_reseeded_per_item, HIT10, "HR@10", f_reseed, True),
]:
    fix(builder.__name__, fixed_of(builder), metric, label, fact, higher=higher)
