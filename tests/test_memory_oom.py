"""OOMObserver: the snapshot summary, the hints, Composer's contract (arguments, folder,
file names), the files it writes on CPU from a snapshot-shaped dict without touching the
network, the SVG flamegraph renderer, and a real CUDA OOM."""

from __future__ import annotations

import base64
import inspect
import json
import logging
import pickle
import re
import socket
import sys
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.cuda import _memory_viz

from optimus_preflight.compat.composer import OOMObserver, literal_name
from optimus_preflight.memory import flamegraph_svg, oom
from optimus_preflight.memory.oom import (
    category_by_address,
    oom_hints,
    start_oom_observer,
    summarize_snapshot,
)

MIB = 1 << 20
BASE = 0x7F0000000000
USER = {"filename": "/home/user/project/train.py", "line": 42, "name": "main"}
SVG = "{http://www.w3.org/2000/svg}"
SUFFIXES = [
    "_snapshot.pickle",
    "_trace_plot.html",
    "_segment_plot.html",
    "_segment_flamegraph.svg",
    "_memory_flamegraph.svg",
    "_summary.txt",
]


def frame(filename: str, name: str, line: int = 1) -> dict:
    return {"filename": filename, "line": line, "name": name}


def block(address: int, size: int, frames: list, state: str = "active_allocated") -> dict:
    return {"address": address, "size": size, "requested_size": size, "state": state, "frames": frames}


def event(action: str, addr: int, size: int, frames: list, time_us: int, **extra) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames, "time_us": time_us, **extra}


def synthetic_snapshot() -> dict:
    """Shaped like torch.cuda.memory._snapshot() (see its docstring in torch/cuda/memory.py):
    one 512 MiB segment whose blocks tile it, and the trace that led to the OOM."""
    blocks = [
        block(BASE, 64 * MIB, [frame("/site-packages/torch/nn/modules/module.py", "_apply"), USER]),  # a weight
        block(BASE + 64 * MIB, 128 * MIB, [frame("/site-packages/torch/optim/adamw.py", "_init_group"), USER]),
        block(BASE + 192 * MIB, 256 * MIB, [frame("/home/user/project/model.py", "forward", 17), USER]),
        block(
            BASE + 448 * MIB, 32 * MIB, [frame("/site-packages/torch/autograd/graph.py", "_engine_run_backward"), USER]
        ),
        block(BASE + 480 * MIB, 32 * MIB, [], state="inactive"),
    ]
    segment = {
        "device": 0,
        "address": BASE,
        "total_size": 512 * MIB,
        "allocated_size": 480 * MIB,
        "active_size": 480 * MIB,
        "requested_size": 480 * MIB,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }
    temporary = [frame("/home/user/project/model.py", "forward", 18), USER]
    traces = [event("segment_alloc", BASE, 512 * MIB, [USER], 1)]
    traces += [event("alloc", b["address"], b["size"], b["frames"], 2 + i) for i, b in enumerate(blocks[:4])]
    traces += [
        event("alloc", BASE + 480 * MIB, 32 * MIB, temporary, 10),
        event("free_requested", BASE + 480 * MIB, 32 * MIB, temporary, 11),
        event("free_completed", BASE + 480 * MIB, 32 * MIB, temporary, 12),
        event("oom", 0, 1024 * MIB, [USER], 13, device_free=3 * MIB),
    ]
    return {"segments": [segment], "device_traces": [traces], "allocator_settings": {}}


def embedded_snapshot(html: str) -> dict:
    """The snapshot torch's trace_plot/segment_plot embed in their page."""
    line = next(line for line in html.splitlines() if line.startswith("const local_files = "))
    files = json.loads(line.removeprefix("const local_files = "))
    return pickle.loads(base64.b64decode(files[0]["base64"]))


def svg_boxes(path: Path) -> dict[str, tuple[float, int]]:
    """Frame name -> (box width, bytes) of an SVG drawn by flamegraph_svg; it must parse."""
    boxes = {}
    for group in ET.parse(path).getroot().iter(f"{SVG}g"):
        name = group.find(f"{SVG}title").text.rsplit(" (", 1)[0]
        rect = group.find(f"{SVG}rect")
        boxes[name] = (float(rect.get("width")), int(rect.get("data-bytes")))
    return boxes


