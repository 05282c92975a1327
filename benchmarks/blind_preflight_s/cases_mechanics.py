"""Set s, family "mechanics": the optimizer, scheduler, precision, clipping, checkpoint loading or a custom loss keep
correct data and a correct model from learning.

Each builder returns the keyword arguments a user would pass to ``run_preflight``; ``fixed=True`` applies the one-line
fix (``verify.py`` trains both).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_s.registry import (
    DictRows,
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
)

# --------------------------------------------------------------------------------------------------------------------
# 1. Tiny GPT-2 topic classifier with get_linear_schedule_with_warmup(num_training_steps=EPOCHS): the LR reaches 0
#    after 3 optimizer steps.

EPOCHS = 3


def topic_texts(n: int, s: int, length: int = 16, n_topics: int = 3):
    """Fillers 22..63 and two keywords of the topic (topic k owns ids 4+6k .. 9+6k)."""
    g = gen(s)
    ids = torch.randint(22, 64, (n, length), generator=g)
    y = torch.randint(0, n_topics, (n,), generator=g)
    for _ in range(2):
        ids[torch.arange(n), torch.randint(0, length - 1, (n,), generator=g)] = 4 + 6 * y + torch.randint(
            0, 6, (n,), generator=g)
    return ids, y


def tiny_gpt2_classifier(n_labels: int = 3):
    from transformers import GPT2Config, GPT2ForSequenceClassification

    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, pad_token_id=0, bos_token_id=1,
                     eos_token_id=1,
                     num_labels=n_labels, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2ForSequenceClassification(cfg)


@case("topic_gpt2_schedule_counts_epochs", "mechanics",
      "get_linear_schedule_with_warmup(optimizer, 0, num_training_steps=EPOCHS) is given the number of epochs (3) "
      "while the scheduler is stepped after every optimizer step: the learning rate decays linearly to 0 within 3 "
      "steps and stays at 0 for the other 297",
      r"num_training_steps|(learning rate|lr)\W+(\w+\W+){0,10}(reach\w*|hits?|drops? to|decays? to|is|becomes|falls? to|goes to|stays? at)\s+(?<![\d.])(0(\.0+)?|zero)(?![\d.])|"
      r"(learning rate|lr)\W+(\w+\W+){0,6}(vanish\w*|collaps\w*)|"
      r"schedul\w*\W+(\w+\W+){0,12}(epochs?|total (optimi[sz]er )?steps|horizon|too (short|few))|"
      r"(epochs?)\W+(\w+\W+){0,8}(instead of|rather than|not)\W+(\w+\W+){0,4}steps|"
      r"(per[- ]step|every (optimi[sz]er )?step|each batch)\W+(\w+\W+){0,8}(schedul|epochs?)")
def topic_gpt2_schedule_counts_epochs(fixed: bool = False):
    from transformers import get_linear_schedule_with_warmup

    seed(0)
    x, y = topic_texts(3200, 41)
    xv, yv = topic_texts(512, 42)
    train = loader(DictRows(input_ids=x, attention_mask=torch.ones_like(x), labels=y), 32)
    val = loader(DictRows(input_ids=xv, attention_mask=torch.ones_like(xv), labels=yv), 128, shuffle=False)
    model = tiny_gpt2_classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    total = EPOCHS * len(train) if fixed else EPOCHS
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=total)
    return dict(model=model, optimizer=optimizer, train_loader=train, val_loader=val, scheduler=scheduler,
                loss_fn=None, max_steps=EPOCHS * len(train))


fix("topic_gpt2_schedule_counts_epochs", fixed_of(topic_gpt2_schedule_counts_epochs),
    acc_of(lambda m, b: (m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1),
                         b["labels"])), "val accuracy", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# 2. Accent classifier fine-tuned on 96 clips from a checkpoint saved under nn.DataParallel ("module." keys), loaded
#    with load_state_dict(strict=False): nothing is loaded and the run starts from random weights.


class AccentMLP(nn.Module):
    def __init__(self, d: int = 20, hidden: int = 64, n_classes: int = 6):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))

    def forward(self, x):
        return self.net(x)


def accent_teacher():
    torch.manual_seed(1234)
    teacher = AccentMLP()
    with torch.no_grad():
        for p in teacher.parameters():
            p.mul_(3.0)
    return teacher


def accent_clips(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 20, generator=g)
    with torch.no_grad():
        y = accent_teacher()(x).argmax(-1)
    return x, y


def dataparallel_checkpoint():
    """What torch.save({'state_dict': nn.DataParallel(model).state_dict()}) holds after pretraining on the big corpus:
    the teacher's weights slightly perturbed, every key prefixed with 'module.'."""
    g = gen(43)
    state = {k: v + 0.05 * v.std() * torch.randn(v.shape, generator=g) for k, v in accent_teacher().state_dict().items()}
    return {"state_dict": {"module." + k: v for k, v in state.items()}, "epoch": 40}


