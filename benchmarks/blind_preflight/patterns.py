"""Check a set's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence and
none of the generic warnings below (what a checker says about a run without naming a set's causes). Sets i-k call
``check_patterns(load_all())`` from their own ``check_patterns.py``."""

from __future__ import annotations

import re

GENERIC_WARNINGS = [
    "The learning rate 0.1 looks too high: the loss diverged within 20 steps; lower it by 10x.",
    "The learning rate is too high for Adam; try 1e-3.",
    "Loss is NaN at step 3.",
    "The loss became NaN or inf during the overfit test.",
    "The training DataLoader does not shuffle; pass shuffle=True to the training DataLoader you train with.",
    "The model is in eval mode; call model.train() before training.",
    "All targets in the first batch are the same class (single-class targets).",
    "The targets contain a single class: the classifier cannot learn anything but the prior.",
    "Predictions (32, 1) and targets (32,) are broadcast by the loss to (32, 32); squeeze the predictions.",
    "Shape mismatch between output and target; reshape with .view(-1) or unsqueeze(1).",
    "Some parameters are frozen (requires_grad=False) and will not be updated by the optimizer.",
    "3 parameter tensors are frozen; make sure this is intended.",
    "Class imbalance: the majority class is 90% of the labels; consider class weights or pos_weight.",
    "Use BCEWithLogitsLoss(pos_weight=...) to handle the imbalanced binary labels.",
    "Consider data augmentation to reduce overfitting.",
    "Augmentation looks too strong: the augmented inputs barely resemble the originals.",
    "Weight decay 0.1 is high for Adam; consider AdamW with decoupled weight decay.",
    "Gradient clipping is not enabled; consider clip_grad_norm=1.0.",
    "Gradient clipping is off (clip_grad_norm=None); transformers usually train with 1.0.",
    "Gradients were clipped at 0.5 in the last 10 steps.",
    "The gradient norm exploded to 1e6 at step 10.",
    "The loss did not decrease during the overfit test on a single batch.",
    "The model could not overfit a single batch in 50 steps.",
    "The loss did not decrease in the first 50 steps.",
    "The learning rate is very low (1e-7); the weights barely move.",
    "Validation loss is much higher than training loss: the model overfits.",
    "Inputs are not normalised: feature scales differ by 1000x; standardise the inputs.",
    "Input features contain NaN values.",
    "Dropout 0.5 may be too strong for such a small model.",
    "The validation set overlaps the training set (duplicate rows).",
    "Labels look unrelated to the inputs: accuracy stays at chance.",
    "Batch size 2 is very small; BatchNorm statistics will be noisy.",
    "The optimizer does not contain all model parameters.",
    "Some parameters receive no gradient (grad is None) after backward.",
    "Mixed precision (bf16) may lose precision for large values.",
    "The scheduler is stepped before the optimizer.",
    "Consider a learning-rate warmup for transformers.",
    "Training loss plateaued after 100 steps.",
    "The model output is constant across inputs.",
    "Loss is not decreasing; check the learning rate.",
    "The first-step loss 2.3 matches log(num_classes), as expected.",
    "Targets are out of range for the number of classes; class indices must be in [0, C).",
    "The loss function receives probabilities instead of logits.",
    "Target values are very large; consider standardising the targets.",
    "The label distribution differs between train and validation.",
    "The DataLoader has num_workers=0; data loading may be a bottleneck.",
    "The model has 10M parameters and may overfit this small dataset.",
    "Batches contain duplicate samples.",
    "Gradient accumulation over 4 steps: the effective batch size is 128.",
    "No GradScaler is used with fp16; gradients may underflow.",
    "Use channels_last memory format for faster convolutions.",
    "The loss is computed with the model in eval mode.",
    "The weights did not change after the optimizer step.",
    "Momentum 0.9 with lr 0.1 may be unstable.",
    "Padding tokens are included in the loss; set ignore_index=-100.",
    "The first layer receives very small gradients (vanishing gradients).",
    "Labels are imbalanced within each batch.",
    "The optimizer has 2 param groups with lr 1e-3 and 1e-4.",
    "Use a fully connected head with dropout.",
    "Consider torch.compile for speed.",
]


def check_patterns(cases: dict) -> int:
    """Print each broken case whose pattern misses its own bug or matches a generic warning; 1 if any."""
    bad = 0
    for name, c in cases.items():
        if c.healthy:
            continue
        pattern = re.compile(c.cause_pattern, re.IGNORECASE)
        own = bool(pattern.search(c.bug))
        hits = [s for s in GENERIC_WARNINGS if pattern.search(s)]
        if not own or hits:
            bad += 1
            print(f"{name}: own bug {'matches' if own else 'DOES NOT match'}; generic hits: {hits}")
    n = sum(not c.healthy for c in cases.values())
    print(f"{n - bad}/{n} patterns match their own bug and none of {len(GENERIC_WARNINGS)} generic warnings")
    return 1 if bad else 0

