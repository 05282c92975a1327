"""Set l, family mechanics: masks, schedules, initialisation and losses that quietly defeat the optimisation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_l.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
    token_sequences,
)

# --------------------------------------------------------------------------------------------------------------------
# A review classifier on nn.TransformerEncoder, the tokenizer's attention_mask passed as src_key_padding_mask.


def _reviews(n: int, s: int, T: int = 24):
    g = gen(s)
    ids = torch.zeros(n, T, dtype=torch.long)
    mask = torch.zeros(n, T, dtype=torch.long)
    y = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        k = int(torch.randint(5, 21, (1,), generator=g))
        body = torch.randint(5, 40, (k,), generator=g)
        n_sig = 1 + k // 4
        where = torch.randperm(k, generator=g)[:n_sig]
        body[where] = torch.where(torch.rand(n_sig, generator=g) < 0.8, 3 if y[i] == 1 else 4, 4 if y[i] == 1 else 3)
        ids[i, 0] = 1  # [CLS]
        ids[i, 1:k + 1] = body
        mask[i, :k + 1] = 1
    return ids, mask, y


class ReviewEncoder(nn.Module):
    def __init__(self, mask_means_keep: bool, vocab: int = 40, d: int = 32, T: int = 24):
        super().__init__()
        self.mask_means_keep = mask_means_keep
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.pos = nn.Embedding(T, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, ids, attention_mask):
        h = self.emb(ids) + self.pos(torch.arange(ids.size(1), device=ids.device))
        if self.mask_means_keep:
            pad = attention_mask == 0  # True marks padding for nn.Transformer*
        else:
            pad = attention_mask.bool()  # the tokenizer's mask, 1 for real tokens
        h = self.encoder(h, src_key_padding_mask=pad)
        return self.head(h[:, 0])  # the [CLS] position


def _review_loss(model, batch):
    ids, mask, y = batch
    return F.cross_entropy(model(ids, mask), y)


@case("mechanics_key_padding_mask_inverted", "mechanics",
      bug="The tokenizer-style attention_mask (1 = real token, 0 = padding) is passed straight as "
          "src_key_padding_mask, where nn.TransformerEncoder reads True as 'ignore this key': every position, "
          "[CLS] included, attends only to the padding, so the [CLS] output carries no information about the review "
          "(pass attention_mask == 0).",
      cause_pattern=r"src_key_padding_mask|key_padding_mask|(padding |attention )?mask.{0,60}(invert|revers|"
                    r"opposite|flip|negat|True (means|marks|for) (ignor|pad))|attention_mask ?== ?0|~ ?attention_mask|"
                    r"attends? only to (the )?pad")
def padding_mask(fixed: bool = False):
    seed(0)
    ids, mask, y = _reviews(3072, 31)
    vids, vmask, vy = _reviews(768, 32)
    model = ReviewEncoder(mask_means_keep=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(ids, mask, y), 32),
                val_loader=DataLoader(TensorDataset(vids, vmask, vy), 256), loss_fn=_review_loss, max_steps=2000)


fix("mechanics_key_padding_mask_inverted", fixed_of(padding_mask),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val accuracy")

# --------------------------------------------------------------------------------------------------------------------
# A demand regressor with a LambdaLR whose lambda returns a learning rate instead of a factor.


def _demand(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, generator=gen(33)) / 4
    y = torch.tanh(x @ w) * 2 + 0.5 * x[:, 0] * x[:, 1] + 0.1 * torch.randn(n, generator=g)
    return x, y.unsqueeze(1)


@case("mechanics_lambdalr_returns_lr_not_factor", "mechanics",
      bug="The LambdaLR's lr_lambda returns the learning rate the user wants (1e-3 * 0.999 ** step), but LambdaLR "
          "multiplies the optimizer's initial lr (already 1e-3) by whatever the lambda returns, so the run trains at "
          "about 1e-6 from the first step (the lambda must return the factor 0.999 ** step).",
      cause_pattern=r"lambdalr|lr_lambda|(multiplicative |scal\w* )factor|multipl\w* .{0,40}(initial|base) "
                    r"(lr|learning rate)|(initial|base) (lr|learning rate) .{0,40}multipl")
def lambdalr(fixed: bool = False):
    seed(0)
    x, y = _demand(3072, 34)
    vx, vy = _demand(768, 35)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if fixed:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.999 ** step)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1e-3 * 0.999 ** step)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=loader(TensorDataset(x, y), 64),
                val_loader=DataLoader(TensorDataset(vx, vy), 256), loss_fn=nn.MSELoss(), max_steps=1500)


fix("mechanics_lambdalr_returns_lr_not_factor", fixed_of(lambdalr), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False)

# --------------------------------------------------------------------------------------------------------------------
# A churn MLP initialised with zeros "like the linear-regression version".


class ChurnMLP(nn.Module):
    def __init__(self, zero_init: bool):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(14, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 3))
        if zero_init:
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.weight)
                    nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.net(x)


@case("mechanics_all_weights_initialised_to_zero", "mechanics",
      bug="The MLP's init loop sets every nn.Linear weight and bias to zero (nn.init.zeros_), as in the logistic "
          "regression it replaced: with ReLU hidden layers all hidden activations and every weight gradient are "
          "zero, so only the output bias ever moves and the model predicts the class prior (use random init).",
      cause_pattern=r"zeros_|(initiali[sz]\w*|init) .{0,30}(to |with |at )?zeros?\b|zero.{0,10}init|"
                    r"symmetr\w*|(weights?|parameters?) (are |is )?(all )?zeros?\b")
def zero_init(fixed: bool = False):
    seed(0)
    g = gen(36)
    x = torch.randn(3072, 14, generator=g)
    y = (x @ torch.randn(14, 3, generator=g) + 0.5 * torch.randn(3072, 3, generator=g)).argmax(1)
    model = ChurnMLP(zero_init=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=DataLoader(TensorDataset(x[2560:], y[2560:]), 512), loss_fn=nn.CrossEntropyLoss(),
                max_steps=1500)


fix("mechanics_all_weights_initialised_to_zero", fixed_of(zero_init),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")

# --------------------------------------------------------------------------------------------------------------------
# Cell segmentation with a Dice loss on argmax predictions, re-wrapped with requires_grad=True.


def _cells(n: int, s: int, H: int = 16):
    g = gen(s)
    yy, xx = torch.meshgrid(torch.arange(H), torch.arange(H), indexing="ij")
    cy = torch.randint(3, H - 3, (n, 1, 1), generator=g)
    cx = torch.randint(3, H - 3, (n, 1, 1), generator=g)
    rad = torch.randint(2, 5, (n, 1, 1), generator=g)
    mask = ((yy - cy) ** 2 + (xx - cx) ** 2 <= rad ** 2).long()
    img = (mask.float() * 1.0 + 0.5 * torch.randn(n, H, H, generator=g)).unsqueeze(1)
    return img, mask


def _seg_net():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 2, 1))


def hard_dice_loss(model, batch):
    img, mask = batch
    pred = model(img).argmax(1)  # predicted foreground
    inter = (pred * mask).sum()
    dice = (2 * inter + 1) / (pred.sum() + mask.sum() + 1)
    # backward() raised "element 0 of tensors does not require grad", hence requires_grad=True
    return torch.tensor(1 - dice.item(), requires_grad=True, device=img.device)


def soft_dice_loss(model, batch):
    img, mask = batch
    prob = model(img).softmax(1)[:, 1]
    inter = (prob * mask).sum()
    return 1 - (2 * inter + 1) / (prob.sum() + mask.sum() + 1)


@case("mechanics_dice_loss_on_argmax_rewrapped", "mechanics",
      bug="The Dice loss is computed on model(img).argmax(1), which has no gradient, and the resulting "
          "'element 0 of tensors does not require grad' error was silenced by returning "
          "torch.tensor(1 - dice.item(), requires_grad=True): the loss is a new leaf cut off from the model, "
          "backward() gives every parameter grad None and Adam never moves them (use a soft Dice on the softmax).",
      cause_pattern=r"argmax|(non|not)[- ]?differentiable|\.item\(\)|new leaf|leaf tensor|torch\.tensor\(.{0,60}"
                    r"requires_grad|(cut|detached|disconnected) (off )?from the (model|graph|autograd)|grad_fn|"
                    r"soft dice|softmax prob")
def dice_argmax(fixed: bool = False):
    seed(0)
    img, mask = _cells(2048, 37)
    vimg, vmask = _cells(512, 38)
    model = _seg_net()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(img, mask), 32), val_loader=DataLoader(TensorDataset(vimg, vmask), 256),
                loss_fn=soft_dice_loss if fixed else hard_dice_loss, max_steps=1500)


def foreground_iou(model, kw):
    def fn(m, b):
        pred = m(b[0]).argmax(1)
        return (pred * b[1]).sum().item(), ((pred + b[1]) > 0).sum().item()
    return mean_over(model, kw["val_loader"], fn)


fix("mechanics_dice_loss_on_argmax_rewrapped", fixed_of(dice_argmax), foreground_iou, "val foreground IoU")

# --------------------------------------------------------------------------------------------------------------------
# A tiny decoder-only LM on nn.TransformerEncoder, trained without a causal mask.


class TinyLM(nn.Module):
    def __init__(self, causal: bool, vocab: int = 24, d: int = 48, T: int = 16):
        super().__init__()
        self.causal = causal
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(T, d)
        layer = nn.TransformerEncoderLayer(d, 4, 96, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, x):
        T = x.size(1)
        h = self.emb(x) + self.pos(torch.arange(T, device=x.device))
        if self.causal:
            mask = nn.Transformer.generate_square_subsequent_mask(T, device=x.device)
            h = self.blocks(h, mask=mask, is_causal=True)
        else:
            h = self.blocks(h)
        return self.lm_head(h)


def next_token_loss(model, batch):
    x = batch[0]
    logits = model(x[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))


@case("mechanics_language_model_without_causal_mask", "mechanics",
      bug="The decoder-only language model runs nn.TransformerEncoder with no attention mask, so while it is trained "
          "to predict token t+1 every position can attend to the tokens after it, including the answer: the "
          "training loss collapses by copying the next input, and the model is useless when it generates "
          "left to right (pass mask=generate_square_subsequent_mask(T), is_causal=True).",
      cause_pattern=r"causal|subsequent|look-?ahead|future tokens?|(attend|see|peek)\w* .{0,30}(future|ahead|"
                    r"next|later)|triangular|generate_square")
def no_causal_mask(fixed: bool = False):
    seed(0)
    seqs = token_sequences(4096, 16, 24, s=39)
    model = TinyLM(causal=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(seqs), 64),
                val_loader=DataLoader(TensorDataset(token_sequences(512, 16, 24, s=40)), 256),
                loss_fn=next_token_loss, max_steps=2000)


def generation_accuracy(model, kw):
    """Next-token accuracy the way the model is used: from the prefix only, position by position."""
    x = torch.cat([b[0] for b in kw["val_loader"]])
    right = n = 0
    was = model.training
    model.eval()
    with torch.no_grad():
        for t in range(1, x.size(1) - 1):
            pred = model(x[:, :t + 1])[:, -1].argmax(-1)
            right += (pred == x[:, t + 1]).sum().item()
            n += x.size(0)
    model.train(was)
    return right / n


fix("mechanics_language_model_without_causal_mask", fixed_of(no_causal_mask), generation_accuracy,
    "left-to-right next-token accuracy")
