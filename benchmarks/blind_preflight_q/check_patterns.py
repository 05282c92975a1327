"""Check set q's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence and
none of set a's 60 generic warnings (benchmarks/blind_preflight/patterns.py), and must match two hand-written
paraphrases of a correct diagnosis (written as a checker might phrase its message or its fix).

    .venv/bin/python -m benchmarks.blind_preflight_q.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_q.registry import load_all

PARAPHRASES = {
    "led_color_reshape_hwc": (
        "The input images look channels-last (N, H, W, C) data that was reshaped to (N, C, H, W); use "
        "permute(0, 3, 1, 2) instead of reshape.",
        "Colour channels are scrambled: the batch was produced with .reshape() on HWC arrays rather than transposed."),
    "clickstream_padding_mask_inverted": (
        "src_key_padding_mask is True on the real tokens: PyTorch masks positions where it is True, so pass "
        "attention_mask == 0 instead.",
        "The encoder attends only to padding; the padding mask appears inverted relative to the HF convention."),
    "vibration_lstm_not_batch_first": (
        "nn.LSTM expects (seq_len, batch, features) but receives (batch, time, features); set batch_first=True.",
        "The LSTM's recurrence runs across the batch: the batch dimension is treated as the time axis."),
    "transactions_attention_softmax_singleton": (
        "torch.softmax is applied over a size-1 dimension (dim=-1 on scores of shape (B, T, 1)); all attention "
        "weights are 1.0.",
        "Attention weights are all exactly 1: the softmax should run over the transactions axis (dim=1)."),
    "clip_normalize_batch_dim": (
        "F.normalize is called with dim=0, normalizing across the batch; embeddings are not unit vectors. Use "
        "dim=-1.",
        "The L2 normalisation runs over the batch dimension instead of the embedding dimension."),
    "lesion_mask_255_bce": (
        "BCEWithLogitsLoss targets contain 255; binary targets must lie in [0, 1] (divide the masks by 255).",
        "Target values exceed [0, 1]: the masks are 0/255, not binary, so the loss is unbounded below."),
    "news_nllloss_raw_logits": (
        "NLLLoss expects log-probabilities but receives raw logits; add log_softmax or use CrossEntropyLoss.",
        "The loss is negative and decreasing without bound: nll_loss is fed outputs that are not log_softmax."),
    "signature_contrastive_label_flipped": (
        "The contrastive loss treats y=0 as a similar pair but genuine pairs are labelled 1: swap the labels "
        "(use 1 - y).",
        "Label convention is inverted: similar pairs are pushed apart, different-writer pairs pulled together."),
    "heat_load_relu_output": (
        "The model ends in a ReLU, so it cannot predict negative values, yet 50% of the targets are negative.",
        "Output layer ReLU clamps predictions at 0 while the standardized targets go below zero; remove the final "
        "activation."),
    "music_tags_multilabel_ce": (
        "Targets are multi-hot (several labels per sample); CrossEntropyLoss is for single-label problems, use "
        "BCEWithLogitsLoss.",
        "This looks like a multi-label task: target rows sum to more than 1, so use an independent sigmoid per tag."),
    "ctr_fm_factors_plain_tensor": (
        "Attribute V is a tensor with requires_grad=True that is not registered: wrap it in nn.Parameter so the "
        "optimizer sees it.",
        "A plain tensor used in forward is not in model.parameters(); it is never updated by the optimizer."),
    "horizon_heads_list_multiplied": (
        "heads[0] ... heads[5] are the same Linear instance (built with [module] * n); the horizons share weights.",
        "The ModuleList repeats one module object six times (list multiplication); create a new nn.Linear per head."),
    "ecg_model_reinstantiated": (
        "None of the model's parameters are in the optimizer: it was built for a different model instance.",
        "The optimizer references the parameters of an old model object; the model was re-created after the "
        "optimizer."),
    "clinical_embeddings_from_pretrained_frozen": (
        "embedding.weight has requires_grad=False: nn.Embedding.from_pretrained freezes by default; pass "
        "freeze=False.",
        "The embedding layer is frozen, so its randomly initialised rows are never trained."),
    "audio_hook_detached_embedding": (
        "No gradient reaches the encoder: its output is detached in a forward hook before the head uses it.",
        "The encoder's parameters never get a grad; the graph is cut by .detach() between encoder and head."),
    "warmup_lambda_returns_lr": (
        "The LambdaLR lr_lambda must return a multiplicative factor; it returns the learning rate itself, so the "
        "effective lr is 9e-06.",
        "lr_lambda returns an absolute lr (3e-3) instead of a factor; the learning rate is applied twice."),
    "bert_schedule_total_steps_divided_twice": (
        "The scheduler's num_training_steps (10) is much smaller than max_steps (320): the schedule ends at step 10 "
        "and the lr stays 0.",
        "The linear schedule is 10 steps long while the run takes 320 steps; compute num_training_steps as epochs "
        "* len(train_loader)."),
    "adam_eps_tf_inception": (
        "Adam eps=0.1 is larger than the gradient scale; the denominator is dominated by eps and updates are "
        "tiny.",
        "The epsilon of Adam is too large (0.1): set eps back to 1e-8."),
    "yield_clip_norm_from_detr": (
        "Gradients are clipped on every step: the gradient norm is 300x larger than max_norm=0.1.",
        "clip_grad_norm=0.1 is far below the gradient norm (about 30), so all updates are clipped; raise or remove "
        "the clipping threshold."),
    "denoiser_sum_reduction_sgd": (
        "The loss uses reduction='sum', so gradients scale with the number of pixels; use the mean or lower the "
        "learning rate.",
        "Loss summed over all elements instead of averaged: the gradient is 8192x larger than with the mean."),
    "pupil_flip_keypoint_not_mirrored": (
        "The random horizontal flip is applied to the images but not to the keypoint targets; mirror x as 1 - x.",
        "Flipped samples keep their original landmark coordinates, so the targets are not flipped with the image."),
    "fault_sorted_tail_validation": (
        "The dataset is sorted by label and the validation split takes the last 20% without shuffling: class 3 is "
        "absent from the training set.",
        "Class 3 appears only in validation; the training set never sees it. Shuffle before splitting."),
    "robot_demo_obs_aliasing": (
        "All training inputs are identical: the observations were appended as the same numpy array object, "
        "mutated in place; store obs.copy().",
        "Every stored observation aliases one buffer modified in place by the simulator."),
    "load_rows_shuffled_before_windowing": (
        "The time series was shuffled before building the windows, so temporal order is destroyed and targets do "
        "not follow the inputs.",
        "Windows are built from a permuted series: consecutive hours in a window are not adjacent in time any more."),
    "readmission_dropna_features_only": (
        "Labels are misaligned with the features: rows were dropped from X but not from y (y was truncated).",
        "After dropping NaN rows from the features only, the targets are shifted; index y with the same mask."),
}


def check_paraphrases(cases: dict) -> int:
    bad = 0
    for name, c in cases.items():
        if c.healthy:
            continue
        pattern = re.compile(c.cause_pattern, re.IGNORECASE)
        texts = PARAPHRASES.get(name, ())
        misses = [t for t in texts if not pattern.search(t)]
        if len(texts) != 2 or misses:
            bad += 1
            print(f"{name}: {len(texts)} paraphrases, misses: {misses}")
    n = sum(not c.healthy for c in cases.values())
    print(f"{n - bad}/{n} patterns match both hand-written paraphrases of a correct diagnosis")
    return 1 if bad else 0


if __name__ == "__main__":
    cases = load_all()
    sys.exit(check_patterns(cases) | check_paraphrases(cases))