def fake_flamegraph_pl(path: Path, exit_code: int = 0) -> Path:
    """A stand-in for flamegraph.pl that says how it was called."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "stacks = sys.stdin.read().splitlines()\n"
        "print('<svg xmlns=\"http://www.w3.org/2000/svg\"><text>fake flamegraph.pl %s %d stacks</text></svg>'"
        " % (' '.join(sys.argv[1:]), len(stacks)))\n"
        f"sys.exit({exit_code})\n"
    )
    path.chmod(0o755)
    return path


@pytest.fixture
def offline(monkeypatch, tmp_path) -> Path:
    """Any download or connection fails the test; no flamegraph.pl on PATH or in torch's
    cache (HOME is a fresh folder). Returns that HOME."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(urllib.request, "urlretrieve", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", str(bin_dir))
    return home


def test_summary_totals_categories_largest_blocks_and_the_failed_request():
    snapshot = synthetic_snapshot()
    summary = summarize_snapshot(snapshot, categories={0x7F0000000000: "params"})
    assert summary.reserved_bytes == 512 * MIB and summary.allocated_bytes == 480 * MIB
    assert summary.by_category == {
        "params": 64 * MIB,  # matched by address
        "optimizer_state": 128 * MIB,  # frames inside torch/optim
        "activations": 256 * MIB,  # allocated in a forward
        "backward_temporaries": 32 * MIB,
    }
    assert [b["size"] for b in summary.largest] == [256 * MIB, 128 * MIB, 64 * MIB, 32 * MIB]
    assert summary.largest[0]["where"] == "model.py:17:forward"
    assert summary.oom_request_bytes == 1024 * MIB and summary.device_free_bytes == 3 * MIB
    text = summary.format()
    assert "activations" in text and "failed request: 1.00 GiB" in text


def test_hints_follow_the_composition_at_the_oom():
    summary = summarize_snapshot(synthetic_snapshot())
    hints = oom_hints(summary, precision="fp32", batch_size=32, largest_batch=12, accumulation_steps=1)
    assert any("data.batch_size=12" in h and "trainer.accumulation_steps=3" in h for h in hints)
    assert any("bf16" in h for h in hints)
    assert any("activation checkpointing" in h for h in hints)
    assert not any("bf16" in h for h in oom_hints(summary, precision="bf16"))


def test_addresses_of_live_parameters_gradients_and_optimizer_state():
    model = nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    addresses = category_by_address(model, optimizer)
    assert addresses[model.weight.untyped_storage().data_ptr()] == "params"
    assert addresses[model.weight.grad.untyped_storage().data_ptr()] == "grads"
    assert addresses[optimizer.state[model.weight]["exp_avg"].untyped_storage().data_ptr()] == "optimizer_state"


def test_the_offline_fixture_would_catch_torchs_default_formatter(offline):
    # Torch's own format_flamegraph downloads flamegraph.pl when it is not cached: the
    # reason the observer passes its own formatter, and proof that `offline` notices.
    with pytest.raises(AssertionError, match="network access attempted"):
        _memory_viz.memory(synthetic_snapshot())


