"""HostBoundsGuard: an index out of range raises on the host, before a kernel that would
assert on the device (and lose the process's CUDA context) is launched.

On this machine the guard is pointed at the CPU, so each op would also raise by itself: the
tests read the traceback to tell that the guard raised, before the op ran. The tests marked
``gpu`` run the whole preflight on CUDA with probes that index past a table.
"""

from __future__ import annotations

import traceback
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.framework.check import Check
from optimus_preflight.preflight.framework.device_bounds import HostBoundsGuard
from optimus_preflight.preflight.framework.execution import _bounds_guard
from optimus_preflight.preflight.framework.issues import Severity, Stage


def refused_by_guard(op) -> Exception:
    """The error ``op`` raised under a CPU guard; fails unless the guard raised it."""
    with pytest.raises(Exception) as raised, HostBoundsGuard(("cpu",)):
        op()
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert frames[-1].name == "__torch_function__" and "refused" in frames[-1].line, (
        f"the op raised by itself, not the guard: {raised.value!r}")
    return raised.value


def passes(op) -> None:
    with HostBoundsGuard(("cpu",)):
        op()


def test_embedding_ids_past_the_table_are_refused_with_the_cpu_error():
    table = nn.Embedding(10, 4)
    error = refused_by_guard(lambda: table(torch.tensor([[1, 10]])))
    assert isinstance(error, IndexError) and str(error) == "index out of range in self"
    refused_by_guard(lambda: table(torch.tensor([[-1, 2]])))
    passes(lambda: table(torch.tensor([[0, 9]])))


def test_subscripts_follow_the_dimensions_they_index():
    x = torch.randn(5, 3)
    error = refused_by_guard(lambda: x[torch.tensor([5])])
    assert isinstance(error, IndexError) and "index 5 is out of bounds for dimension 0 with size 5" in str(error)
    refused_by_guard(lambda: x[torch.tensor([-6])])
    refused_by_guard(lambda: x[:, torch.tensor([3])])
    refused_by_guard(lambda: x[..., torch.tensor([3])])
    passes(lambda: x[torch.tensor([-5, 4])])  # negative indices wrap, as in Python
    passes(lambda: x[None, torch.tensor([4]), 0])  # None adds a dimension and consumes none
    passes(lambda: x[..., torch.tensor([2])])
    passes(lambda: x[x > 0])  # a boolean mask is not an index range

    def assign():
        x[torch.tensor([7])] = 0.0

    refused_by_guard(assign)


def test_class_targets_past_the_logits_are_refused_and_ignored_ones_pass():
    logits = torch.randn(4, 3)
    error = refused_by_guard(lambda: F.cross_entropy(logits, torch.tensor([0, 1, 2, 3])))
    assert isinstance(error, IndexError) and str(error) == "Target 3 is out of bounds."
    refused_by_guard(lambda: nn.NLLLoss()(logits.log_softmax(1), torch.tensor([0, -1, 2, 1])))
    passes(lambda: F.cross_entropy(logits, torch.tensor([0, 1, 2, -100])))
    passes(lambda: F.cross_entropy(logits, torch.tensor([0, 1, 2, 7]), ignore_index=7))
    passes(lambda: F.cross_entropy(logits, logits.softmax(1)))  # probability targets hold no class index
    passes(lambda: F.cross_entropy(torch.randn(4, 3, 6), torch.randint(0, 3, (4, 6))))


def test_gather_scatter_take_one_hot_and_probabilities():
    x = torch.randn(5, 3)
    assert isinstance(refused_by_guard(lambda: x.gather(1, torch.tensor([[3]]))), RuntimeError)
    refused_by_guard(lambda: torch.zeros(3).scatter_add(0, torch.tensor([4]), torch.ones(1)))
    refused_by_guard(lambda: torch.zeros(3).index_add_(0, torch.tensor([3]), torch.ones(1)))
    refused_by_guard(lambda: x.index_select(0, torch.tensor([7])))
    refused_by_guard(lambda: torch.take(x, torch.tensor([15])))
    refused_by_guard(lambda: F.one_hot(torch.tensor([3]), 3))
    error = refused_by_guard(lambda: F.binary_cross_entropy(torch.tensor([1.5, 0.2]), torch.rand(2)))
    assert "between 0 and 1" in str(error)
    passes(lambda: x.gather(1, torch.tensor([[2]])))
    passes(lambda: torch.take(x, torch.tensor([-15, 14])))
    passes(lambda: F.binary_cross_entropy(torch.rand(4), torch.rand(4)))


