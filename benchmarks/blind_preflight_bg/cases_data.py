"""Family data: pairs, views, collate, sampler and padding built before the model sees them."""

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from benchmarks.blind_preflight_bg.cases_mechanics import CLIP, clip_kwargs, clip_retrieval
from benchmarks.blind_preflight_bg.cases_shapes import triplet_kwargs
from benchmarks.blind_preflight_bg.registry import (DIN, CTCNet, CTCSet, SSLNet, TwoViews, augment, case,
                                                    ctc_exact_match, ctc_kwargs, ctc_sequences, ctc_step, fix,
                                                    fixed_of, knn_accuracy, latent_signal, nt_xent, retrieval_top1,
                                                    seed, ssl_kwargs, loader)


def clip_loss(m, batch):
    a, b = m.encode(*batch)
    logits = m.logit_scale.exp() * a @ b.T
    y = torch.arange(len(a))
    return 0.5 * (F.cross_entropy(logits, y) + F.cross_entropy(logits.T, y))


@case("clip_pairs_misaligned", "data",
      "The Dataset returns image i with the text at a separately shuffled index (txt[order[i]]), so the "
      "image-text pairs the contrastive loss treats as matching are unrelated.",
      r"(pair|caption|text)s?.{0,100}(misalign|mismatch|shuffl|unrelated|wrong|permut|not (match|aligned))|"
      r"(misalign|mismatch|shuffl|permut)\w*.{0,80}(pair|text|caption|modalit)")
def clip_pairs_misaligned(fixed=False):
    seed(0)
    return clip_kwargs(CLIP(), clip_loss, shuffle_text=not fixed)


fix("clip_pairs_misaligned", fixed_of(clip_pairs_misaligned), clip_retrieval, "val image->text top-1")


class SeededViews(TwoViews):
    """Two views from a generator seeded per sample index (reproducible augmentation)."""

    def __init__(self, sig, same_seed):
        super().__init__(sig)
        self.same = same_seed
        self.epoch = 0

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(int(i) * 7919 + int(torch.randint(1 << 30, ())))
        v1 = augment(self.sig[i], g)
        if self.same:
            g = torch.Generator().manual_seed(g.initial_seed())
        return v1, augment(self.sig[i], g)


@case("simclr_views_share_augmentation_seed", "data",
      "The Dataset re-seeds its augmentation generator with the same seed before each of the two views, so both "
      "views are identical and the contrastive task never asks for invariance to the augmentation.",
      r"(views?|augmentations?).{0,100}(identical|same seed|same random|re.?seed|duplicate)|"
      r"(same|identical) (seed|generator|augmentation).{0,60}(both|two|each) views?|"
      r"re.?seed\w*.{0,60}(generator|augment)")
def simclr_views_share_augmentation_seed(fixed=False):
    seed(0)
    kw = ssl_kwargs(SSLNet(), lambda m, b: nt_xent(m.project(b[0]), m.project(b[1])), latent_signal(1024, 0)[0])
    kw["train_loader"] = loader(SeededViews(latent_signal(1024, 0)[0], same_seed=not fixed), 64, drop_last=True)
    return kw


fix("simclr_views_share_augmentation_seed", fixed_of(simclr_views_share_augmentation_seed), retrieval_top1,
    "val retrieval top-1")


def sort_collate(sort_targets):
    def collate(items):
        x, xl, y, yl = (torch.stack(t) for t in zip(*items))
        order = xl.argsort(descending=True)
        x, xl = x[order], xl[order]
        if sort_targets:
            y, yl = y[order], yl[order]
        return x, xl, y, yl
    return collate


@case("ctc_collate_sorts_inputs_not_targets", "data",
      "The collate_fn sorts the batch by input length (for packing) and reorders the frames and input lengths but "
      "not the targets and target lengths, so each utterance is trained against another sample's transcript.",
      r"(sort|reorder|permut)\w*.{0,120}(targets?|labels?|transcripts?).{0,60}(not|never|without|mismatch)|"
      r"(targets?|labels?|transcripts?).{0,80}(not (re)?(sorted|ordered|permuted)|another sample|mismatch|"
      r"misalign)|collate.{0,80}(sort|order)")
def ctc_collate_sorts_inputs_not_targets(fixed=False):
    seed(0)
    def loss_fn(m, batch):
        x, xl, y, yl = batch
        return F.ctc_loss(m(x).transpose(0, 1), y, xl, yl, blank=0, zero_infinity=True)
    return ctc_kwargs(CTCNet(), loss_fn, ctc_sequences(1024, 0), collate_fn=sort_collate(fixed))


fix("ctc_collate_sorts_inputs_not_targets", fixed_of(ctc_collate_sorts_inputs_not_targets), ctc_exact_match(),
    "val exact match")


@case("triplet_positive_from_any_class", "data",
      "The triplet Dataset draws the positive from a random index of the whole set instead of from the anchor's "
      "class, so most 'positives' belong to another class.",
      r"positives?.{0,100}(any class|another class|other class|random (index|sample|row)|same class|wrong class|"
      r"not (from )?the (anchor'?s?|same) class)|(anchor'?s?|same) class.{0,60}positive")
def triplet_positive_from_any_class(fixed=False):
    seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIN, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))

    def loss_fn(m, batch):
        a, p, n = (F.normalize(m(t), dim=1) for t in batch)
        return F.triplet_margin_loss(a, p, n, margin=0.5)
    return triplet_kwargs(model, loss_fn, any_positive=not fixed)


fix("triplet_positive_from_any_class", fixed_of(triplet_positive_from_any_class), knn_accuracy, "val 1-NN accuracy")


def left_pad(data):
    x, xl, y, yl = data
    out = torch.zeros_like(x)
    for i in range(len(x)):
        n = int(xl[i])
        out[i, x.size(1) - n:] = x[i, :n]
    return out, xl, y, yl


@case("ctc_left_padded_frames", "data",
      "The frames are left-padded (padding first, speech at the end) while input_lengths tells ctc_loss the first "
      "xl[i] frames are the real ones, so CTC reads the padding and cuts off the end of every utterance.",
      r"left.?pad|pad\w* (at|on) the (start|front|left|beginning)|"
      r"input_lengths?.{0,100}(pad|first|start|front)|(right.?pad|pad\w* (at|on) the end)")
def ctc_left_padded_frames(fixed=False):
    seed(0)
    data = ctc_sequences(1024, 0)
    return ctc_kwargs(CTCNet(), ctc_step, data if fixed else left_pad(data))


fix("ctc_left_padded_frames", fixed_of(ctc_left_padded_frames), ctc_exact_match(), "val exact match")