def test_observer_writes_composers_five_files_and_a_summary_once(tmp_path, caplog, offline):
    snapshot = synthetic_snapshot()
    observer = OOMObserver(
        folder=str(tmp_path / "oom"), snapshot_fn=lambda: snapshot, hint_kwargs={"precision": "fp32"}
    )
    observer.on_oom(0, 1024 * MIB, 480 * MIB, 3 * MIB)
    assert observer.written == [] and not observer.fired  # not started: observes nothing
    observer.enabled = True
    observer.on_oom(0, 1024 * MIB, 480 * MIB, 3 * MIB)
    paths = observer.artifacts
    assert [p.name for p in observer.written] == [f"rank0_oom{suffix}" for suffix in SUFFIXES]
    assert observer.written == paths.paths() and observer.failed == []
    assert all(p.parent == tmp_path / "oom" and p.stat().st_size > 500 for p in observer.written)

    loaded = pickle.loads(paths.snapshot.read_bytes())
    assert loaded == snapshot
    assert "segments: 1" in _memory_viz.segsum(loaded)  # what pytorch.org/memory_viz parses
    assert "raise OutOfMemoryError" in _memory_viz.trace(loaded)
    for html_path, kind in ((paths.trace_plot, "Active Memory Timeline"), (paths.segment_plot, "Allocator State")):
        html = html_path.read_text()
        assert kind in html and embedded_snapshot(html) == snapshot

    memory = svg_boxes(paths.memory_flamegraph)
    total_width, total = memory["all"]
    assert total == 512 * MIB
    for name, nbytes in [
        ("train.py:42:main", 480 * MIB),  # the outermost frame of every live block
        ("model.py:17:forward", 256 * MIB),
        ("adamw.py:1:_init_group", 128 * MIB),
        ("<non-python>", 32 * MIB),  # the free block
    ]:
        width, drawn = memory[name]
        assert drawn == nbytes and width == pytest.approx(total_width * nbytes / total, rel=1e-3)
    segments = svg_boxes(paths.segment_flamegraph)
    assert segments[f"seg_{BASE}"][1] == 512 * MIB and segments["model.py:17:forward"][1] == 256 * MIB
    assert not (offline / ".cache").exists()  # torch's default formatter would have made it

    text = paths.summary.read_text()
    assert "largest live allocations" in text and "hint: Set trainer.precision=bf16" in text
    assert "CUDA out of memory" in caplog.text and "memory_viz" in caplog.text and "6 of 6" in caplog.text
    paths.snapshot.unlink()
    observer.on_oom(0, 1024 * MIB, 480 * MIB, 3 * MIB)  # the allocator may call again for one OOM
    assert not paths.snapshot.exists()


def test_write_lands_in_the_formatted_folder_and_filename(tmp_path, offline):
    observer = OOMObserver(
        folder=str(tmp_path / "{run_name}" / "r{rank}"), filename="{run_name}-rank{rank}", rank=2, run_name="exp"
    )
    summary = observer.write(synthetic_snapshot(), request_bytes=1024 * MIB, device_free=3 * MIB)
    assert summary is not None and summary.oom_request_bytes == 1024 * MIB
    assert sorted(p.name for p in (tmp_path / "exp" / "r2").iterdir()) == sorted(
        f"exp-rank2{suffix}" for suffix in SUFFIXES
    )