def test_values_it_cannot_read_pass_through_untouched():
    x = torch.randn(5, 3)
    with FakeTensorMode():
        fake, index = torch.randn(5, 3), torch.tensor([9])
    passes(lambda: fake[index])  # the memory estimate's fake tensors: no values to read
    passes(lambda: torch.func.vmap(lambda row: row[torch.tensor([1])])(x))


class Untimed(Check, abstract=True):
    name = "test.untimed"
    stage = Stage.STEP


class Timed(Untimed, abstract=True):
    timed = True


def test_checks_on_an_accelerator_run_guarded_except_timed_ones_and_compiled_models():
    model = nn.Linear(2, 2)
    on_cuda = SimpleNamespace(device=torch.device("cuda"), model=model)
    with _bounds_guard(Untimed(), on_cuda):
        guard = torch.overrides._get_current_function_mode()
        assert isinstance(guard, HostBoundsGuard) and guard.device_types == ("cuda",)
    # what torch.compile returns: a wrapper holding the eager module as _orig_mod (not compiled
    # here: importing dynamo alone takes seconds)
    compiled = SimpleNamespace(_orig_mod=model)
    for check, ctx in ((Timed(), on_cuda), (Untimed(), SimpleNamespace(device=torch.device("cpu"), model=model)),
                       (Untimed(), SimpleNamespace(device=torch.device("cuda"), model=compiled))):
        with _bounds_guard(check, ctx):
            assert torch.overrides._get_current_function_mode() is None


class PositionalLM(nn.Module):
    """A decoder with a learned position table of ``block`` rows, like GPT-2's ``wpe``."""

    def __init__(self, vocab: int = 20, block: int = 12, width: int = 16) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(block, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.head(self.tokens(input_ids) + self.positions(positions))


def right_padded_batches(block: int, vocab: int, bad_target: bool = False):
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):
        ids = torch.randint(2, vocab, (8, block), generator=generator)
        for row, length in enumerate(torch.randint(block // 2, block + 1, (8,), generator=generator).tolist()):
            ids[row, length:] = 0
        labels = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)  # the next token
        labels[labels == 0] = -100
        if bad_target:
            labels[0, 0] = vocab + 3
        batches.append({"input_ids": ids, "labels": labels})
    return batches


def lm_loss(model, batch):
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)


@pytest.mark.gpu
def test_the_whole_preflight_on_cuda_survives_probes_past_the_position_table():
    # A padding-invariance probe widens the padding past the 12-row table: on CUDA without the
    # guard a device-side assert, after which every check and the state's restore failed.
    device = torch.device("cuda")
    model = PositionalLM().to(device)
    before = {k: v.cpu().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    report = run_preflight(model, optimizer, right_padded_batches(12, 20), loss_fn=lm_loss, max_steps=2000)
    crashed = [c for c in report.checks if c.status.value == "crashed"]
    assert not crashed, [(r.name, r.detail) for r in crashed]
    torch.cuda.synchronize()
    assert all(torch.equal(model.state_dict()[k].cpu(), v) for k, v in before.items())


@pytest.mark.gpu
def test_a_target_past_the_vocabulary_on_cuda_is_a_finding_not_a_lost_context():
    device = torch.device("cuda")
    model = PositionalLM().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    report = run_preflight(model, optimizer, right_padded_batches(12, 20, bad_target=True), loss_fn=lm_loss,
                           max_steps=2000)
    errors = " ".join(f"{issue.code} {issue.message}" for _, issue in report.issues(Severity.ERROR))
    assert "out of bounds" in errors or "TARGET" in errors, errors
    assert report.failed
    torch.cuda.synchronize()
    model(torch.zeros(2, 12, dtype=torch.long, device=device)).sum().item()  # the context still works


@pytest.mark.parametrize("bad_target", [False, True])
def test_the_whole_preflight_under_a_guard_reports_what_it_reports_without(monkeypatch, bad_target):
    # The guard pointed at the CPU, where every op also checks itself: no false refusal
    # anywhere in the checks, and the same findings (the probes' own IndexErrors included).
    def codes(guarded: bool) -> list[str]:
        torch.manual_seed(0)
        model = PositionalLM()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if guarded:
            monkeypatch.setattr("optimus_preflight.preflight.framework.execution.host_bounds_checked",
                                lambda device, model: HostBoundsGuard(("cpu",)))
        report = run_preflight(model, optimizer, right_padded_batches(12, 20, bad_target), loss_fn=lm_loss,
                               max_steps=2000)
        assert not [c.name for c in report.checks if c.status.value == "crashed"]
        # The throughput burst's share of time waiting for data follows the machine's load,
        # so its note comes and goes between two runs on a busy CI; the guard cannot cause it.
        return sorted(issue.code for check, issue in report.issues() if check.name != "step.throughput")

    assert codes(guarded=True) == codes(guarded=False)
