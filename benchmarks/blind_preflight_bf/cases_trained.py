"""What is trained: embedding tables and towers that the optimizer never updates, or updates as the wrong rows."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_bf.cases_targets import TwoTower, two_tower_case
from benchmarks.blind_preflight_bf.registry import MF, BPRPairs, bpr_loss, case, implicit, loader, on, seed


def bpr_case(model, tr, va, seen, n_items=400, lr=0.02, opt=None):
    val = loader(TensorDataset(*va), 256, shuffle=False)
    val.seen = seen
    return dict(model=model, optimizer=opt or torch.optim.Adam(model.parameters(), lr=lr),
                train_loader=loader(BPRPairs(*tr, n_items), 64), loss_fn=bpr_loss, val_loader=val)


@case("mf_tables_from_pretrained_frozen", "what_is_trained",
      "The user and item tables are warm-started with nn.Embedding.from_pretrained(init), whose default "
      "freeze=True leaves both factor tables frozen, so the BPR model only learns its item biases (popularity) and "
      "never any personal preference; pass freeze=False.",
      r"from_pretrained|freeze\s*=|embedding (tables?|weights?|factors?).{0,60}(frozen|not (trained|updated)|requires_grad)|"
      r"(user|item).{0,40}(table|embedding|factor)s?.{0,60}(frozen|never (trained|updated|learn))")
def mf_tables_from_pretrained_frozen(fixed=False):
    seed(0)
    tr, va, seen = implicit(s=12)
    model = MF(100, 400, biases=True)
    g = torch.Generator().manual_seed(5)
    model.user = nn.Embedding.from_pretrained(0.1 * torch.randn(100, 16, generator=g), freeze=not fixed)
    model.item = nn.Embedding.from_pretrained(0.1 * torch.randn(400, 16, generator=g), freeze=not fixed)
    return bpr_case(model, tr, va, seen)


class NoGradItemTower(TwoTower):
    def __init__(self, *a, fixed=False, **kw):
        super().__init__(*a, **kw)
        self.fixed = fixed

    def items(self, i):
        with torch.enable_grad() if self.fixed else torch.no_grad():
            return self.item_tower(i)


def in_batch_loss(model, batch):
    u, i = on(model, batch)
    logits = model.users(u) @ model.items(i).T
    return nn.functional.cross_entropy(logits, torch.arange(len(u), device=logits.device))


@case("two_tower_item_tower_under_no_grad", "what_is_trained",
      "The two-tower model computes the item embeddings inside torch.no_grad() (as in the code that precomputes the "
      "retrieval index), so the item tower gets no gradient and stays at its random init while only the user tower "
      "trains; compute the item side with gradients during training.",
      r"no_grad|item.(tower|side|embeddings?|encoder).{0,80}(no grad|not (trained|updated)|never (trained|updated)|"
      r"frozen|random|detach)|(gradient|grad)s?.{0,60}item.(tower|side)|detach")
def two_tower_item_tower_under_no_grad(fixed=False):
    return two_tower_case(NoGradItemTower, in_batch_loss, fixed=fixed)


class JointTable(nn.Module):
    """Users and items in one embedding table: rows [0, U) users, rows [U, U + I) items."""

    def __init__(self, n_users, n_items, d=16, fixed=False):
        super().__init__()
        self.table = nn.Embedding(n_users + n_items, d)
        nn.init.normal_(self.table.weight, std=0.1)
        self.n_users, self.n_items, self.fixed = n_users, n_items, fixed

    def item_rows(self, i):
        return i + self.n_users if self.fixed else i

    def score(self, u, i):
        return (self.table(u) * self.table(self.item_rows(i))).sum(-1)

    def score_all(self, u):
        return self.table(u) @ self.table(self.item_rows(torch.arange(self.n_items))).T


@case("joint_table_item_ids_not_offset", "what_is_trained",
      "Users and items share one nn.Embedding of n_users + n_items rows, but item ids are looked up without adding "
      "n_users, so item i trains user i's row and the item rows are never used; offset the item ids by n_users.",
      r"offset|n_users|num_users|(item|user).{0,40}(share|collid|overlap|same row)|(shar|collid)\w*.{0,40}"
      r"(row|table|embedding)|item rows?.{0,40}(never|unused)")
def joint_table_item_ids_not_offset(fixed=False):
    seed(0)
    tr, va, seen = implicit(n_users=150, n_items=150, per_user=12, s=13)
    return bpr_case(JointTable(150, 150, fixed=fixed), tr, va, seen, n_items=150)


@case("item_table_replaced_after_optimizer", "what_is_trained",
      "The item table is replaced by a new nn.Embedding sized for the grown catalogue after the Adam optimizer was "
      "built over model.parameters(), so the optimizer keeps updating the old, detached table and the new item "
      "embeddings stay random; build the optimizer after resizing the table.",
      r"(replac|re.?creat|resiz|swap|reassign)\w*.{0,80}after.{0,60}optimi[sz]er|"
      r"optimi[sz]er.{0,80}(old|stale|detached|previous|replaced|original) (table|embedding|param|weight|module)|"
      r"optimi[sz]er (was |is )?(built|created|constructed) (before|too early)|(build|create|construct) the optimi[sz]er after|"
      r"stale param|(new|replaced|resized) (item )?(table|embedding)s?.{0,80}(not|never) (in|registered|updated|trained)")
def item_table_replaced_after_optimizer(fixed=False):
    seed(0)
    tr, va, seen = implicit(s=14)
    model = MF(100, 300)
    opt = None if fixed else torch.optim.Adam(model.parameters(), lr=0.02)
    model.item = nn.Embedding(400, 16)  # the catalogue grew to 400 items
    nn.init.normal_(model.item.weight, std=0.1)
    return bpr_case(model, tr, va, seen, opt=opt or torch.optim.Adam(model.parameters(), lr=0.02))


@case("param_groups_name_filter_misses_items", "what_is_trained",
      "The optimizer's param groups are built by name filters, the factor group with n.startswith(\"user\") and the "
      "bias group with n.startswith(\"b\"), so the item factor table (named item) is in neither group and keeps its "
      "random init; include the item table in the factor group.",
      r"startswith|named_parameters|name (filter|match|prefix)|param(eter)? groups?.{0,100}(item|miss|left out|omit|neither)|"
      r"item.{0,20}(table|embeddings?|factors?).{0,100}(never (updated|trained)|random init|no (param )?group|neither)")
def param_groups_name_filter_misses_items(fixed=False):
    seed(0)
    tr, va, seen = implicit(s=15)
    model = MF(100, 400, biases=True)
    factors = [p for n, p in model.named_parameters() if n.startswith(("user", "item") if fixed else "user")]
    biases = [p for n, p in model.named_parameters() if n.startswith("b") or n == "mu"]
    opt = torch.optim.Adam([{"params": factors, "weight_decay": 1e-6}, {"params": biases, "weight_decay": 0.0}],
                           lr=0.02)
    return bpr_case(model, tr, va, seen, opt=opt)
