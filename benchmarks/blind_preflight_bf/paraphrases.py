"""Two hand-written, generic-wording paraphrases of a correct diagnosis per broken case (each must match the
case's cause_pattern; checked by check_patterns.py)."""

PARAPHRASES = {
    "rating_user_bias_broadcast": [
        "The per-user bias term comes out as a column and broadcasts the predictions to a square matrix; squeeze it.",
        "Predictions become (B, B) because the user bias lookup is not squeezed before adding it to the dot product.",
    ],
    "gcn_self_loops_ones_vector": [
        "Adding a ones vector instead of an identity turns the adjacency into a complete graph, so every node is linked to all others.",
        "The self-loop step broadcasts a vector over all rows; use torch.eye so only the diagonal is set.",
    ],
    "directed_adjacency_not_transposed": [
        "Messages flow against the edge direction: the aggregation gathers each node's successors rather than its predecessors.",
        "The adjacency should be transposed for aggregation, since rows index source nodes and the model needs in-neighbours.",
    ],
    "session_gru_not_batch_first": [
        "The recurrent layer treats the batch as the time axis because batch_first is not set.",
        "Sessions are mistaken for the sequence dimension, so the recurrence runs across the batch instead of over time steps.",
    ],
    "ctr_field_embeddings_stacked_on_batch_axis": [
        "The field embeddings are stacked along the wrong axis, so the reshape mixes rows of different samples.",
        "Reshaping an (F, B, d) tensor to (B, F*d) scrambles samples; stack along dim 1 instead.",
    ],
    "link_pred_negatives_labelled_one": [
        "The negative edges are given positive labels, so the classifier never learns to separate links from non-links.",
        "All pairs have target one: the sampled non-edges should be labelled 0.",
    ],
    "node_labels_not_gathered_by_mask": [
        "The labels are misaligned with the training nodes: they are the first labels of the graph rather than those of the selected nodes.",
        "Index the labels by the same train node ids; currently the targets belong to other nodes.",
    ],
    "bpr_positive_negative_swapped": [
        "The pairwise ranking loss has positive and negative swapped, so observed items are pushed below unobserved ones.",
        "The sign of the score difference is reversed in the BPR objective.",
    ],
    "two_tower_in_batch_labels_zero": [
        "With in-batch negatives the positive sits on the diagonal, so the targets should be arange rather than all zeros.",
        "The labels point every row to column 0, the first item of the batch, instead of the matching item.",
    ],
    "graph_labels_sorted_in_collate": [
        "The collate function reorders the labels relative to the graphs, so each graph is trained with another graph's target.",
        "Graph targets are sorted differently from the concatenated graphs, leaving labels misaligned.",
    ],
    "mf_tables_from_pretrained_frozen": [
        "The embedding tables created from pretrained weights are frozen by default and never updated.",
        "The user and item factors are frozen (freeze defaults to True), so only the biases learn.",
    ],
    "two_tower_item_tower_under_no_grad": [
        "The item tower runs without gradient tracking, so it is never trained and keeps its random weights.",
        "No gradients reach the item side of the two-tower model; the item embeddings stay frozen at init.",
    ],
    "joint_table_item_ids_not_offset": [
        "Item ids index the shared embedding table without an offset, so items collide with user rows.",
        "Users and items share the same rows of the embedding table; shift item ids by the number of users.",
    ],
    "item_table_replaced_after_optimizer": [
        "The item embedding was replaced after the optimizer was created, so the optimizer still holds the old table.",
        "The optimizer was built before the table was resized; the new item embeddings are never updated.",
    ],
    "param_groups_name_filter_misses_items": [
        "The parameter groups are selected by a name prefix that leaves out the item factors.",
        "The item embedding table falls in no param group, so it is never updated and stays at its random init.",
    ],
    "message_passing_scatter_to_source": [
        "Messages are scattered back onto their source node instead of the destination, so neighbours are never aggregated.",
        "Each node aggregates copies of itself because index_add uses the wrong edge endpoint.",
    ],
    "gat_non_edges_masked_with_zero": [
        "Non-edges are masked with zero instead of minus infinity, so attention spreads over all nodes.",
        "The attention mask does not exclude non-neighbours; every node attends to the whole graph.",
    ],
    "two_tower_logits_query_against_query": [
        "The user tower's output is compared with itself, so the loss is trivial and the item tower is never used.",
        "The logits compare each query with itself, so the item side never enters the loss.",
    ],
    "graph_pool_index_add_out_of_place": [
        "The pooling uses the out-of-place variant and discards the result, so the graph embeddings remain zeros.",
        "The readout stays constant because the return value of the scatter-add is thrown away.",
    ],
    "mf_factor_tables_zero_init": [
        "Both factor tables start at all zeros, so their gradients are zero and they never move.",
        "Zero initialisation of user and item embeddings is a symmetric fixed point; use small random values.",
    ],
    "graph_batch_vector_repeat": [
        "The graph assignment vector is built by tiling rather than repeat_interleave, so nodes are pooled into the wrong graphs.",
        "The batch index maps nodes to other graphs, mixing nodes of different graphs in each pooled embedding.",
    ],
    "graph_edge_index_not_offset": [
        "The edge indices of each graph are not shifted by the cumulative node count when batching.",
        "Every edge points into the first graph's nodes because node ids are not renumbered per graph.",
    ],
    "node_split_by_id_on_class_sorted_graph": [
        "The split takes contiguous node ids while nodes are ordered by class, so some classes are unseen in training.",
        "Use a random permutation of node ids for the split; the validation classes are missing from training.",
    ],
    "bpr_negatives_drawn_from_user_range": [
        "Negatives are sampled from the range of user ids, so most items are never used as negatives.",
        "The negative sampler only covers a subset of the catalogue (the first n_users ids).",
    ],
    "bpr_negative_sampler_reseeded_per_item": [
        "The generator is re-seeded on every call, so each example gets the same negative.",
        "Every triple draws an identical negative item because the sampler is reseeded per access.",
    ],
}
