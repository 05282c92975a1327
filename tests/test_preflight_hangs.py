"""No preflight check waits on user data code without a timeout (issue 11, part A).

For every shape of hang (a worker's or the main process's ``__getitem__``, an
IterableDataset's blocking ``__iter__`` with 0 and 2 workers, a collate_fn, a
worker_init_fn) and for hangs that only show up after the first batch (in the shape
scan, the dataset-cache scan, the throughput burst, the LR range test), the whole
``optimus-train preflight.only=true`` run ends within one timeout plus 5 s, exits 3,
names the frame that blocks, and leaves no worker process or non-daemon thread.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from torch.utils.data import DataLoader, IterableDataset

from optimus_preflight import compose
from optimus_preflight.compat.credit import check_dataloader_startup
from optimus_preflight.preflight.data_access.fetch import GuardedBatches
from tests import hang_recipes
from tests.conftest import REPO, CliResult, run_cli, tiny_config

TIMEOUT = 2  # preflight.first_batch_timeout_s for the CLI runs
OUTER = TIMEOUT + 60  # the whole process, imports included, on a loaded machine
PARALLEL_RUNS = 3  # CLI runs at once: each mostly waits on its hang


@dataclass(frozen=True)
class Case:
    recipe: str
    check: str  # the check that meets the hang and reports it
    function: str  # the user function whose frame must be named
    overrides: tuple[str, ...] = ()
    skipped_after: tuple[str, ...] = ()  # later checks that must skip instead of waiting again
    # Whether the fix may suggest num_workers=0: not for a loader already in one process,
    # nor for a worker_init_fn (num_workers=0 only skips it).
    one_process_hint: bool = False


CASES = {
    "worker_getitem": Case("WorkerGetitem", "data.first_batch", "__getitem__", one_process_hint=True),
    "main_getitem": Case("MainGetitem", "data.first_batch", "__getitem__"),
    "iterable_iter_0_workers": Case("IterMain", "data.first_batch", "__iter__"),
    "iterable_iter_2_workers": Case("IterWorkers", "data.first_batch", "__iter__", one_process_hint=True),
    "collate_fn": Case("Collate", "data.first_batch", "sleepy_collate"),
    "worker_init_fn": Case("InitFn", "data.first_batch", "sleepy_init"),
    # After the first batch arrived:
    "shape_scan_sample": Case("ScanHang", "data.collate", "__getitem__", skipped_after=("step.throughput",)),
    "burst_batch_2_worker": Case("BurstHangWorker", "step.throughput", "__getitem__", one_process_hint=True),
    # In this process (the burst's main-process path is also run in-process below).
    "cache_scan_sample": Case("BurstHangMain", "data.collate_order", "__getitem__", skipped_after=("step.throughput",)),
    "lr_finder_batch_2": Case("LRFinderHang", "step.lr_finder", "__call__", ("preflight.lr_finder=true",),
                              skipped_after=("step.throughput",)),
}


@dataclass
class Outcome:
    result: CliResult | None  # None: the process outlived OUTER and was killed
    wall_s: float
    pids: list[int]  # of the processes the hanging code ran in


def _recorded_pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _run_case(case: Case, directory: Path) -> Outcome:
    pids = directory / "pids"
    started = time.monotonic()
    try:
        result = run_cli(directory / "run", "recipe=char_lm_tiny", f"recipe._target_=tests.hang_recipes.{case.recipe}",
                         "preflight.only=true", f"preflight.first_batch_timeout_s={TIMEOUT}", *case.overrides,
                         cwd=REPO, timeout=OUTER, env={"HANG_PIDS": str(pids)})
    except subprocess.TimeoutExpired:
        _kill(_recorded_pids(pids))  # the test fails; do not leave hour-long sleepers behind
        result = None
    return Outcome(result, time.monotonic() - started, _recorded_pids(pids))


@pytest.fixture(scope="module")
def cli_runs(request, tmp_path_factory) -> dict[str, Future]:
    """The selected CLI cases, started a few at a time, each test waits for its own."""
    selected = dict.fromkeys(
        item.callspec.params["cli_case"] for item in request.session.items
        if item.module is request.module and "cli_case" in getattr(getattr(item, "callspec", None), "params", {})
    )
    with ThreadPoolExecutor(max_workers=PARALLEL_RUNS) as pool:
        yield {name: pool.submit(_run_case, CASES[name], tmp_path_factory.mktemp(name)) for name in selected}


def _gone(pids: list[int], wait_s: float = 10.0) -> list[int]:
    """The pids still alive after waiting up to ``wait_s`` for them to exit."""
    deadline = time.monotonic() + wait_s
    alive = [pid for pid in pids if psutil.pid_exists(pid)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if psutil.pid_exists(pid)]
    return alive


@pytest.mark.slow
@pytest.mark.parametrize("cli_case", list(CASES))
def test_a_hang_ends_the_whole_preflight_within_one_timeout_naming_its_frame(cli_runs, cli_case):
    case = CASES[cli_case]
    outcome: Outcome = cli_runs[cli_case].result()
    assert outcome.result is not None, f"optimus-train still running after {OUTER} s"
    result = outcome.result
    assert outcome.pids, "the data code never ran: the case tests nothing"
    left = _gone(outcome.pids)
    _kill(left)
    assert not left, f"processes that ran the hanging code are still alive: {left}"
    assert result.returncode == 3, result.output[-3000:]

    report = json.loads((result.run_dir / "preflight.json").read_text())
    assert report["status"] == "failed"
    checks = {check["name"]: check for check in report["checks"]}
    hit = checks[case.check]
    # The hang costs one timeout, once: one check waits for it and reports it; every later
    # check that would read the data skips, naming it, instead of waiting again.
    timed_out = [name for name, check in checks.items() if any(i["code"] == "DATA_TIMEOUT" for i in check["issues"])]
    assert timed_out == [case.check], checks
    assert hit["status"] == "error" and [i["code"] for i in hit["issues"]] == ["DATA_TIMEOUT"], hit
    frame = 'hang_recipes.py", line'
    named = f"in {case.function}: time.sleep(HANG_S)"
    message = hit["issues"][0]["message"]
    assert frame in message and named in message, message
    assert named in result.output  # the console names it too
    fix = hit["issues"][0]["fix"]
    assert "data.num_workers" not in fix  # the recipes build their own DataLoader: that key does nothing
    assert ("num_workers=0" in fix) == case.one_process_hint, fix
    if case.check != "data.first_batch":  # the hang came after the first batch
        assert checks["data.first_batch"]["status"] == "passed"
    for later in case.skipped_after:
        assert checks[later]["status"] == "skipped" and f"hung in {case.check}" in checks[later]["detail"], checks[later]


def _non_daemon_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if not thread.daemon}


@pytest.mark.parametrize("recipe_class", [hang_recipes.WorkerGetitem, hang_recipes.BurstHangMain])
def test_the_public_api_leaves_no_thread_or_worker_behind(tmp_path, recipe_class):
    timeout = 1.5
    cfg = compose(["recipe=char_lm_tiny", "logging.progress=none", f"preflight.first_batch_timeout_s={timeout}"])
    recipe = recipe_class(cfg, run_dir=tmp_path / "run")
    recipe.setup()
    threads, children = _non_daemon_threads(), {child.pid for child in psutil.Process().children(recursive=True)}
    report = recipe.preflight()  # the data sleeps an hour: returning at all is the bound
    assert report.failed
    assert _non_daemon_threads() <= threads
    assert not _gone([child.pid for child in psutil.Process().children(recursive=True) if child.pid not in children])


class BlocksInIter:
    """Not a DataLoader at all: any object whose __iter__ blocks (until the test ends)."""

    num_workers = 0

    def __init__(self, release: threading.Event):
        self.release = release

    def __iter__(self):
        self.release.wait(3600)  # the frame check_dataloader_startup must name
        return iter([])


class BlockingIterable(IterableDataset):
    def __init__(self, release: threading.Event):
        self.release = release

    def __iter__(self):
        self.release.wait(3600)  # the frame check_dataloader_startup must name
        return iter([])


@pytest.fixture
def release():
    """Ends the blocked call after the test: off the main thread it runs on in a daemon
    thread, which must not outlive the test (other tests count those threads)."""
    event = threading.Event()
    yield event
    event.set()
    for thread in threading.enumerate():
        if thread.name == "preflight-fetch":
            thread.join(5)


@pytest.mark.parametrize("make_loader", [BlocksInIter, lambda release: DataLoader(BlockingIterable(release), batch_size=4)],
                         ids=["plain_object", "iterable_dataset_loader"])
@pytest.mark.parametrize("main_thread", [True, False], ids=["main_thread", "other_thread"])
def test_startup_check_bounds_a_blocking_iter(make_loader, main_thread, release):
    loader = make_loader(release)
    outcome: dict = {}

    def call() -> None:
        try:
            check_dataloader_startup(tiny_config(), loader, timeout_s=0.5)
        except RuntimeError as error:
            outcome["error"] = str(error)

    if main_thread:
        call()
    else:  # a daemon thread then holds the blocked call; this thread must still get its answer
        caller = threading.Thread(target=call)
        caller.start()
        caller.join(30)
    # Bounded, not waited for: the dataset blocks for an hour; an answer came back.
    assert "iter(loader) did not return within 0.5 s" in outcome["error"]
    assert "test_preflight_hangs.py" in outcome["error"] and "in __iter__: self.release.wait(3600)" in outcome["error"]


def test_closing_the_iterator_does_not_wait_on_a_worker_stuck_in_a_prefetched_batch():
    """torch's own shutdown would join the stuck worker for 5 s, then kill it."""
    stuck = hang_recipes.HangsAt(range(hang_recipes.BATCH, hang_recipes.SAMPLES), in_worker=True)
    loader = DataLoader(stuck, batch_size=hang_recipes.BATCH, num_workers=1)
    timed_out_joins = []
    with GuardedBatches(loader, timeout_s=30) as batches:
        next(batches)  # the worker has moved on to batch 2, which never comes
        workers = list(batches._iterator._workers)
        for worker in workers:  # a join that returns with the worker alive waited out its timeout
            join = worker.join

            def recording_join(timeout=None, join=join, worker=worker):
                join(timeout)
                if worker.is_alive():
                    timed_out_joins.append(timeout)

            worker.join = recording_join
    # At most the short grace before the stuck worker is terminated, never torch's 5 s join.
    assert all(timeout is not None and timeout <= 0.5 for timeout in timed_out_joins), timed_out_joins
    assert not any(worker.is_alive() for worker in workers)