@case("accent_finetune_checkpoint_prefix_strict_false", "mechanics",
      "the pretrained checkpoint was saved from nn.DataParallel so every key starts with 'module.', and "
      "model.load_state_dict(ckpt['state_dict'], strict=False) silently skips all of them (every key is both missing "
      "and unexpected): fine-tuning on 96 clips starts from random weights",
      r"strict\s*=\s*false|strict=False|module\.|prefix|missing[_ ]keys|unexpected[_ ]keys|"
      r"(checkpoint|state_dict|pretrained weights?)\W+(\w+\W+){0,10}(not|never|nothing)\W+(\w+\W+){0,3}(loaded|applied|matched)|"
      r"(random|fresh)\w*\W+(\w+\W+){0,4}(init\w*|weights)\W+(\w+\W+){0,8}(instead of|despite|not the)\W+(\w+\W+){0,3}(pretrained|checkpoint)")
def accent_finetune_checkpoint_prefix_strict_false(fixed: bool = False):
    seed(0)
    x, y = accent_clips(96, 44)
    xv, yv = accent_clips(2000, 45)
    model = AccentMLP()
    ckpt = dataparallel_checkpoint()
    state = ckpt["state_dict"]
    if fixed:
        state = {k.removeprefix("module."): v for k, v in state.items()}
    model.load_state_dict(state, strict=False)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, y), 16), val_loader=loader(TensorDataset(xv, yv), 500, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=120)


fix("accent_finetune_checkpoint_prefix_strict_false", fixed_of(accent_finetune_checkpoint_prefix_strict_false),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=120)

# --------------------------------------------------------------------------------------------------------------------
# 3. Star-rating regressor whose custom loss rounds the prediction to whole stars first: round() has zero gradient.


def review_features(n: int, s: int, d: int = 16):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=gen(46)) / d ** 0.5
    stars = (3.2 + 1.2 * torch.tanh(x @ w) + 0.3 * torch.randn(n, generator=g)).round().clamp(1, 5)
    return x, stars


def star_loss(fixed: bool):
    def loss_fn(model, batch):
        x, stars = batch
        pred = model(x).squeeze(-1)
        if not fixed:
            pred = pred.round().clamp(1, 5)      # "train on the same whole stars the app shows"
        return F.mse_loss(pred, stars)
    return loss_fn


@case("stars_loss_rounds_predictions", "mechanics",
      "the custom loss rounds the prediction to whole stars (pred.round().clamp(1, 5)) before the MSE: round() is a "
      "step function whose gradient is zero everywhere, so every weight gets a zero gradient and nothing learns while "
      "the loss looks normal",
      r"round|(step|piecewise[- ]constant|non-?differentiable)\W+(\w+\W+){0,6}(function|op\w*)|"
      r"(zero|no|none)\W+(\w+\W+){0,3}grad\w*\W+(\w+\W+){0,10}(every|all|any)\W+(\w+\W+){0,3}(param|weight)|"
      r"(all|every)\W+(\w+\W+){0,3}grad\w*\W+(\w+\W+){0,4}(are |is )?(exactly )?(zero|0)\b|"
      r"(gradient|grad)s?\W+(\w+\W+){0,6}(blocked|cut|zeroed|killed)\W+(\w+\W+){0,6}loss")
def stars_loss_rounds_predictions(fixed: bool = False):
    seed(0)
    x, y = review_features(3200, 47)
    xv, yv = review_features(800, 48)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 200, shuffle=False),
                loss_fn=star_loss(fixed), max_steps=500)


