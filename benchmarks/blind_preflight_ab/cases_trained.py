"""Set ab, family "what_is_trained": the parameters the task needs are not the ones being updated."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ab.cases_targets import DictRows
from benchmarks.blind_preflight_ab.registry import acc_of, case, fix, fixed_of, gen, loader, mean_over, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------
# 1. Tiny BERT: frozen, optimizer built on the trainable params, then the top layer is unfrozen (optimizer kept).
# --------------------------------------------------------------------------------------------------------------

def _ticket_tokens(n, s):
    """Support tickets: ids 4..59; 'urgent' when alarm words (4..11) outnumber calm words (12..19)."""
    g = gen(s)
    ids = torch.randint(4, 60, (n, 16), generator=g)
    alarm = ((ids >= 4) & (ids <= 11)).sum(1)
    calm = ((ids >= 12) & (ids <= 19)).sum(1)
    keep = alarm != calm
    ids = ids[keep]
    ids[:, 0] = 2                                   # [CLS]
    return ids, (alarm[keep] > calm[keep]).long()


def _tiny_bert_classifier(num_labels=2):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     num_labels=num_labels, pad_token_id=0)
    return BertForSequenceClassification(cfg)


def bert_unfreeze_after_optimizer(fixed=False):
    seed(0)
    ids, y = _ticket_tokens(1600, 12)
    model = _tiny_bert_classifier()
    for p in model.bert.parameters():               # stage 1: the "pretrained" encoder frozen
        p.requires_grad = False
    if not fixed:
        optimizer = torch.optim.AdamW(filter(lambda p: p.requires_grad, model.parameters()), lr=2e-3)
    for p in model.bert.encoder.layer[-1].parameters():   # stage 2: fine-tune the top layer and the pooler too
        p.requires_grad = True
    for p in model.bert.pooler.parameters():
        p.requires_grad = True
    if fixed:
        optimizer = torch.optim.AdamW(filter(lambda p: p.requires_grad, model.parameters()), lr=2e-3)
    mask = torch.ones_like(ids)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(DictRows(input_ids=ids[:1200], attention_mask=mask[:1200], labels=y[:1200]), 32),
                val_loader=loader(DictRows(input_ids=ids[1200:], attention_mask=mask[1200:], labels=y[1200:]), 100,
                                  shuffle=False),
                loss_fn=None, max_steps=300)


case("trained_bert_unfreeze_after_optimizer", "what_is_trained",
     "The encoder's top layer and pooler are unfrozen (requires_grad=True) after the AdamW optimizer was built on "
     "filter(lambda p: p.requires_grad, ...), so they are not in its param_groups: they get gradients but are never "
     "updated, and only the classifier trains on frozen random features; rebuild the optimizer (or "
     "add_param_group) after unfreezing.",
     r"not in (the |any )?(optimi[sz]er|param_groups?)|(missing|absent) from (the )?(optimi[sz]er|param_groups?)|"
     r"add_param_group|(rebuild|re-?create|re-?construct|recreate) (the )?optimi[sz]er|"
     r"optimi[sz]er (was )?(built|created|constructed) (before|earlier)|stale param_groups|"
     r"(get|have|receive)s? grad\w* but (are |is )?(never|not) (updated|stepped)|"
     r"requires_grad=true .{0,60}(not|never) (in|updated|optimi)")(bert_unfreeze_after_optimizer)


@torch.no_grad()
def _hf_cls_acc(model, kw):
    def fn(m, b):
        logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        return (logits.argmax(-1) == b["labels"]).sum().item(), len(b["labels"])
    return mean_over(model, kw["val_loader"], fn)


fix("trained_bert_unfreeze_after_optimizer", fixed_of(bert_unfreeze_after_optimizer), _hf_cls_acc, "val accuracy",
    steps=300)


# --------------------------------------------------------------------------------------------------------------
# 2. Three task heads made with nn.ModuleList([nn.Linear(64, 1)] * 3): one layer listed three times.
# --------------------------------------------------------------------------------------------------------------

class PlantMultiTask(nn.Module):
    def __init__(self, separate: bool):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        if separate:
            self.heads = nn.ModuleList([nn.Linear(64, 1) for _ in range(3)])
        else:
            self.heads = nn.ModuleList([nn.Linear(64, 1)] * 3)
        self.n_tasks = 3

    def forward(self, x):
        h = self.trunk(x)
        return torch.cat([head(h) for head in self.heads], 1)       # (B, 3): yield, moisture, energy


def _plant(n, s):
    g = gen(s)
    x = torch.randn(n, 12, generator=g)
    y = torch.stack([torch.tanh(x[:, 0] + x[:, 1]) * 2, -x[:, 2] + 0.5 * x[:, 3], x[:, 4] * x[:, 5] * 0.8], 1)
    return x, y + 0.05 * torch.randn(n, 3, generator=g)


def shared_task_heads(fixed=False):
    seed(0)
    x, y = _plant(2400, 13)
    model = PlantMultiTask(separate=fixed)

    def loss_fn(model, batch):
        xb, yb = batch
        out = model(xb)
        return sum(F.mse_loss(out[:, k], yb[:, k]) for k in range(3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


case("trained_shared_task_heads", "what_is_trained",
     "The three task heads are built as nn.ModuleList([nn.Linear(64, 1)] * 3): list multiplication repeats the same "
     "layer object, so the 'three' heads share one weight and always output the same number for yield, moisture "
     "and energy; build one layer per task ([nn.Linear(64, 1) for _ in range(3)]).",
     r"\]\s*\*\s*3|list multiplication|same (layer|module|object|instance|head|weight)s?|"
     r"(shar|ti)(e|ed|es|ing) (one |the same |a single )?(weight|parameter|layer|module|head)s?|"
     r"(identical|duplicate[sd]?) (heads?|outputs?|columns?|modules?|parameters?)|is (the )?same object|"
     r"for _ in range|(heads?|outputs?) (are|is) (identical|the same)")(shared_task_heads)

fix("trained_shared_task_heads", fixed_of(shared_task_heads),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE over 3 tasks", steps=300, higher=False)


# --------------------------------------------------------------------------------------------------------------
# 3. Basket-spend regressor with nn.Embedding(padding_idx=0) while product 0 is a real (best-selling) product.
# --------------------------------------------------------------------------------------------------------------

N_PRODUCTS = 30


def _baskets(n, s):
    g = gen(s)
    probs = torch.full((N_PRODUCTS,), 1.0)
    probs[0] = 6.0                                   # product 0: the best seller, and the priciest
    items = torch.multinomial(probs.expand(n, -1), 5, replacement=True, generator=g)
    price = torch.rand(N_PRODUCTS, generator=g) * 2 + 1
    price[0] = 9.0
    spend = price[items].sum(1) + 0.2 * torch.randn(n, generator=g)
    return items, spend


class BasketNet(nn.Module):
    def __init__(self, pad: bool):
        super().__init__()
        self.emb = nn.Embedding(N_PRODUCTS, 16, padding_idx=0 if pad else None)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, items):                        # (B, 5) product codes 0..29
        return self.mlp(self.emb(items).sum(1))[:, 0]


def basket_padding_idx(fixed=False):
    seed(0)
    items, spend = _baskets(3000, 14)
    model = BasketNet(pad=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(items[:2500], spend[:2500]), 32),
                val_loader=loader(TensorDataset(items[2500:], spend[2500:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


case("trained_embedding_padding_idx_real_id", "what_is_trained",
     "The product embedding is built with nn.Embedding(..., padding_idx=0) by habit, but the baskets have no padding "
     "and product code 0 is the best-selling, priciest product: its row stays the zero vector and gets no gradient, "
     "so the model cannot tell a basket with product 0 from one without; drop padding_idx (or shift codes so 0 is "
     "free).",
     r"padding_idx|(row|vector|embedding) (0|zero) .{0,60}(never|not|no) (updated|trained|"
     r"gradient)|(code|id|index|category|product) 0 (is )?(a )?real|zero vector")(basket_padding_idx)

fix("trained_embedding_padding_idx_real_id", fixed_of(basket_padding_idx), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val spend RMSE", steps=300, higher=False)


# --------------------------------------------------------------------------------------------------------------
# 4. Discriminative learning rates split by parameter name: 'classifier' in n, but the new head is called 'head'.
# --------------------------------------------------------------------------------------------------------------

class SensorNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 5)                 # the new task's head

    def forward(self, x):
        return self.head(self.encoder(x))


def _pretrained_sensor_encoder(net):
    """The 'pretrained' encoder: fitted to reconstruct-ish an older regression target for a few steps."""
    g = gen(31)
    x = torch.randn(1500, 24, generator=g)
    y = x @ torch.randn(24, 64, generator=g) / 5
    proj = nn.Linear(64, 64)
    opt = torch.optim.Adam(list(net.encoder.parameters()) + list(proj.parameters()), lr=3e-3)
    for i in range(100):
        sl = slice((i * 100) % 1500, (i * 100) % 1500 + 100)
        opt.zero_grad()
        F.mse_loss(proj(net.encoder(x[sl])), y[sl]).backward()
        opt.step()


def param_groups_name_mismatch(fixed=False):
    seed(0)
    model = SensorNet()
    _pretrained_sensor_encoder(model)
    g = gen(15)
    x = torch.randn(2000, 24, generator=g)
    y = (x[:, :5] * 1.5 + x[:, 5:10]).argmax(1)
    key = "head" if fixed else "classifier"
    groups = [{"params": [p for n, p in model.named_parameters() if key not in n], "lr": 1e-5},
              {"params": [p for n, p in model.named_parameters() if key in n], "lr": 2e-3}]
    return dict(model=model, optimizer=torch.optim.AdamW(groups, weight_decay=0.01),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("trained_param_groups_name_mismatch", "what_is_trained",
     "The discriminative learning rates are split by name ('classifier' in n gets 2e-3, everything else the "
     "backbone's 1e-5), but the new head is called 'head', so the head lands in the 1e-5 backbone group and the "
     "2e-3 group is empty: the freshly initialised head barely moves; match the head's real name.",
     r"empty (param(eter)?[ _]?)?group|group .{0,40}(no|zero|0) param|(head|classifier).{0,80}(1e-5|1e-05|0\.00001|"
     r"backbone('s)? (lr|learning rate)|smallest (lr|learning rate))|(1e-5|1e-05).{0,80}(head|new layer|classifier)|"
     r"(name|string) (filter|match)|named_parameters|'classifier'|\"classifier\"|"
     r"(new|fresh\w*|randomly initiali[sz]ed) (head|layer|classifier).{0,60}(tiny|small|low) (lr|learning rate)")(
    param_groups_name_mismatch)

fix("trained_param_groups_name_mismatch", fixed_of(param_groups_name_mismatch),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------------------------
# 5. Gradual unfreezing written as block.requires_grad = True (a plain attribute on the Module).
# --------------------------------------------------------------------------------------------------------------

class BlockNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 96), nn.ReLU()),
                                     nn.Sequential(nn.Linear(96, 6), nn.ReLU())])
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def module_requires_grad_attr(fixed=False):
    seed(0)
    model = BlockNet()
    model.blocks.requires_grad_(False)             # the "pretrained" blocks frozen
    if fixed:
        model.blocks[-1].requires_grad_(True)
    else:
        model.blocks[-1].requires_grad = True      # "unfreeze the top block"
    g = gen(16)
    x = torch.randn(2000, 16, generator=g)
    y = (torch.stack([x[:, 0] * x[:, 1], x[:, 2] - x[:, 3], torch.sin(2 * x[:, 4])], 1)).argmax(1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("trained_module_requires_grad_attr", "what_is_trained",
     "The top block is 'unfrozen' with model.blocks[-1].requires_grad = True, which only sets a new attribute on the "
     "Module object and leaves its parameters at requires_grad=False, so only the 6-input head trains on the frozen "
     "random 6-unit bottleneck; call model.blocks[-1].requires_grad_(True) or loop over .parameters().",
     r"requires_grad_\(|(attribute|flag) on the (module|nn\.module)|(module|block)\.requires_grad ?=|"
     r"(loop|iterate) over (its |the )?(\.)?parameters|(still|remain|stay)s? (have |has |at )?(frozen|requires_grad ?= ?false)|"
     r"(no|none of the|zero) (trainable|unfrozen) param\w* in (the )?(backbone|blocks?|encoder|top)|"
     r"(frozen|untrained|not trained) (backbone|encoder|blocks?|bottleneck|top block)")(module_requires_grad_attr)

fix("trained_module_requires_grad_attr", fixed_of(module_requires_grad_attr),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)
