"""Two hand-written paraphrases per broken case of set bd: how a correct diagnosis could be worded by a checker
that does not know this set's words (generic wording, no case names). check_patterns.py requires each case's
cause_pattern to match both."""

PARAPHRASES = {
    "seg_hwc_to_chw_transpose_swaps_hw": [
        "The input images appear transposed relative to their masks: the height and width axes were swapped when "
        "converting from HWC to CHW.",
        "Image/label spatial alignment check failed: the image matches the mask only after swapping H and W; use "
        "permute(2, 0, 1) rather than transpose(2, 1, 0).",
    ],
    "seg_channels_last_logits_reshaped_not_permuted": [
        "The model output is produced channels-last (N, H, W, C) and then reshaped to (N, C, H, W); reshape does not "
        "move the class axis, so class scores are interleaved across pixels. Use permute(0, 3, 1, 2).",
        "Logits are reinterpreted rather than transposed: a view from NHWC to NCHW scrambles per-pixel class scores.",
    ],
    "kp_heatmap_flat_index_x_times_w": [
        "The target index for the flattened heatmap uses x * W + y, but flatten is row-major (y * W + x); the "
        "keypoint targets point at the transposed cell.",
        "Heatmap targets have x and y swapped: the flat position of the label does not follow the row-major layout "
        "of the flattened map.",
    ],
    "box_list_collated_then_reshaped": [
        "Box targets are scrambled across samples: the default collate turned each per-sample list into a list of "
        "4 tensors of shape (N,), and reshaping their stack mixes coordinates of different images.",
        "The target tensor is built from a (4, N) stack read as (N, 4); stack the coordinates with dim=1 or return the "
        "box as a tensor from the Dataset.",
    ],
    "cox_risk_column_times_event_row": [
        "The risk scores have shape (N, 1) and the event indicator (N,): their product broadcasts to (N, N), so the "
        "censoring indicator has no effect on the partial likelihood.",
        "Broadcasting in the survival loss: every subject is counted as an event because the event mask is "
        "multiplied against a column vector. Squeeze the model output.",
    ],
    "seg_background_passed_as_ignore_index": [
        "ignore_index=0 is the background class: background pixels never contribute to the loss, so the model can "
        "never predict background.",
        "Class 0 is excluded from the cross-entropy; since 0 labels most pixels (background), the network is never "
        "trained to output it.",
    ],
    "box_coco_xywh_into_xyxy_giou": [
        "Box format mismatch: targets look like [x, y, width, height] (COCO) but the loss treats them as corner "
        "coordinates (x1, y1, x2, y2); many targets are degenerate boxes.",
        "In about half the targets x2 is smaller than x1, which suggests xywh boxes read as xyxy. Convert with "
        "x + w, y + h before the IoU loss.",
    ],
    "centernet_peak_not_divided_by_stride": [
        "The heatmap targets are drawn in input-image coordinates on a downsampled output map: the centre was not "
        "divided by the output stride, so peaks are misplaced or fall off the map.",
        "Target peaks land at twice their correct position on the stride-2 heatmap; scale the object centres to "
        "the output resolution.",
    ],
    "cox_censored_flag_used_as_event": [
        "The event indicator appears inverted: the column used as 'event' is actually the censoring flag, so deaths "
        "are treated as censored observations.",
        "Use 1 - censored as the event status; the survival loss currently counts censored subjects as events.",
    ],
    "box_image_resized_boxes_not": [
        "Images were resized but the bounding box coordinates were not rescaled: normalised targets are above 1 "
        "and outside the range a sigmoid output can reach.",
        "The box targets are twice too large for the 32x32 input: they stay in the original image's pixel "
        "coordinates after downscaling.",
    ],
    "box_size_head_missing_from_optimizer": [
        "Parameters of the size_head receive gradients but are never updated: they are not passed to the optimizer.",
        "Some trainable parameters are missing from the optimizer's param groups; build it from model.parameters().",
    ],
    "hazard_baseline_plain_tensor": [
        "A tensor with requires_grad=True is stored as a module attribute rather than an nn.Parameter; it is not in "
        "model.parameters() and the optimizer never updates it.",
        "The baseline hazard is a plain tensor, not a registered parameter, so it is never trained. Wrap it in "
        "nn.Parameter.",
    ],
    "seg_head_conv_created_in_forward": [
        "A new Conv2d layer is constructed inside forward on every call: its weights are re-initialised each step "
        "and never in the optimizer. Define it in __init__.",
        "The output of the model changes between two identical forward passes: a module is created in the forward "
        "and is not a registered submodule.",
    ],
    "kp_optimizer_over_ema_copy": [
        "The optimizer holds parameters of a different model (a deepcopy) than the one the loss is computed with; "
        "the trained model's parameters are never updated.",
        "None of the optimizer's parameters get gradients (their grad stays None): the optimizer was built over "
        "the EMA copy instead of the model being trained.",
    ],
    "box_random_backbone_under_no_grad": [
        "The backbone runs under torch.no_grad() but its weights are randomly initialised; gradients never reach "
        "it, so only the head is trained on random features.",
        "The feature extractor is frozen yet untrained (no pretrained weights were loaded): its parameters never "
        "receive gradients.",
    ],
    "seg_dice_softmax_over_batch_dim": [
        "The softmax in the Dice loss is taken over dim=0 (the batch) instead of the class dimension; per-pixel "
        "class probabilities do not sum to 1.",
        "Probabilities are normalised across samples in the batch rather than across classes; use softmax over "
        "dim=1.",
    ],
    "centernet_focal_no_positive_pixels": [
        "The focal loss finds no positive pixels: the heatmap peaks never equal exactly 1, so gt.eq(1) is empty and "
        "only the negative term is trained.",
        "num_pos is zero in every batch because the Gaussian targets are drawn at sub-pixel centres; draw them at "
        "the integer centre or take the maximum as positive.",
    ],
    "box_iou_loss_returns_iou": [
        "The IoU loss returns the IoU itself instead of 1 - IoU, so minimising it pushes the overlap down.",
        "The box loss has the wrong sign: the optimizer minimises the overlap with the ground truth; use "
        "(1 - iou).mean().",
    ],
    "cox_cumsum_risk_set_on_shuffled_batches": [
        "The Cox loss computes the risk set with a cumulative sum that assumes samples sorted by time, but the "
        "DataLoader shuffles them.",
        "Batches are not ordered by descending survival time, so the cumsum risk sets are wrong; sort each batch "
        "(argsort on time) inside the loss.",
    ],
    "hazard_bce_over_intervals_after_exit": [
        "The per-interval loss includes intervals after each subject's event or censoring time; mask the BCE to the "
        "intervals where the subject is at risk.",
        "Subjects are treated as having survived all later intervals: the hazard loss is not masked after exit.",
    ],
    "seg_crop_drawn_separately_for_image_and_mask": [
        "The image and mask are augmented with separate random transforms: each crop draws its own offset, so the "
        "masks are shifted against their images.",
        "Use one joint transform (same crop parameters) for image and mask; the labels do not line up with the "
        "inputs after augmentation.",
    ],
    "box_hflip_image_only": [
        "The horizontal flip is applied to the image but the box coordinates are not flipped (x' = W - x).",
        "After the mirror augmentation the bounding boxes are not updated, so half the targets sit on the wrong side.",
    ],
    "kp_hflip_without_left_right_swap": [
        "The flip augmentation mirrors keypoint x but does not swap the left and right keypoints, so their identity "
        "is inconsistent.",
        "A flip_idx / left-right permutation is missing from the horizontal flip: index 0 is the left landmark in "
        "some samples and the right one in others.",
    ],
    "seg_mask_downscaled_bilinear": [
        "Segmentation masks are resized with bilinear interpolation, which creates intermediate class values at "
        "boundaries; use nearest-neighbour for label maps.",
        "Label maps are interpolated rather than resampled with NEAREST: averaged label values become spurious "
        "classes along the edges.",
    ],
    "cox_table_sorted_time_not_features": [
        "The times and events were sorted but the feature rows were not reordered: features are misaligned with "
        "their survival labels.",
        "Apply the same argsort permutation to the covariates as to the time and event arrays; they are currently "
        "out of sync.",
    ],
}
