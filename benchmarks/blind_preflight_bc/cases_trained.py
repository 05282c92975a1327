"""Set bc, family "what_is_trained": hand-written LoRA adapters on a small "pretrained" Llama, and which parameters
the optimizer really updates."""

from __future__ import annotations

import math

import torch
from torch import nn

from benchmarks.blind_preflight_bc.registry import case, fix, fixed_of, loader, seed
from benchmarks.blind_preflight_bc.synth import InstructionSet, causal_answer_acc, causal_collate, hf_llama, make_pairs

_BASE: dict = {}


def pretrained_llama():
    """A tiny Llama 'pretrained' (150 steps) on the copy and rotate instructions; fine-tuning adds reversal."""
    if "sd" not in _BASE:
        g = torch.get_rng_state()
        torch.manual_seed(123)
        m = hf_llama()
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        rows = InstructionSet(make_pairs(3000, 77, ops=("cpy", "rot"))).rows
        for s in range(150):
            b = causal_collate(rows[(s * 32) % 2976:(s * 32) % 2976 + 32])
            loss = m(**b).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        _BASE["sd"] = {k: v.clone() for k, v in m.state_dict().items()}
        torch.set_rng_state(g)
    m = hf_llama()
    m.load_state_dict(_BASE["sd"])
    return m


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r: int = 8, alpha: float = 16, zero_both: bool = False):
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.zeros(r, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
        if not zero_both:
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scaling = alpha / r

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scaling


class Adapter(nn.Module):
    """Same low-rank update, a user's own naming (down / up)."""

    def __init__(self, base: nn.Linear, r: int = 8, alpha: float = 16):
        super().__init__()
        self.base = base
        self.down = nn.Linear(base.in_features, r, bias=False)
        self.up = nn.Linear(r, base.out_features, bias=False)
        nn.init.zeros_(self.up.weight)
        self.scaling = alpha / r

    def forward(self, x):
        return self.base(x) + self.up(self.down(x)) * self.scaling


TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")


def inject(model, make):
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name in TARGETS:
                if hasattr(parent, name):
                    setattr(parent, name, make(getattr(parent, name)))
    return model


def _sets():
    return (InstructionSet(make_pairs(2000, 0)), InstructionSet(make_pairs(256, 999)))


def _kw(model, params, lr=3e-3):
    train, val = _sets()
    return dict(model=model, optimizer=torch.optim.AdamW(params, lr=lr, weight_decay=0.0),
                train_loader=loader(train, 32, collate_fn=causal_collate), loss_fn=None,
                val_loader=loader(val, 64, shuffle=False, collate_fn=causal_collate), max_steps=300)


def _trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


# ---------------------------------------------------------------- 1
@case("tr_lora_both_zero", "what_is_trained",
      "Both LoRA matrices are initialised to zeros (lora_A and lora_B) 'so the adapter starts as a no-op': the "
      "gradient of each factor is proportional to the other, so both stay exactly zero and nothing is learned.",
      r"lora_a|lora_b|both (factors|matrices|low[- ]rank)|zero[- ]?init|init(ialis|ializ)ed? (to|with|as) zeros?|"
      r"kaiming|(gradient|grad)s? .{0,30}(are|stay|remain|is) (exactly )?zero|\bnever (updated|learns?)|"
      r"all[- ]zeros?")
def lora_both_zero(fixed=False):
    seed(0)
    model = inject(pretrained_llama(), lambda lin: LoRALinear(lin, 8, 16, zero_both=not fixed))
    return _kw(model, _trainable(model))


fix("tr_lora_both_zero", fixed_of(lora_both_zero), lambda m, kw: causal_answer_acc(m), "val answer next-token acc")


# ---------------------------------------------------------------- 2
@case("tr_lora_alpha_over_r", "what_is_trained",
      "The adapter uses r=64 with lora_alpha=1, so the update is scaled by alpha / r = 1/64: the low-rank update "
      "is ~64x too small for the learning rate and the adapters barely move the model in 300 steps.",
      r"lora_alpha|\balpha\b|\bscaling\b|1\s*/\s*64|0\.0156|\brank\b|(update|delta|adapter output)s? .{0,30}"
      r"(tiny|small|negligible|shrunk)|effective (learning rate|lr)")
def lora_alpha_over_r(fixed=False):
    seed(0)
    model = inject(pretrained_llama(), lambda lin: LoRALinear(lin, 64, 128 if fixed else 1))
    return _kw(model, _trainable(model))


fix("tr_lora_alpha_over_r", fixed_of(lora_alpha_over_r), lambda m, kw: causal_answer_acc(m),
    "val answer next-token acc")


# ---------------------------------------------------------------- 3
@case("tr_optimizer_before_lora", "what_is_trained",
      "The AdamW optimizer is built on model.parameters() before the LoRA adapters are injected (and the base "
      "frozen): the optimizer holds only the frozen base weights and the adapter parameters are never stepped.",
      r"(lora|adapter)\w* .{0,60}(not|never|missing|absent) .{0,30}optimi[sz]er|optimi[sz]er .{0,60}(before|"
      r"earlier) .{0,40}(lora|adapter|inject)|(re)?build the optimi[sz]er (after|once)|optimi[sz]er (only )?"
      r"holds? (only )?the frozen")
def optimizer_before_lora(fixed=False):
    seed(0)
    model = pretrained_llama()
    if fixed:
        inject(model, lambda lin: LoRALinear(lin, 8, 16))
        return _kw(model, _trainable(model))
    kw = _kw(model, model.parameters())
    inject(model, lambda lin: LoRALinear(lin, 8, 16))
    return kw


fix("tr_optimizer_before_lora", fixed_of(optimizer_before_lora), lambda m, kw: causal_answer_acc(m),
    "val answer next-token acc")


# ---------------------------------------------------------------- 4
@case("tr_lora_name_filter", "what_is_trained",
      "The parameters to train are picked by name ('lora' or 'norm' in the name), but the adapters are named "
      "down/up: no adapter weight matches, so only the RMSNorm gains are trained.",
      r"(adapter|lora)\w* .{0,40}(frozen|not trainable|never trained|excluded|don't match|do not match)|"
      r"name (filter|match)|filter .{0,40}(name|match)|match(es|ed)? no (adapter|lora)|only (the )?(rms)?norm|"
      r"down/up|'lora'")
def lora_name_filter(fixed=False):
    seed(0)
    model = inject(pretrained_llama(), lambda lin: Adapter(lin, 8, 16))
    keys = ("down", "up", "norm") if fixed else ("lora", "norm")
    for n, p in model.named_parameters():
        p.requires_grad_(any(k in n for k in keys))
    return _kw(model, [p for p in model.parameters() if p.requires_grad])


fix("tr_lora_name_filter", fixed_of(lora_name_filter), lambda m, kw: causal_answer_acc(m),
    "val answer next-token acc")


# ---------------------------------------------------------------- 5
@case("tr_freeze_after_inject", "what_is_trained",
      "model.requires_grad_(False) is called after the LoRA adapters were injected (to freeze the base), which "
      "freezes the adapters too; only the re-enabled lm_head (tied to the input embeddings) is trained.",
      r"requires_grad_?\(False\) .{0,40}after|freez(e|es|ing|ed) .{0,40}(after|adapters|lora)|froze .{0,20}"
      r"(the )?(adapters|lora)|(adapter|lora)s? .{0,30}(frozen|not trainable|never (trained|updated))|\border\b|"
      r"only (the )?(lm_head|head|embedding)|no (lora|adapter) param")
def freeze_after_inject(fixed=False):
    seed(0)
    model = pretrained_llama()
    if fixed:
        inject(model, lambda lin: LoRALinear(lin, 8, 16))
    else:
        for layer in model.model.layers:
            for parent in (layer.self_attn, layer.mlp):
                for name in TARGETS:
                    if hasattr(parent, name):
                        setattr(parent, name, LoRALinear(getattr(parent, name), 8, 16))
        model.requires_grad_(False)
    model.lm_head.requires_grad_(True)
    return _kw(model, _trainable(model))


fix("tr_freeze_after_inject", fixed_of(freeze_after_inject), lambda m, kw: causal_answer_acc(m),
    "val answer next-token acc")
