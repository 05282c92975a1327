"""Check set r's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence,
none of set a's 60 generic warnings, and both hand-written paraphrases of a correct diagnosis below.

    .venv/bin/python -m benchmarks.blind_preflight_r.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_r.registry import load_all

PARAPHRASES = {
    "har_lstm_seq_first": [
        "The LSTM expects (seq_len, batch, features) but receives batch-major input; pass batch_first=True.",
        "nn.LSTM recurs over the batch dimension: the batch axis is treated as time."],
    "kws_spectrogram_view_not_transpose": [
        "spec.view(b, 24, 16) instead of spec.transpose(1, 2) scrambles the mel bins and frames.",
        "The reshape mixes frequency and time: use permute(0, 2, 1), not view, to put frames first."],
    "sentiment_conv1d_channels_are_tokens": [
        "Conv1d expects (batch, channels, length); permute the embeddings with permute(0, 2, 1) before the convolution.",
        "in_channels equals the sequence length: token positions are treated as channels."],
    "landcover_logits_view_without_permute": [
        "logits.view(-1, num_classes) on an NCHW tensor: permute(0, 2, 3, 1) first so the class dimension is last.",
        "The flattened logits do not line up with the targets because the class dimension was not moved last."],
    "plankton_hwc_reshape_not_permute": [
        "Images were reshaped from NHWC to NCHW instead of permuted; use permute(0, 3, 1, 2).",
        "HWC numpy arrays converted with reshape rather than transpose: the RGB channels are interleaved."],
    "traffic_forecast_target_not_shifted": [
        "The target is the last value of the input window; shift the target by one step.",
        "Labels are not shifted: y equals x[:, -1], so the model copies its last input."],
    "garment_nllloss_on_raw_logits": [
        "NLLLoss expects log-probabilities; apply log_softmax to the outputs or use CrossEntropyLoss.",
        "The model returns raw logits to NLLLoss, so the loss is unbounded below."],
    "lesion_mask_0_255_bce": [
        "BCEWithLogitsLoss targets have values up to 255; divide the masks by 255.",
        "Targets outside [0, 1]: the masks are 0/255, normalise the masks to {0, 1}."],
    "genre_multilabel_crossentropy": [
        "Targets are multi-hot (several labels per row) but CrossEntropyLoss assumes mutually exclusive classes; use BCEWithLogitsLoss.",
        "Multi-label targets trained with softmax cross-entropy instead of binary cross-entropy."],
    "birds_labelencoder_refit_on_val": [
        "The LabelEncoder was fit separately on the validation split, giving a different label mapping.",
        "Class ids differ between train and validation: the encoder was refit on each split."],
    "xray_head_replaced_after_optimizer": [
        "model.head was replaced after the optimizer was created; the new head is not in the optimizer.",
        "The optimizer still holds the old head's parameters; build it after swapping the classifier."],
    "ecg_checkpoint_module_prefix_strict_false": [
        "load_state_dict(strict=False) matched none of the keys: the checkpoint keys start with 'module.'.",
        "The pretrained checkpoint was silently not loaded (all keys missing), so the frozen encoder is random."],
    "citation_gcn_numpy_roundtrip_in_forward": [
        "forward converts activations to numpy and back, which breaks the computational graph; l1 gets no gradient.",
        "A .detach() inside forward cuts the autograd graph before the first layer."],
    "recsys_user_table_plain_tensor": [
        "self.user is a plain tensor, not an nn.Parameter, so it never reaches the optimizer.",
        "The user embedding is not registered as a parameter: wrap it in nn.Parameter or use nn.Embedding."],
    "sensor_head_requires_grad_attribute": [
        "model.head.requires_grad = True only sets an attribute on the module; call model.head.requires_grad_(True).",
        "The head still has requires_grad=False on its weight and bias: the classifier remains frozen."],
    "house_lambdalr_returns_lr_not_factor": [
        "LambdaLR's lr_lambda must return a multiplicative factor, not the learning rate itself.",
        "The scheduler multiplies the base lr by 1e-2: the lambda returns an absolute LR instead of a factor."],
    "digits_dropout_keep_prob_0_9": [
        "nn.Dropout(0.9) drops 90% of activations; PyTorch's p is not TensorFlow's keep_prob.",
        "Dropout p is the probability of zeroing an element, so 0.9 zeroes 90% of units; use p=0.1."],
    "churn_all_weights_zero_init": [
        "All weights are initialised to zero: hidden units stay identical, the symmetry is never broken.",
        "nn.init.zeros_ on every Linear weight; use xavier_uniform_ or the default init."],
    "airquality_mse_reduction_sum_sgd": [
        "MSELoss(reduction='sum') makes the gradient scale with the batch size; use reduction='mean'.",
        "The loss is summed over the batch, so the SGD step is batch_size times too large."],
    "vibration_functional_dropout_training_true": [
        "F.dropout is called with training=True, so dropout is still active in eval mode; pass training=self.training.",
        "Functional dropout stays on at inference: the evaluation outputs are random."],
    "signs_val_pixels_not_scaled": [
        "Validation images are not divided by 255 while training images are.",
        "The validation inputs were never normalized: apply the same scaling to the validation set."],
    "arrows_horizontal_flip_swaps_label": [
        "RandomHorizontalFlip mirrors left/right arrows without changing the label.",
        "The flip augmentation swaps the class: a horizontally flipped left arrow points right."],
    "claims_get_dummies_per_split": [
        "pd.get_dummies on each split produces different columns; reindex the validation columns to the training ones.",
        "One-hot columns are misaligned between train and validation because the encoding was done separately."],
    "faults_sorted_rows_split_without_shuffle": [
        "The data is sorted by class and split without shuffling: one class is never seen in training.",
        "train_test_split(shuffle=False) on label-ordered rows; shuffle or stratify the split."],
    "soil_val_standardised_with_own_stats": [
        "The validation set was standardised with its own mean and std instead of the training statistics.",
        "The scaler was refit on the validation data (fit_transform on val); use the training mean."],
}


def check_paraphrases(cases: dict) -> int:
    bad = 0
    for name, c in cases.items():
        if c.healthy:
            continue
        pattern = re.compile(c.cause_pattern, re.IGNORECASE)
        misses = [p for p in PARAPHRASES.get(name, ["<none>", "<none>"]) if not pattern.search(p)]
        if misses:
            bad += 1
            print(f"{name}: paraphrases not matched: {misses}")
    n = sum(not c.healthy for c in cases.values())
    print(f"{n - bad}/{n} patterns match both hand-written paraphrases")
    return 1 if bad else 0


if __name__ == "__main__":
    cases = load_all()
    sys.exit(check_patterns(cases) | check_paraphrases(cases))