def test_the_constructor_is_composers_with_keyword_only_extras():
    parameters = inspect.signature(OOMObserver).parameters
    composer = {
        "max_entries": 100000,
        "folder": "{run_name}/torch_traces",
        "filename": "rank{rank}_oom",
        "remote_file_name": "{run_name}/oom_traces/rank{rank}_oom",
        "overwrite": False,
    }
    positional = [p for p in parameters.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert {p.name: p.default for p in positional} == composer and [p.name for p in positional] == list(composer)
    extras = [p.name for p in parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert extras == ["rank", "run_name", "model", "optimizer", "hint_kwargs", "snapshot_fn"]
    assert all(parameters[name].default is None for name in extras)


def test_composer_defaults_resolve_run_name_and_rank(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("RUN_NAME", "exp7")
    with caplog.at_level(logging.INFO, logger="optimus_preflight"):
        observer = OOMObserver()
    assert observer.rank == 3 and observer.run_name == "exp7"
    assert observer.folder_path == Path("exp7/torch_traces")
    assert observer.artifacts.snapshot == Path("exp7/torch_traces/rank3_oom_snapshot.pickle")
    assert observer.remote_file_name == "{run_name}/oom_traces/rank{rank}_oom"
    assert "remote_file_name" not in caplog.text  # the default says nothing
    assert not Path("exp7").exists()  # nothing is created before an OOM on a CPU

    monkeypatch.delenv("RANK")
    monkeypatch.delenv("RUN_NAME")
    observer = OOMObserver(10, "traces/{run_name}", "r{rank}", None, True)
    assert observer.rank == 0 and re.fullmatch(r"run-\d{8}-\d{6}", observer.run_name)
    assert observer.max_entries == 10 and observer.overwrite and observer.remote_file_name is None
    assert observer.folder_path == Path("traces") / observer.run_name
    assert observer.artifacts.memory_flamegraph.name == "r0_memory_flamegraph.svg"


def test_remote_file_name_is_kept_and_nothing_is_uploaded(caplog):
    with caplog.at_level(logging.INFO, logger="optimus_preflight"):
        observer = OOMObserver(remote_file_name="s3://bucket/{run_name}/oom", run_name="x")
    assert observer.remote_file_name == "s3://bucket/{run_name}/oom"
    assert caplog.text.count("nothing is uploaded") == 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="optimus_preflight"):
        OOMObserver(remote_file_name=None, run_name="x")
    assert "remote_file_name" not in caplog.text


def test_an_unknown_format_field_fails_at_construction():
    with pytest.raises(ValueError, match="node_rank.*run_name.*rank"):
        OOMObserver(folder="{node_rank}/traces")
    with pytest.raises(ValueError, match="filename"):
        OOMObserver(filename="")
    assert OOMObserver(folder=literal_name("runs/a{b}"), run_name="x").folder_path == Path("runs/a{b}")


def test_overwrite_false_needs_an_empty_folder_at_start(tmp_path):
    folder = tmp_path / "traces"
    (folder / ".cache").mkdir(parents=True)
    (folder / ".cache" / "state").write_text("hidden")
    (folder / ".keep").write_text("")
    observer = OOMObserver(folder=str(folder), run_name="x")
    observer.check_folder()  # hidden files and folders do not count, as in Composer
    (folder / "sub").mkdir()
    (folder / "sub" / "rank0_oom_snapshot.pickle").write_bytes(b"old")
    with pytest.raises(FileExistsError, match="overwrite=True") as raised:
        observer.start()  # checked before CUDA: the same answer on a CPU
    assert str(folder) in str(raised.value) and "another folder" in str(raised.value)
    assert not observer.enabled
    replacing = OOMObserver(folder=str(folder), overwrite=True, run_name="x")
    replacing.check_folder()
    assert replacing.start() is torch.cuda.is_available()
    replacing.stop()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_start_is_a_no_op_without_cuda(tmp_path):
    observer = OOMObserver(folder=str(tmp_path / "oom"))
    assert observer.start() is False and not observer.enabled
    assert not (tmp_path / "oom").exists()
    observer.stop()


def test_a_failing_writer_does_not_stop_the_others(tmp_path, monkeypatch, caplog, offline):
    def odd(*args, **kwargs):
        raise KeyError("blocks")

    monkeypatch.setattr(_memory_viz, "segment_plot", odd)
    observer = OOMObserver(folder=str(tmp_path), snapshot_fn=synthetic_snapshot)
    observer.enabled = True
    observer.on_oom(0, 1024 * MIB, 480 * MIB, 3 * MIB)  # raises nothing
    broken = observer.artifacts.segment_plot
    assert observer.failed == [broken] and not broken.exists()
    assert observer.written == [p for p in observer.artifacts.paths() if p != broken]
    assert all(p.exists() for p in observer.written)
    assert f"could not write {broken}: KeyError" in caplog.text
    assert "CUDA out of memory" in caplog.text and "5 of 6" in caplog.text


def test_a_failing_summary_does_not_stop_the_visualisations(tmp_path, monkeypatch, caplog, offline):
    def broken(*args, **kwargs):
        raise TypeError("unexpected snapshot")

    monkeypatch.setattr(oom, "summarize_snapshot", broken)
    observer = OOMObserver(folder=str(tmp_path))
    assert observer.write(synthetic_snapshot()) is None
    assert observer.failed == [observer.artifacts.summary] and len(observer.written) == 5
    assert "could not summarize the snapshot: TypeError" in caplog.text


def test_a_failing_snapshot_never_masks_the_oom(tmp_path, caplog):
    def broken():
        raise RuntimeError("no history")

    observer = OOMObserver(folder=str(tmp_path), snapshot_fn=broken)
    observer.enabled = True
    observer.on_oom(0, MIB, 0, 0)
    assert observer.fired and "could not write the OOM report" in caplog.text


@pytest.mark.parametrize("where", ["path", "torch_cache"])
def test_a_local_flamegraph_pl_draws_the_flamegraphs(tmp_path, offline, where):
    bin_dir = tmp_path / "bin"  # on PATH, see `offline`
    fake_flamegraph_pl(bin_dir / "flamegraph.pl" if where == "path" else offline / ".cache" / "flamegraph.pl")
    observer = OOMObserver(folder=str(tmp_path / "oom"))
    observer.write(synthetic_snapshot())
    for path in (observer.artifacts.segment_flamegraph, observer.artifacts.memory_flamegraph):
        assert "fake flamegraph.pl --countname bytes 5 stacks" in path.read_text()


def test_a_failing_flamegraph_pl_falls_back_to_the_svg_renderer(tmp_path, offline, caplog):
    fake_flamegraph_pl(tmp_path / "bin" / "flamegraph.pl", exit_code=2)
    observer = OOMObserver(folder=str(tmp_path / "oom"))
    with caplog.at_level(logging.INFO, logger="optimus_preflight"):
        observer.write(synthetic_snapshot())
    assert observer.failed == []
    assert svg_boxes(observer.artifacts.memory_flamegraph)["model.py:17:forward"][1] == 256 * MIB
    assert "drawing the flamegraph without it" in caplog.text


def test_flamegraph_svg_merges_prefixes_and_escapes_names(tmp_path):
    folded = "\n".join(
        [
            "stream_0;active_allocated;train.py:1:main;model.py:5:<lambda> & co 300",
            "stream_0;active_allocated;train.py:1:main;model.py:9:forward 100",
            "stream_0;inactive;<gaps> 600",
            "no count here",
            "stream_0;empty 0",
            "",
        ]
    )
    assert len(flamegraph_svg.parse_folded(folded)) == 3
    path = tmp_path / "graph.svg"
    path.write_text(flamegraph_svg.render_flamegraph_svg(folded, title='a "title" <here>'))
    root = ET.parse(path).getroot()
    assert 'a "title" <here>' in "".join(root.itertext())
    boxes = svg_boxes(path)
    assert boxes["all"][1] == 1000 and boxes["train.py:1:main"][1] == 400  # one box for the shared prefix
    assert boxes["model.py:5:<lambda> & co"][1] == 300 and boxes["<gaps>"][1] == 600
    width = boxes["all"][0]
    assert boxes["<gaps>"][0] == pytest.approx(0.6 * width, rel=1e-3)
    titles = [g.find(f"{SVG}title").text for g in root.iter(f"{SVG}g")]
    assert "model.py:5:<lambda> & co (300 B, 300 bytes, 30.00%)" in titles


def test_flamegraph_svg_handles_no_data_tiny_boxes_and_deep_stacks(tmp_path):
    empty = ET.fromstring(flamegraph_svg.render_flamegraph_svg("").split("\n", 1)[1])
    assert not list(empty.iter(f"{SVG}g")) and "no memory blocks" in "".join(empty.itertext())
    tiny = flamegraph_svg.render_flamegraph_svg(f"big {10**9}\nsmall 1\n")
    assert "big" in tiny and "small" not in tiny  # narrower than a tenth of a pixel
    deep = ";".join(f"f{i}" for i in range(3000)) + " 64"
    assert flamegraph_svg.render_flamegraph_svg(deep).count("<rect ") == 3002  # background + all + 3000


@pytest.mark.gpu
def test_a_real_cuda_oom_leaves_every_file(tmp_path):
    model = nn.Linear(1024, 1024).cuda()
    observer = OOMObserver(folder=str(tmp_path / "oom"), model=model, hint_kwargs={"precision": "fp32"})
    assert observer.start()
    try:
        free, _ = torch.cuda.mem_get_info()
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(int(free * 2), dtype=torch.uint8, device="cuda")
    finally:
        observer.stop()
    assert observer.written == observer.artifacts.paths(), observer.failed
    snapshot = pickle.loads(observer.artifacts.snapshot.read_bytes())
    assert snapshot["segments"] and "params" in observer.artifacts.summary.read_text()
    ET.parse(observer.artifacts.memory_flamegraph)


def test_the_observer_follows_preflight_oom_observer(tmp_path):
    from tests.conftest import tiny_config

    assert start_oom_observer(tiny_config("preflight.oom_observer=false"), tmp_path) is None
    # A resumed run finds the files of the OOM that stopped it: the observer still starts.
    (tmp_path / "oom").mkdir()
    (tmp_path / "oom" / "rank0_oom_snapshot.pickle").write_bytes(b"earlier")
    observer = start_oom_observer(tiny_config("preflight.oom_observer=true"), tmp_path, largest_batch=4)
    if torch.cuda.is_available():
        assert observer.enabled and observer.hint_kwargs["largest_batch"] == 4
        assert observer.artifacts.snapshot == tmp_path / "oom" / "rank0_oom_snapshot.pickle"
        assert observer.overwrite
        observer.stop()
    else:
        assert observer is None