fix("stars_loss_rounds_predictions", fixed_of(stars_loss_rounds_predictions),
    rmse_of(lambda m, b: (m(b[0]).squeeze(-1).round().clamp(1, 5), b[1])), "val RMSE of the shown stars",
    steps=250, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# 4. Load forecaster cast to bfloat16 as a whole (model.to(torch.bfloat16)) with a small Adam LR: the updates are
#    below half a bf16 ulp of the weights and round away.


def load_features(n: int, s: int, d: int = 16):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w1 = torch.randn(d, 8, generator=gen(49)) / d ** 0.5
    w2 = torch.randn(8, generator=gen(50))
    y = torch.tanh(x @ w1) @ w2 + 0.1 * torch.randn(n, generator=g)
    return x, y.unsqueeze(-1)


class LoadMLP(nn.Module):
    def __init__(self, d: int = 16, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x.to(self.net[0].weight.dtype))


@case("load_mlp_pure_bf16_weights", "mechanics",
      "the whole model is cast with model.to(torch.bfloat16), so the weights (and Adam's update into them) are "
      "stored in bfloat16 with 8 bits of mantissa: an update of lr=2e-4 is below half the bf16 spacing of any weight "
      "larger than about 0.05 and rounds to no change, so most weights never move",
      r"bfloat16|bf16\W+(\w+\W+){0,8}(weights?|param\w*|master|storage|stored|cast|dtype)|"
      r"(master|fp32|float32) (weights?|copy|params?)|"
      r"(weights?|param\w*)\W+(\w+\W+){0,6}(half|reduced|low)[- ]precision|"
      r"(update|step)s?\W+(\w+\W+){0,8}(round\w* (away|off|to zero)|below\W+(\w+\W+){0,4}(ulp|precision|spacing|resolution)|lost|swallowed)|"
      r"model\.to\(\s*torch\.(bfloat16|half|float16)|\.half\(\)|\.bfloat16\(\)")
def load_mlp_pure_bf16_weights(fixed: bool = False):
    seed(0)
    x, y = load_features(3200, 51)
    xv, yv = load_features(800, 52)
    model = LoadMLP()
    if not fixed:
        model = model.to(torch.bfloat16)          # "bf16 training halves the memory"
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-4),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 200, shuffle=False),
                loss_fn=nn.MSELoss(), precision="bf16", max_steps=1000)


fix("load_mlp_pure_bf16_weights", fixed_of(load_mlp_pure_bf16_weights),
    rmse_of(lambda m, b: (m(b[0]).float(), b[1])), "val RMSE", steps=400, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# 5. Character LSTM language model run with clip_grad_norm=0.0, meant as "no clipping" (the OpenNMT / config habit):
#    clip_grad_norm_(params, 0.0) scales every gradient to zero.

WORDS = ["the", "pump", "valve", "opens", "closes", "after", "before", "reset", "alarm", "sensor", "reads", "high",
         "low", "and", "then"]


def char_corpus(n_chars: int, s: int):
    g = gen(s)
    words = [WORDS[int(i)] for i in torch.randint(0, len(WORDS), (n_chars // 3,), generator=g)]
    text = " ".join(words)[:n_chars]
    alphabet = sorted(set(" ".join(WORDS)))
    return torch.tensor([alphabet.index(c) for c in text]), len(alphabet)


def char_windows(ids, length: int = 33):
    n = (len(ids) - 1) // length
    chunks = ids[: n * length].view(n, length)
    return chunks


class CharLSTM(nn.Module):
    def __init__(self, vocab: int, emb: int = 24, hidden: int = 64):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, ids):
        h, _ = self.lstm(self.emb(ids))
        return self.out(h)


def next_char_loss(model, batch):
    (chunk,) = batch
    logits = model(chunk[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), chunk[:, 1:].reshape(-1))


@torch.no_grad()
def next_char_accuracy(model, kw):
    def fn(m, batch):
        (chunk,) = batch
        pred = m(chunk[:, :-1]).argmax(-1)
        return (pred == chunk[:, 1:]).sum().item(), chunk[:, 1:].numel()
    return mean_over(model, kw["val_loader"], fn)


@case("char_lm_clip_grad_norm_zero", "mechanics",
      "clip_grad_norm=0.0 was meant as 'no clipping' (as max_grad_norm=0 means in some trainers), but "
      "torch.nn.utils.clip_grad_norm_(params, 0.0) rescales every gradient by 0 / norm = 0: the optimizer gets all-zero "
      "gradients and the language model never moves",
      r"clip\w*\W+(\w+\W+){0,8}(?<![\d.])(0(\.0+)?|zero)(?![\d.])|max_norm\s*=\s*0(?![\d.])|"
      r"max[_ ]grad[_ ]norm\W+(\w+\W+){0,3}(?<![\d.])0(?![\d.])|"
      r"(gradients?|grads?)\W+(\w+\W+){0,8}(clipped|scaled|rescaled|multiplied)\W+(\w+\W+){0,4}(to |by )?(?<![\d.])(0|zero|nothing)(?![\d.])|"
      r"(?<![\d.])(0|zero)(?![\d.])\W+(\w+\W+){0,4}(means?|meant)\W+(\w+\W+){0,3}(no clipping|off|disabled)")
def char_lm_clip_grad_norm_zero(fixed: bool = False):
    seed(0)
    ids, vocab = char_corpus(12000, 53)
    vids, _ = char_corpus(3000, 54)
    model = CharLSTM(vocab)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(char_windows(ids)), 32),
                val_loader=loader(TensorDataset(char_windows(vids)), 100, shuffle=False),
                loss_fn=next_char_loss, clip_grad_norm=None if fixed else 0.0, max_steps=600)


fix("char_lm_clip_grad_norm_zero", fixed_of(char_lm_clip_grad_norm_zero), next_char_accuracy,
    "val next-character accuracy", steps=200)
