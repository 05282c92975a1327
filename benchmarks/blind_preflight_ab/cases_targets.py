"""Set ab, family "targets": what the loss is asked to match is not what the task is."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_ab.registry import acc_of, case, fix, fixed_of, gen, loader, mean_over, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------
# 1. A T5 fine-tune that passes decoder_input_ids=labels (unshifted) next to labels.
# --------------------------------------------------------------------------------------------------------------

class DictRows(Dataset):
    def __init__(self, **cols):
        self.cols = cols
        self.n = len(next(iter(cols.values())))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.cols.items()}


def _code_pairs(n, s):
    """'Transliterate' 8 source codes (ids 3..22) into 8 target codes: each target token is a fixed map of the
    source token at the same place, plus an end token (1)."""
    g = gen(s)
    src = torch.randint(3, 23, (n, 8), generator=g)
    table = torch.randperm(20, generator=gen(99)) + 3
    tgt = table[src - 3]
    tgt = torch.cat([tgt, torch.ones(n, 1, dtype=torch.long)], 1)
    return src, tgt


def _tiny_t5():
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=32, d_model=48, d_kv=12, d_ff=96, num_layers=2, num_decoder_layers=2, num_heads=4,
                   dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16)
    return T5ForConditionalGeneration(cfg)


def t5_decoder_inputs_unshifted(fixed=False):
    seed(0)
    src, tgt = _code_pairs(1500, 5)
    mask = torch.ones_like(src)
    model = _tiny_t5()

    def rows(sl):
        cols = dict(input_ids=src[sl], attention_mask=mask[sl], labels=tgt[sl])
        if not fixed:
            cols["decoder_input_ids"] = tgt[sl]          # "the decoder reads the target during training"
        return DictRows(**cols)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(rows(slice(0, 1200)), 32),
                val_loader=loader(DictRows(input_ids=src[1200:], attention_mask=mask[1200:], labels=tgt[1200:]), 100,
                                  shuffle=False),
                loss_fn=None, max_steps=300)


case("targets_t5_decoder_inputs_unshifted", "targets",
     "The T5 batches carry decoder_input_ids equal to the labels themselves (not shifted right behind the decoder "
     "start token), so at every position the decoder is fed the very token it must predict and learns to copy it; "
     "pass only labels (T5 builds decoder_input_ids with _shift_right) or shift them yourself.",
     r"decoder_input_ids|shift(ed|s|ing)?[_ ]right|_shift_right|(not|un)[- ]?shifted|"
     r"(decoder|model) (is )?(fed|given|sees|reads) the (very |same )?(token|target|label)s? it (must|should|has to) "
     r"predict|(copy|copies|copying) (the )?(current )?(input|label|target|token)|"
     r"(labels?|targets?) (equal|identical|same as) (to )?(the )?decoder (inputs?|input_ids)|"
     r"decoder_start_token")(t5_decoder_inputs_unshifted)


@torch.no_grad()
def _t5_token_acc(model, kw):
    def fn(m, b):
        logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).logits
        return (logits.argmax(-1) == b["labels"]).sum().item(), b["labels"].numel()
    return mean_over(model, kw["val_loader"], fn)


fix("targets_t5_decoder_inputs_unshifted", fixed_of(t5_decoder_inputs_unshifted), _t5_token_acc,
    "val teacher-forced token accuracy", steps=300)


# --------------------------------------------------------------------------------------------------------------
# 2. A "will the user like it" click model trained with BCEWithLogitsLoss on the raw 1-5 star ratings.
# --------------------------------------------------------------------------------------------------------------

class LikeModel(nn.Module):
    def __init__(self, n_users, n_items, dim=16):
        super().__init__()
        self.user = nn.Embedding(n_users, dim)
        self.item = nn.Embedding(n_items, dim)
        self.user_b = nn.Embedding(n_users, 1)
        self.item_b = nn.Embedding(n_items, 1)
        for e in (self.user, self.item):
            nn.init.normal_(e.weight, std=0.1)
        nn.init.zeros_(self.user_b.weight)
        nn.init.zeros_(self.item_b.weight)

    def forward(self, pairs):                     # (B, 2) user, item -> (B,) logit of "likes it"
        u, i = pairs[:, 0], pairs[:, 1]
        return (self.user(u) * self.item(i)).sum(1) + self.user_b(u)[:, 0] + self.item_b(i)[:, 0]


def _star_ratings(n, s):
    g = gen(s)
    taste, style = torch.randn(100, 3, generator=g), torch.randn(90, 3, generator=g)
    u = torch.randint(0, 100, (n,), generator=g)
    i = torch.randint(0, 90, (n,), generator=g)
    score = (taste[u] * style[i]).sum(1) + 0.3 * torch.randn(n, generator=g)
    stars = torch.bucketize(score, torch.tensor([-1.5, -0.5, 0.5, 1.5])) + 1      # 1..5
    return torch.stack([u, i], 1), stars.float()


def bce_on_star_ratings(fixed=False):
    seed(0)
    pairs, stars = _star_ratings(6000, 6)
    target = (stars >= 4).float() if fixed else stars          # "the rating is the label"
    model = LikeModel(100, 90)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(pairs[:5000], target[:5000]), 64),
                val_loader=loader(TensorDataset(pairs[5000:], (stars[5000:] >= 4).float()), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


case("targets_bce_star_ratings", "targets",
     "BCEWithLogitsLoss is given the raw 1-5 star ratings as targets where it needs 0/1 'liked' labels; with "
     "targets above 1 the loss has no minimum (it goes negative) and every logit is pushed up, so every pair is "
     "predicted 'liked'; binarise the ratings (stars >= 4) or regress them with MSELoss.",
     r"(targets?|labels?) (outside|not in|out of|beyond|above|greater than|exceed\w*) (the )?(\[0, ?1\]|0[- ]1|range|1\b)|"
     r"(targets?|labels?) (in|between) (\[?1, ?5\]?|1 and 5)|\b(1|one) (to|-) (5|five)\b|\b1-5\b|star ratings?|"
     r"raw ratings?|ratings? (as|used as) (the )?(bce )?(targets?|labels?)|binari[sz]e|negative (bce|loss)|"
     r"bce\w*.{0,60}(0/1|0 or 1|\[0, ?1\]|probabilit)")(
    bce_on_star_ratings)

fix("targets_bce_star_ratings", fixed_of(bce_on_star_ratings),
    acc_of(lambda m, b: ((m(b[0]) > 0).float(), b[1])), "val like accuracy", steps=300)


# --------------------------------------------------------------------------------------------------------------
# 3. Multi-label tags (several per item) trained with CrossEntropyLoss on the multi-hot vectors.
# --------------------------------------------------------------------------------------------------------------

N_LABELS = 8


def _multi_hot(n, s):
    g = gen(s)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, N_LABELS, generator=g)
    y = ((x @ w) > 1.0).float()                   # about 2-3 tags per row, some rows none
    return x, y


def multilabel_cross_entropy(fixed=False):
    seed(0)
    x, y = _multi_hot(2400, 7)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, N_LABELS))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(), max_steps=300)


case("targets_multilabel_cross_entropy", "targets",
     "A multi-label tagger (several tags per row, multi-hot float targets) is trained with CrossEntropyLoss, whose "
     "softmax makes the tags compete for one unit of probability, so 'tag present' (sigmoid(logit) > 0.5) is never "
     "learned; use BCEWithLogitsLoss, one sigmoid per tag.",
     r"multi[- ]?label|multi[- ]?hot|(several|multiple|more than one) (tags?|labels?|positives?|classes) (per|for each)|"
     r"(softmax|cross[- ]?entropy\w*).{0,60}(compet|sum(s)? to (1|one))|crossentropyloss.{0,60}(multi|several|more "
     r"than one)|"
     r"one sigmoid per|independent (sigmoid|binary)")(multilabel_cross_entropy)


@torch.no_grad()
def _label_acc(model, kw):
    def fn(m, b):
        x, y = b
        return ((m(x) > 0).float() == y).sum().item(), y.numel()
    return mean_over(model, kw["val_loader"], fn)


fix("targets_multilabel_cross_entropy", fixed_of(multilabel_cross_entropy), _label_acc, "val per-tag accuracy",
    steps=300)


# --------------------------------------------------------------------------------------------------------------
# 4. Distillation into a small student with KLDivLoss(softmax(student), softmax(teacher)).
# --------------------------------------------------------------------------------------------------------------

def _teacher_logits(x):
    g = gen(21)
    w1, w2 = torch.randn(12, 32, generator=g), torch.randn(32, 6, generator=g)
    return torch.tanh(x @ w1) @ w2 * 0.35          # soft, not one-hot: the "dark knowledge" to distil


def distill_kl_probabilities(fixed=False):
    seed(0)
    g = gen(8)
    x = torch.randn(2400, 12, generator=g)
    t = _teacher_logits(x)
    student = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Linear(48, 6))
    kl = nn.KLDivLoss(reduction="batchmean")

    def loss_fn(model, batch):
        xb, tb = batch
        s = model(xb)
        s = F.log_softmax(s, -1) if fixed else F.softmax(s, -1)
        return kl(s, F.softmax(tb, -1))
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], t[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], t[2000:]), 100, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


case("targets_distill_kl_probabilities", "targets",
     "The distillation loss calls KLDivLoss(softmax(student_logits), softmax(teacher_logits)), but KLDivLoss expects "
     "its input as log-probabilities; with probabilities the loss is -sum(p_teacher * p_student) + const, which drives "
     "the student to a one-hot on the teacher's top class instead of matching its soft distribution; pass "
     "F.log_softmax(student_logits).",
     r"log[-_ ]?(softmax|probabilit)|kl_?div|kullback|(input|first argument).{0,40}\blog\b|"
     r"(probabilities|softmax) (instead of|rather than|not) log[-_ ]?(prob|softmax)|"
     r"(negative|below zero) (kl|divergence)")(distill_kl_probabilities)


@torch.no_grad()
def _val_kl(model, kw):
    def fn(m, b):
        xb, tb = b
        p = F.softmax(tb, -1)
        return (p * (p.log() - F.log_softmax(m(xb).float(), -1))).sum().item(), len(xb)
    return mean_over(model, kw["val_loader"], fn)


fix("targets_distill_kl_probabilities", fixed_of(distill_kl_probabilities), _val_kl,
    "val KL(teacher || student)", steps=300, higher=False)


# --------------------------------------------------------------------------------------------------------------
# 5. A house model with a price head (raw dollars, MSE) and a property-type head (CE) summed into one loss.
# --------------------------------------------------------------------------------------------------------------

class HouseNet(nn.Module):
    def __init__(self, y_mean=0.0, y_std=1.0):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.price = nn.Linear(64, 1)
        self.kind = nn.Linear(64, 3)
        self.y_mean, self.y_std = y_mean, y_std      # the target scaling the loss used (none: 0 and 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.price(h)[:, 0], self.kind(h)


def _houses(n, s):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    price = 250_000 + 60_000 * torch.tanh(x[:, :3].sum(1)) + 20_000 * x[:, 3] + 5_000 * torch.randn(n, generator=g)
    kind = (x[:, 4:7] + 0.3 * x[:, 7:10]).argmax(1)
    return x, price, kind


def multitask_price_unscaled(fixed=False):
    seed(0)
    x, price, kind = _houses(2400, 9)
    mean, std = (price[:2000].mean().item(), price[:2000].std().item()) if fixed else (0.0, 1.0)
    model = HouseNet(mean, std)

    def loss_fn(model, batch):
        xb, pb, kb = batch
        p, k = model(xb)
        return F.mse_loss(p, (pb - model.y_mean) / model.y_std) + F.cross_entropy(k, kb)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2000], price[:2000], kind[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], price[2000:], kind[2000:]), 100, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


case("targets_multitask_price_unscaled", "targets",
     "The price head regresses raw prices in dollars (around 250,000) with MSELoss, summed with the type head's "
     "cross-entropy: the target is five orders of magnitude away from a freshly initialised output, so at Adam's "
     "1e-3 steps the head never gets near it and the MSE term (~1e10) swamps the other task; standardise the price "
     "target (subtract the mean, divide by the std) and unscale the predictions.",
     r"(standardi[sz]|normali[sz]|rescal|scal)\w* (the )?price|price (target|column|head)s?.{0,40}(raw|dollar|"
     r"unscaled|not (scaled|standardi[sz]ed))|raw (dollar|price)s?|"
     r"(target|label)s? (of|with|on the order of|around|~) ?(1e5|1e4|10\^5|\d{3},\d{3}|\d{5,})|"
     r"(mse|regression|price) (term|loss) (dominat|swamp|overwhelm)|(dominat|swamp|overwhelm)\w* .{0,40}(cross|classif)|"
     r"(loss|target|price)\w* .{0,40}orders? of magnitude")(multitask_price_unscaled)


def _price_pred(m, b):
    p, _ = m(b[0])
    return p.float() * m.y_std + m.y_mean, b[1]


fix("targets_multitask_price_unscaled", fixed_of(multitask_price_unscaled), rmse_of(_price_pred), "val price RMSE ($)",
    steps=300, higher=False)
