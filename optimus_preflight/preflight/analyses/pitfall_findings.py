"""The findings for what ``api_pitfalls.PitfallWatch`` recorded: one message and fix per
pitfall, kept apart from the recording so each stays short."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optimus_preflight.preflight.analyses.api_pitfalls import Pitfalls
    from optimus_preflight.preflight.analyses.loss_findings import Finding


def pitfall_findings(found: Pitfalls) -> list[Finding]:
    from optimus_preflight.preflight.analyses.api_pitfalls import OFF_MAP_PEAK, TINY
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    findings = []
    if found.transposed_1d:
        findings.append(Finding(
            "TRANSPOSE_1D", "error",
            f"the step transposes a 1-D tensor with .T (shape {found.transposed_1d[0]}), which returns it unchanged: "
            "labels == labels.T then compares each label with itself, all True, so a same-label (B, B) mask built "
            "that way broadcast against (B, B) scores marks every pair as positive",
            "Build pairwise masks from explicit axes: labels[:, None] == labels[None, :] (or labels.unsqueeze(1) == "
            "labels.unsqueeze(0)); .T only transposes 2-D tensors.",
        ))
    if found.scatter_overwrites is not None:
        name, shape, share = found.scatter_overwrites
        findings.append(Finding(
            "SCATTER_OVERWRITES", "error",
            f"{name} writes values that carry gradients through an index of shape {shape} that sends two or more of "
            f"them to one position ({share:.0%} of the writes land where another already did): scatter and "
            "index_copy keep one value per position (which one is not defined) and drop the rest, so messages "
            "aggregated this way keep one neighbour per node and the others get no gradient",
            "Aggregate with a reduction: out.scatter_add(0, index, messages) or out.index_add(0, dst, messages) "
            "(or scatter_reduce(..., reduce='mean' / 'amax')), never scatter / index_copy.",
        ))
    if found.softmax_spatial_axis is not None:
        name, shape, dim = found.softmax_spatial_axis
        findings.append(Finding(
            "LOSS_NORM_DIM", "error",
            f"{name} runs over dim {dim} (size {shape[dim]}) of a {shape} convolution output, a spatial axis: the "
            f"class scores are normalised across the positions along that axis instead of across the {shape[1]} "
            "classes of dim 1, so no voxel's probabilities sum to 1 and a Dice or cross-entropy term built on them "
            "compares the wrong things",
            f"Normalise over the class axis of (B, C, ...) maps: {name}(logits, dim=1), not dim={dim} (or -1).",
        ))
    if found.meshgrid_default:
        sizes = " x ".join(str(size) for size in found.meshgrid_default[0])
        findings.append(Finding(
            "MESHGRID_INDEXING", "warning",
            f"torch.meshgrid is called without indexing= (grids of {sizes}): torch's default is indexing='ij', where "
            "the first grid varies along the rows, while NumPy's np.meshgrid(xs, ys) is 'xy', where the x grid "
            "varies along the columns. Code written in NumPy's order gets x and y swapped: coordinates read from "
            "such grids (a soft-argmax, a coordinate embedding) come out transposed",
            "Pass the indexing explicitly: torch.meshgrid(xs, ys, indexing='xy') for x along the columns (NumPy's "
            "order), or indexing='ij' with (ys, xs) for row-major grids.",
        ))
    if found.vanishing_targets is not None:
        shape, share, largest = found.vanishing_targets
        findings.append(Finding(
            "TARGET_MAPS_VANISH", "warning",
            f"{share:.0%} of the batch's {shape} target maps peak below {TINY:g} without being zero (the largest value "
            f"in the batch is {largest:.2g}): the targets are practically empty maps, so the model learns to output "
            "zeros everywhere. A Gaussian heatmap drawn with a sigma meant for another unit does this: sigma=0.05 "
            "(for coordinates normalised to [0, 1]) on a grid in pixels makes exp(-d^2 / (2 sigma^2)) vanish at "
            "every pixel",
            "Draw the targets in the grid's own units (sigma of 1-3 pixels for a heatmap in pixels, or scale the "
            "normalised sigma by the map size) and check that each target map peaks near 1.",
        ))
    if found.off_map_targets is not None:
        shape, share, zero = found.off_map_targets
        size = f"{shape[-2]}x{shape[-1]}"
        findings.append(Finding(
            "TARGET_MAPS_VANISH", "warning",
            f"{share:.0%} of the non-empty {shape} target heatmaps peak below {OFF_MAP_PEAK:g} on the border of "
            f"the map ({zero:.0%} are all zero): their Gaussians are centred outside the {size} map, so most "
            "targets are empty or a faint edge and the model learns to output near-zero maps. Keypoints given in "
            "the input image's pixels but drawn on a heatmap at a lower resolution (a stride of 4: a 32x32 input, "
            "an 8x8 map) do this",
            f"Draw each Gaussian at the keypoint's coordinates in the heatmap's own grid: divide by the stride "
            f"(x_map = x * {shape[-1]} / input_width, y_map = y * {shape[-2]} / input_height) before drawing, and "
            "check that each visible keypoint's map peaks near 1.",
        ))
    if found.uniform_noise_target is not None:
        function, drawn, shape = found.uniform_noise_target
        findings.append(Finding(
            "NOISE_NOT_GAUSSIAN", "warning",
            f"{function}'s target is a {shape} tensor drawn in the step with torch.{drawn} (uniform on [0, 1), mean "
            "0.5, never negative): the model is trained to predict uniform noise. A denoising or diffusion objective "
            "(x_t = a * x + s * noise, loss = mse(model(x_t, t), noise)) assumes standard normal noise, which the "
            "forward process and the sampler use: noise drawn with rand_like where randn_like was meant trains a "
            "predictor for a noise law generation never sees",
            f"Draw the noise with torch.randn_like(x) (torch.randn(...)), not torch.{drawn}.",
        ))
    if found.masked_with_zero is not None:
        shape, how = found.masked_with_zero
        findings.append(Finding(
            "MASK_FILLED_WITH_ZERO", "warning",
            f"the {shape} scores going into a softmax are masked with {how}: the masked positions keep score 0, "
            "which the softmax still weights (e^0 is as much as an average score gets), so the padding or the "
            "positions meant to be hidden keep a share of the attention, a large one in short, heavily padded rows",
            "Fill the masked scores with -inf before the softmax: scores.masked_fill(~keep, float('-inf')) (or "
            "torch.finfo(scores.dtype).min), never 0; a 0/1 mask multiplies the weights after the softmax, followed "
            "by renormalising, not the scores.",
        ))
    if found.softmax_off_axis is not None:
        shape, dim, summed = found.softmax_off_axis
        findings.append(Finding(
            "SOFTMAX_OFF_AXIS", "warning",
            f"attention weights of shape {shape} come straight out of a softmax over dim {dim} and are then "
            f"multiplied into a matmul that sums over dim {summed}: each output mixes the values with weights that "
            f"do not sum to 1 over what it sums, while they do over dim {dim}. softmax(q @ k.transpose(-2, -1), "
            "dim=1) on (B, T_queries, T_keys) scores normalises over the queries; averaged over the queries "
            "afterwards, the attention then has no effect at all",
            "Normalise over the axis the matmul sums over, the keys: softmax(scores, dim=-1) before weights @ v "
            f"(dim {summed} of these {shape} weights).",
        ))
    if found.weighted_sum_off_axis is not None:
        shape, softmax_dim, softmax_size, summed, summed_size = found.weighted_sum_off_axis
        findings.append(Finding(
            "SOFTMAX_OFF_AXIS", "warning",
            f"a weighted sum (p * values).sum(dim={summed}) over {summed_size} entries takes its weights p straight "
            f"from a softmax over dim {softmax_dim} (size {softmax_size}): the weights sum to 1 over dim "
            f"{softmax_dim}, not over the {summed_size} entries summed, so the result is no average of the values. "
            f"In a soft-argmax over (N, K, H*W) heatmaps, F.softmax(h, dim=1) normalises across the K keypoints at "
            "each pixel instead of across each heatmap's pixels, and the 'expected coordinates' add up hundreds of "
            "pixels and cannot reach the targets",
            f"Normalise over the axis the sum runs over: F.softmax(h, dim={summed - len(shape)}) (dim=-1 for the "
            "pixels of flattened heatmaps) before (p * grid).sum(-1).",
        ))
    if found.embedding_dim_pooled is not None:
        name, shape = found.embedding_dim_pooled
        findings.append(Finding(
            "EMBEDDING_DIM_POOLED", "warning",
            f"a {name} over the embedding axis (dim 2, the last) of a {shape} embedding lookup (batch, tokens, "
            "embedding): each token's "
            f"{shape[2]}-dim vector is collapsed to one number, where the tokens were to be pooled into a document "
            "vector (dim=1). What the model gets is one value per position, not what the words mean"
            + (f"; it only runs because the sequence length equals the embedding size ({shape[1]})"
               if shape[1] == shape[2] else ""),
            f"Pool over the tokens: e.{name}(dim=1) of the (batch, tokens, {shape[2]}) embeddings (with a padding "
            "mask: (e * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)).",
        ))
    if found.overlap_on_raw_scores is not None:
        shape, low, high = found.overlap_on_raw_scores
        findings.append(Finding(
            "OVERLAP_ON_LOGITS", "error",
            f"a soft overlap loss (Dice, IoU, Tversky) is computed on raw scores: the step multiplies the model's "
            f"{shape} output, which holds values in [{low:.3g}, {high:.3g}] with no sigmoid or softmax in front, with "
            "a 0/1 mask and sums that output alone, as 2 * sum(p * mask) / (sum(p) + sum(mask)) does with "
            "probabilities. On logits sum(p) can be negative: the denominator crosses zero, the loss explodes or "
            "flips sign, and its optimum is no longer the mask",
            "Turn the logits into probabilities first: p = torch.sigmoid(logits) (softmax over the classes for "
            "several), then inter = (p * mask).sum(); dice = (2 * inter + smooth) / (p.sum() + mask.sum() + smooth).",
        ))
    if found.einsum_private is not None:
        equation, letters = found.einsum_private
        findings.append(Finding(
            "EINSUM_NOT_CONTRACTED", "error",
            f"torch.einsum('{equation}') names the axes {letters} in one operand each and nowhere else: einsum sums "
            "each such axis inside its own operand first, so the result is a product of sums, sum(u) * sum(v), not a "
            "dot product. Two letters written for what is one shared axis ('bd,be->b' for the factors of a user "
            "and an item) do this: the interaction cannot be fitted",
            "Use the same letter for the axis the operands share and contract: torch.einsum('bd,bd->b', u, v) (or "
            "(u * v).sum(-1)).",
        ))
    if found.sort_last is not None:
        shape = found.sort_last
        findings.append(Finding(
            "SORT_ALONG_LAST_DIM", "warning",
            f"the step sorts a {shape} tensor along its last dim of {shape[-1]} (torch.sort's default dim=-1), while "
            f"dim 1 holds {shape[1]} entries: the values inside each point (its x, y, z coordinates or channels) are "
            "reordered, so which value was which is lost, where ordering the points (canonicalising a set) was meant",
            "Sort along the points' axis: torch.sort(x, dim=1) by a key, e.g. idx = x[..., 0].argsort(dim=1); "
            "x.gather(1, idx[..., None].expand_as(x)) keeps each point whole.",
        ))
    if found.gather_rows is not None:
        (rows, columns), index = found.gather_rows
        findings.append(Finding(
            "GATHER_ALONG_BATCH", "error",
            f"the step calls gather(0, index) on a ({rows}, {columns}) tensor with a {index} index whose values are "
            f"all below {columns}: along dim 0 each output reads the ROW (sample) the index names, so every sample "
            f"gets the score of one of the batch's first {columns} samples. Per-sample ids (the taken action, the "
            "class) pick a column: q.gather(1, a.unsqueeze(1)), the value of each sample's own action",
            "Gather along dim 1 (the actions or classes): q.gather(1, actions.unsqueeze(1)).squeeze(1), or "
            "q[torch.arange(len(q)), actions].",
        ))
    if found.label_smoothing is not None:
        smoothing, classes = found.label_smoothing
        kept = 1 - smoothing + smoothing / classes
        findings.append(Finding(
            "LABEL_SMOOTHING_TOO_HIGH", "warning",
            f"cross_entropy runs with label_smoothing={smoothing:g} over {classes} classes: the target gives the true "
            f"class {kept:.2f} and spreads the rest over the others, nearly uniform soft targets, so the model is "
            "trained to be unsure and its accuracy suffers. label_smoothing is the share taken from the true class "
            f"(0.1 is usual); a confidence of {smoothing:g} for the true class is label_smoothing={1 - smoothing:.2g}",
            f"Set label_smoothing={1 - smoothing:.2g} (or 0.1): it is the mass moved off the true class, not the "
            "confidence kept on it.",
        ))
    if found.kl_div_mean is not None:
        shape = tuple(found.kl_div_mean)
        findings.append(Finding(
            "KL_DIV_MEAN_REDUCTION", "warning",
            f"kl_div (nn.KLDivLoss) runs with reduction='mean' (its default) on {shape} inputs: 'mean' divides the "
            f"summed divergence by every element, the batch times the {shape[-1]} classes, so the loss and its "
            f"gradients are {shape[-1]} times smaller than the KL divergence per sample and a distillation term "
            "barely trains (torch keeps 'mean' only for backward compatibility)",
            "Use reduction='batchmean' (nn.KLDivLoss(reduction='batchmean')): the sum over classes averaged over "
            "the batch, the KL divergence as defined; scale a distillation term by T**2 as usual.",
        ))
    if found.detached_prediction is not None:
        name, shape = found.detached_prediction
        findings.append(Finding(
            "PREDICTION_DETACHED", "warning",
            f"{name} gets a prediction (its first argument, {shape}) cut from the graph while its target requires "
            "grad: the stop-gradient sits on the wrong side, so the gradient flows only into what produced the "
            "target and pulls it towards the prediction. In TD learning, mse(V(s).detach(), r + gamma * V(s')) "
            "trains V(s') (the bootstrap target, next state) instead of V(s); or input and target were passed in the "
            "wrong order",
            "Detach the target, not the prediction: mse_loss(V(s), (r + gamma * V(s_next)).detach()) (the "
            "semi-gradient); pass criterion(prediction, target) in that order.",
        ))
    if found.teacher_trained is not None:
        findings.append(Finding(
            "TEACHER_TRAINED", "warning",
            f"kl_div's target distribution ({found.teacher_trained}, the teacher's softened probabilities) requires "
            "grad: the distillation term trains the teacher too, dragging it towards the student at every step, so "
            "the targets the student learns from drift away from what the teacher knew (the teacher's weights are in "
            "the optimizer, or its logits are not detached)",
            "Freeze the teacher: compute its logits under torch.no_grad() (or .detach() them), call "
            "teacher.requires_grad_(False) and build the optimizer over the student's parameters only. Mutual "
            "learning that trains both on purpose detaches each peer's target the same way.",
        ))
    if found.kl_div_constant is not None:
        shape, same = found.kl_div_constant
        both = (" and both sides are the same distribution (its value is 0): the teacher's logits are on both sides, "
                "kl_div(F.log_softmax(teacher_logits / T), F.softmax(teacher_logits / T)) where the input should be "
                "the student's" if same else "")
        findings.append(Finding(
            "KL_TERM_CONSTANT", "warning",
            f"a kl_div term of the loss ({shape}) gets no gradient from either side: neither its input nor its target "
            f"depends on a trained parameter{both}. The distillation term is a constant that does not depend on the "
            "student, so the student learns only from the loss's other terms",
            "Give kl_div the student's log-probabilities as its input: F.kl_div(F.log_softmax(student_logits / T, "
            "-1), F.softmax(teacher_logits / T, -1), reduction='batchmean') * T * T, with the teacher's side "
            "detached.",
        ))
    if found.softmax_of_one is not None:
        function, shape, dim = found.softmax_of_one
        findings.append(Finding(
            "LOSS_NORM_DIM", "error",
            f"the step takes a {function} over dim {dim} of a {shape} tensor, a dim of size 1: every value it "
            f"returns is exactly {'1' if function == 'softmax' else '0'}, whatever the input, so whatever it "
            "feeds (a teacher's soft targets, a gate, a class probability) is a constant. A single-logit binary "
            "head turned into a probability with softmax instead of sigmoid does this: every sample is 'positive' "
            "with certainty",
            "For one logit per sample use torch.sigmoid(logit) (and F.binary_cross_entropy_with_logits, or "
            "torch.stack([1 - p, p], -1) for two-class targets); or give the head two outputs and softmax over "
            "them.",
        ))
    if found.peak_below_one is not None:
        shape, high = found.peak_below_one
        findings.append(Finding(
            "TARGET_PEAK_BELOW_ONE", "warning",
            f"the loss picks its positives with target == 1 (gt.eq(1)), but no value of the {shape} soft targets "
            f"equals 1: they reach {high:.3g} at most, so the positive mask is empty and the positive term of the "
            "loss (the focal loss's log(p) at object centres) is never computed; the model is only taught to "
            "predict 0 everywhere. Gaussian heatmaps drawn around a sub-pixel (float) centre peak below 1",
            "Make each object's peak exactly 1: draw the Gaussian around the integer centre cell (cx, cy = "
            "int(x / stride), int(y / stride)) or set heatmap[cy, cx] = 1 after drawing; or pick positives with a "
            "tolerance (gt >= 0.99) or at the map's local maxima.",
        ))
    if found.soft_class_order is not None:
        as_given, renumbered, mapping = found.soft_class_order
        moved = ", ".join(f"{t} -> {c}" for t, c in sorted(mapping.items())[:6])
        findings.append(Finding(
            "SOFT_TARGET_CLASS_ORDER", "warning",
            f"the kl_div term's soft targets (a teacher's probabilities) put their top class on the batch's label in "
            f"{as_given:.0%} of the rows, but in {renumbered:.0%} once their classes are renumbered ({moved}): the "
            "teacher's output columns are in another class order than the student's labels (a teacher trained with "
            "its own label encoding, class_to_idx of another folder tree), so the distillation term pulls the "
            "student towards the wrong classes and fights the hard loss",
            "Reorder the teacher's logit columns into the student's class order before the softmax: "
            "teacher_logits[:, order] with order[i] = the teacher's column of the student's class i.",
        ))
    if found.distance_over_batch is not None:
        reduction, shape = found.distance_over_batch
        findings.append(Finding(
            "DISTANCE_OVER_BATCH", "warning",
            f"the loss {reduction}s a squared (or absolute) difference of two {shape} tensors over dim 0, the batch: "
            f"(a - p).pow(2).{reduction}(0) gives one number per embedding dimension ({shape[1]} of them), not one "
            f"distance per sample ({shape[0]}), so a triplet or contrastive margin compares per-dimension batch totals "
            "and never asks any anchor to be nearer its own positive than its own negative",
            "Reduce over the embedding dimension: (a - p).pow(2).sum(dim=1) (or F.pairwise_distance(a, p)), one "
            "distance per sample, then average the per-sample losses over the batch.",
        ))
    if found.one_label_parts is not None:
        criterion, sizes, label = found.one_label_parts
        findings.append(Finding(
            "TARGET_PARTS_ONE_LABEL", "warning",
            f"{criterion} scores {len(sizes)} groups of pairs concatenated ({' + '.join(str(n) for n in sizes)} rows: "
            f"positives and sampled negatives) against targets concatenated from parts of the same sizes that all "
            f"hold {label:g}: the negatives get the positives' label (ones_like where zeros_like was meant), so the "
            "loss only pushes every score the same way and never separates real pairs (edges, interactions) from "
            "the sampled non-pairs",
            "Label each group for what it is: torch.cat([torch.ones_like(pos_scores), torch.zeros_like(neg_scores)]).",
        ))
    if found.distance_logits is not None:
        shape, source = found.distance_logits
        findings.append(Finding(
            "CONTRASTIVE_LOGITS_ARE_DISTANCES", "warning",
            f"cross_entropy gets {shape} logits that are distances ({source}, scaled but not negated): the softmax "
            "gives the largest probability to the farthest candidate, so the loss rewards a large distance to the "
            "positive (the target column) and a small one to every negative, the opposite of what an InfoNCE / "
            "prototype loss wants: matching pairs are pushed apart",
            "Negate the distances to make them logits: logits = -torch.cdist(z1, z2) / t (or -dist ** 2, as "
            "prototypical networks do), or use similarities: F.normalize(z1) @ F.normalize(z2).T / t.",
        ))
    if found.self_as_negative is not None:
        shape, share = found.self_as_negative
        findings.append(Finding(
            "NEGATIVE_IS_ANCHOR", "warning",
            f"a row-wise min over a {shape} distance table picks the table's zero diagonal in {share:.0%} of the rows: "
            "batch-hard mining takes each anchor's 'hardest negative' as the closest row of the batch without "
            "masking the anchor itself (distance 0) or its own class, so the negative is the anchor or a positive "
            "and the margin loss only pulls, never pushes another class away",
            "Mask before mining: dist.masked_fill(same_class, float('inf')) with same_class = labels[:, None] == "
            "labels[None, :] (the diagonal included), then take dist.min(dim=1) for the hardest negative.",
        ))
    if found.positive_first_arange is not None:
        shape = found.positive_first_arange
        findings.append(Finding(
            "CONTRASTIVE_TARGET_NOT_POSITIVE", "warning",
            f"cross_entropy gets logits {shape} built as cat([l_pos, l_neg], dim=1), the positive key's score in "
            f"column 0 before the {shape[1] - 1} queue negatives, but its labels are torch.arange({shape[0]}), the "
            "in-batch convention: each query is pushed towards queue entry i - 1 (a random negative) instead of "
            "its own key, and away from the key",
            f"With the positive first, every label is 0: labels = torch.zeros({shape[0]}, dtype=torch.long) (MoCo); "
            "keep arange(B) only for a (B, B) in-batch similarity matrix.",
        ))
    if found.mask_keeps_smallest is not None:
        shape, pruned = found.mask_keeps_smallest
        findings.append(Finding(
            "PRUNING_KEEPS_SMALLEST", "warning",
            f"the forward multiplies a trained weight {shape} by a 0/1 mask that zeroes {pruned:.0%} of it, and the "
            "values it keeps are exactly the smallest magnitudes: the magnitude-pruning comparison is the wrong way "
            "round (abs(w) < threshold keeps the small weights and prunes the large ones). Recomputed each step, it "
            "also prunes every weight the optimizer grows, so the layer can only hold near-zero weights",
            "Keep the largest magnitudes: mask = w.abs() > threshold (or torch.nn.utils.prune.l1_unstructured, "
            "which zeroes the smallest).",
        ))
    if found.weight_not_pos_weight is not None:
        value, positives = found.weight_not_pos_weight
        findings.append(Finding(
            "BCE_WEIGHT_NOT_POS_WEIGHT", "warning",
            f"binary_cross_entropy_with_logits gets weight={value:.3g}, one value for every term, not pos_weight, "
            f"while only {positives:.0%} of the targets are positive: weight multiplies the positive and the "
            "negative terms alike, so it only rescales the loss (like a larger learning rate) and leaves the "
            "imbalance as it was; the ratio of negatives to positives belongs in pos_weight",
            f"Pass the ratio as pos_weight instead of weight: nn.BCEWithLogitsLoss(pos_weight=torch.tensor("
            f"[{value:.3g}])) (weight= is for per-element or per-sample weights).",
        ))
    if found.mask_is_parameter is not None:
        shape, zeros = found.mask_is_parameter
        findings.append(Finding(
            "MASK_IS_PARAMETER", "warning",
            f"the forward multiplies a trained weight by a {shape} tensor of 0s and 1s ({zeros:.0%} zeros) that is "
            "itself an nn.Parameter the optimizer holds: a connectivity mask registered as a parameter. The first "
            "step moves its zeros off 0, so the connections it was meant to cut (MADE's autoregressive order, a "
            "pruning pattern) open up and the masked structure is lost",
            "Register the mask as a buffer: self.register_buffer('mask', mask.float()) (it follows .to(device) "
            "and the state_dict, and is never trained), or keep it out of the optimizer with requires_grad=False.",
        ))
    if found.mask_over_inputs is not None:
        shape, zeroed = found.mask_over_inputs
        findings.append(Finding(
            "PRUNING_MASK_OVER_INPUTS", "warning",
            f"the forward multiplies a trained ({shape[0]}, {shape[1]}) weight (out, in) by a 0/1 mask over its "
            f"{shape[1]} input columns that zeroes {zeroed} of them: structured pruning that took one norm per input "
            "column (weight.norm(dim=0)) instead of one per output neuron, so it removes whole input features from "
            "every neuron (on a first layer the network never sees them) rather than pruning neurons",
            "Prune rows, one per output neuron: norms = weight.norm(dim=1, keepdim=True), a mask of shape (out, 1) "
            "(torch.nn.utils.prune.ln_structured(module, 'weight', amount, n=2, dim=0) does this).",
        ))
    if found.two_scales is not None:
        scales = found.two_scales
        (m1, s1), (m2, s2) = scales.first, scales.second
        findings.append(Finding(
            "TARGETS_ON_TWO_SCALES", "warning",
            f"the loss regresses one prediction {scales.shape} ({scales.criterion}) onto two targets that rank the "
            f"samples alike (correlation {scales.correlation:.2f}) but sit in different units: one around {m1:.3g} "
            f"(std {s1:.3g}), the other around {m2:.3g} (std {s2:.3g}). One of them is standardised (z-scored) or "
            "otherwise rescaled (a teacher or auxiliary model fit on normalised targets next to the raw labels), "
            "so the prediction is pulled between two scales and fits neither",
            "Put both targets in the same units before the loss: un-standardise the rescaled one "
            "(t * std + mean with the statistics it was fit on), or standardise the raw labels the same way.",
        ))
    if found.parameter_minus_itself is not None:
        findings.append(Finding(
            "KL_TERM_CONSTANT", "warning",
            f"the loss subtracts a trained parameter ({found.parameter_minus_itself}) from itself: a penalty written "
            "as (p - anchor[name]) whose anchor is the live parameter object, not a copy, is 0 with zero gradient at "
            "every step, so the regulariser (EWC, L2-SP, an anchor to the pretrained weights) never holds the weights "
            "anywhere and the old task is forgotten",
            "Store a detached copy as the anchor when the old task ends: anchor = {n: p.detach().clone() for n, p in "
            "model.named_parameters()}.",
        ))
    if found.kl_div_self is not None:
        findings.append(Finding(
            "KL_TERM_CONSTANT", "warning",
            f"a kl_div term of the loss ({found.kl_div_self}) compares the model's distribution with a detached copy of "
            "that same distribution: its target equals its input exactly, so the term sits at its minimum (0) with "
            "zero gradient at every step. The 'old' or 'teacher' model is the trained model itself (old_model = model "
            "without copy.deepcopy, an EWC / LwF anchor that is the live network), and nothing keeps the old "
            "behaviour",
            "Distil from a frozen snapshot taken before the new training starts: old_model = copy.deepcopy(model)."
            "eval().requires_grad_(False) (and anchors as p.detach().clone()).",
        ))
    if found.kl_div_probabilities is not None:
        findings.append(Finding(
            "KL_DIV_INPUT_NOT_LOG", "error",
            f"kl_div / nn.KLDivLoss gets probabilities as its input ({found.kl_div_probabilities}: every row in [0, 1], "
            "summing to 1), but it expects log-probabilities there: it computes sum(target * (log(target) "
            "- input)), so with probabilities the loss is -sum(p_teacher * p_student) + const, which is lowest for a "
            "one-hot on the target's top class, not for matching the target distribution (and can go below zero)",
            "Pass log-probabilities as the input: kl(F.log_softmax(student_logits / T, -1), F.softmax(teacher_logits / "
            "T, -1)) (the target stays probabilities unless log_target=True).",
        ))
    if found.inverted_corners is not None:
        corners = found.inverted_corners
        findings.append(Finding(
            "BOX_CORNERS_UNORDERED", "warning",
            f"the step reads the {corners.shape} box targets as corners (x1, y1, x2, y2): it subtracts their first "
            f"two columns from the last two, as an IoU, GIoU or area term does, but in {corners.share:.0%} of them "
            "the 'second corner' lies left of or above the first. These boxes are not corners: most likely COCO's "
            "(x, y, width, height) or centre format (cx, cy, w, h), so every such box reads as empty or inverted, "
            "its area clamps to 0 and the IoU never rewards the right prediction",
            "Convert the targets to corners once, in the dataset or before the loss: "
            "torchvision.ops.box_convert(boxes, in_fmt='xywh', out_fmt='xyxy') (or 'cxcywh'), i.e. "
            "torch.cat([b[:, :2], b[:, :2] + b[:, 2:]], 1) for COCO boxes, so the head, the loss and the evaluation "
            "share one format.",
        ))
    if found.cosine_over_broadcast is not None:
        first, second, dim = found.cosine_over_broadcast
        findings.append(Finding(
            "COSINE_OVER_BROADCAST_DIM", "error",
            f"cosine_similarity reduces dim={dim} of a {first} and a {second} input, and along that axis one of them "
            "has size 1 and is broadcast: the cosine is taken along the broadcast axis (one input's value repeated "
            "against the other's values across the batch), not along the feature vectors, so the result is no "
            "matrix of pairwise similarities. F.cosine_similarity(z1[:, None], z2[None]) with the default dim=1 "
            "does this; the (B, B) similarity matrix of an InfoNCE/CLIP loss needs dim=-1",
            "Reduce the feature axis: F.cosine_similarity(z1[:, None, :], z2[None, :, :], dim=-1) gives (B, B); or "
            "F.normalize(z1, dim=-1) @ F.normalize(z2, dim=-1).T.",
        ))
    if found.swapped_arguments is not None:
        name, shape = found.swapped_arguments
        expected = {"kl_div": "kl_div(student_log_probs, teacher_probs): the model's log-probabilities first "
                              "(F.log_softmax(logits / T, -1)), the fixed target distribution second",
                    "nll_loss": "nll_loss(log_probs, labels)",
                    "poisson_nll_loss": "poisson_nll_loss(log_rate, counts)"}.get(
            name, f"{name}(prediction, labels): the model's output first, the 0/1 labels second")
        findings.append(Finding(
            "PREDICTION_DETACHED", "error",
            f"{name} gets its first argument ({shape}) from outside the graph while its second, the target, requires "
            f"grad: the model's output was passed as the target. The two arguments play different parts, so the "
            "criterion computes something else than intended (labels read as logits, a divergence in the other "
            "direction) and the gradient reaches the model only through the target side",
            f"Pass the arguments in the criterion's order: {expected}.",
        ))
    return findings
