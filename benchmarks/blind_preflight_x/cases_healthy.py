"""Healthy: 5 corrected twins of broken cases (the one-line fix) and 5 unusual but correct setups."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_x.cases_data import dt_mask
from benchmarks.blind_preflight_x.cases_mechanics import mx_warmup
from benchmarks.blind_preflight_x.cases_shapes import sh_packed_gru
from benchmarks.blind_preflight_x.cases_targets import tg_t5
from benchmarks.blind_preflight_x.cases_trained import wt_hash
from benchmarks.blind_preflight_x.registry import gen, healthy, loader, seed, teacher_classes, twin

# --- the corrected twins ------------------------------------------------------------------------------------------------

healthy("hx_t5_labels_only_model_shifts", "T5ForConditionalGeneration from a tiny config trained with labels only "
        "(the model shifts them right into decoder_input_ids).")(twin(tg_t5))
healthy("hx_bert_attention_mask_ones_on_tokens", "Tiny BertForSequenceClassification with attention_mask = "
        "(input_ids != pad_id) on padded tickets.")(twin(dt_mask))
healthy("hx_packed_gru_reads_h_n", "Packed GRU over padded sessions whose classifier reads h_n[-1], the state at "
        "each session's own last item.")(twin(sh_packed_gru))
healthy("hx_hash_bits_straight_through", "Binary hash codes with a straight-through estimator "
        "(s + ((s > 0).float() - s).detach()).")(twin(wt_hash))
healthy("hx_warmup_lambda_capped_at_one", "LambdaLR warm-up min(1, (step + 1) / 5) stepped per batch with SGD "
        "momentum on a character LSTM.")(twin(mx_warmup))

# --- 1. GPT-2 from a config, prompt tokens masked with -100, right padding with pad = eos --------------------------------


def _qa_rows(n, s, length=16):
    """Prompt 'Q a b =' then the answer 'b a' and eos; only the answer is scored."""
    g = gen(s)
    eos = 1
    rows = []
    for _ in range(n):
        a, b = (int(v) for v in torch.randint(4, 40, (2,), generator=g))
        noise = int(torch.randint(0, 4, (1,), generator=g))
        prompt = [2] + [int(v) for v in torch.randint(40, 50, (noise,), generator=g)] + [a, b, 3]
        answer = [b, a, eos]
        ids = prompt + answer
        labels = [-100] * len(prompt) + answer
        pad = length - len(ids)
        rows.append({"input_ids": torch.tensor(ids + [eos] * pad),
                     "attention_mask": torch.tensor([1] * len(ids) + [0] * pad),
                     "labels": torch.tensor(labels + [-100] * pad)})
    return rows


@healthy("hx_gpt2_prompt_masked_minus_100", "Tiny GPT2LMHeadModel from a config on prompt/answer pairs: labels = "
         "input_ids with the prompt and the right padding (pad = eos) set to -100, the model shifting them itself.")
def hx_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    seed(0)
    cfg = GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=2, eos_token_id=1, pad_token_id=1)
    model = GPT2LMHeadModel(cfg)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01),
                train_loader=loader(_qa_rows(1000, 61), 32), val_loader=loader(_qa_rows(200, 62), 100, shuffle=False),
                loss_fn=None, max_steps=200)

# --- 2. three-quantile forecaster with a correctly shaped pinball loss and hand-built AdamW groups -----------------------


class QuantileForecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 3))

    def forward(self, x):
        return self.net(x)                        # (batch, 3): the 10th, 50th and 90th percentiles


QUANTILES = torch.tensor([0.1, 0.5, 0.9])


def multi_pinball(model, batch):
    x, y = batch
    err = y.unsqueeze(1) - model(x)               # (batch, 1) - (batch, 3) -> (batch, 3)
    q = QUANTILES.to(err.device)
    return torch.maximum(q * err, (q - 1) * err).mean()


@healthy("hx_quantile_forecaster_no_decay_groups", "Three-quantile pinball loss with the targets unsqueezed to "
         "(batch, 1); AdamW with hand-built groups: weight decay 0.05 on matrices, none on biases and LayerNorm; "
         "clip_grad_norm 1.0.")
def hx_quantiles():
    seed(0)
    g = gen(63)
    x = torch.randn(1500, 8, generator=g)
    y = 2 * x[:, 0] - x[:, 1] + (0.5 + x[:, 2].abs()) * torch.randn(1500, generator=g)
    model = QuantileForecaster()
    decay = [p for n, p in model.named_parameters() if p.ndim == 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.98), eps=1e-6)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 150, shuffle=False),
                loss_fn=multi_pinball, clip_grad_norm=1.0, max_steps=200)

# --- 3. a deliberately detached linear probe next to the main task -------------------------------------------------------


class EncoderWithProbe(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.main = nn.Linear(32, 5)
        self.probe = nn.Linear(32, 2)             # diagnostic: does the representation still encode the domain?

    def forward(self, x):
        h = self.encoder(x)
        return self.main(h), self.probe(h.detach())


def main_plus_probe(model, batch):
    x, y, domain = batch
    main, probe = model(x)
    return F.cross_entropy(main, y) + F.cross_entropy(probe, domain)


@healthy("hx_linear_probe_detached_on_purpose", "Main classifier trains the encoder; a linear probe reads "
         "h.detach() on purpose (a diagnostic that must not shape the representation), its loss added to the total.")
def hx_probe():
    seed(0)
    x, y = teacher_classes(1600, 20, 5, 64)
    domain = (x[:, 0] > 0).long()
    model = EncoderWithProbe()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1300], y[:1300], domain[:1300]), 32),
                val_loader=loader(TensorDataset(x[1300:], y[1300:], domain[1300:]), 100, shuffle=False),
                loss_fn=main_plus_probe, max_steps=200)

# --- 4. subword tagger: correct custom autograd Function, -100 on continuations, class weights by id ----------------------


class ScaledSoftsign(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x / (1 + x.abs())

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output / (1 + x.abs()) ** 2


class SubwordTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(70, 32)
        self.conv = nn.Conv1d(32, 48, 3, padding=1)
        self.out = nn.Linear(48, 4)

    def forward(self, x):
        h = self.conv(self.emb(x).transpose(1, 2)).transpose(1, 2)
        return self.out(ScaledSoftsign.apply(h))


@healthy("hx_subword_tagger_custom_fn_minus_100", "Tagger over subword pieces: only each word's first piece is "
         "labelled (continuations -100), a custom autograd softsign with a correct backward, CrossEntropyLoss with "
         "inverse-frequency class weights indexed by class id and label_smoothing=0.05.")
def hx_subword():
    seed(0)
    g = gen(65)
    n, length = 1400, 14
    x = torch.randint(0, 60, (n, length), generator=g)
    y = x % 4
    cont = torch.rand(n, length, generator=g) < 0.3
    cont[:, 0] = False
    x[cont] = 60 + x[cont] % 10                   # '##' pieces
    y[cont] = -100
    counts = torch.bincount(y[y >= 0], minlength=4).float()
    weights = counts.sum() / (4 * counts)
    model = SubwordTagger()
    criterion = nn.CrossEntropyLoss(weight=weights, ignore_index=-100, label_smoothing=0.05)

    def loss_fn(m, batch):
        tokens, tags = batch
        return criterion(m(tokens).reshape(-1, 4), tags.reshape(-1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1100], y[:1100]), 32),
                val_loader=loader(TensorDataset(x[1100:], y[1100:]), 100, shuffle=False),
                loss_fn=loss_fn, max_steps=200)

# --- 5. log1p target with a softplus head, Huber loss, warm restarts counted in steps, accumulation ------------------------


class CountForecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1), nn.Softplus())

    def forward(self, x):
        return self.net(x).squeeze(-1)            # predicts log1p(visits) >= 0


@healthy("hx_log1p_softplus_warm_restarts", "Visit counts forecast on the log1p scale with a Softplus output and "
         "HuberLoss; CosineAnnealingWarmRestarts with T_0=50 optimizer steps stepped per step; accumulation_steps=2.")
def hx_counts():
    seed(0)
    g = gen(66)
    x = torch.randn(1600, 10, generator=g)
    rate = torch.exp(1.5 + 0.8 * x[:, 0] - 0.5 * x[:, 1])
    visits = torch.poisson(rate, generator=g)
    y = torch.log1p(visits)
    model = CountForecaster()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=50, eta_min=1e-4)
    return dict(model=model, optimizer=opt, scheduler=sched,
                train_loader=loader(TensorDataset(x[:1300], y[:1300]), 32),
                val_loader=loader(TensorDataset(x[1300:], y[1300:]), 100, shuffle=False),
                loss_fn=nn.HuberLoss(delta=1.0), accumulation_steps=2, max_steps=200)
