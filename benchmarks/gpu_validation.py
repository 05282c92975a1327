"""Check every GPU-only claim of the toolkit on a real CUDA device, in one command, and write one table.

    python3 benchmarks/gpu_validation.py --out DIR            # on any CUDA machine (make gpu-check)
    python3 benchmarks/gpu_validation.py --out DIR --tiny     # small sizes: a smoke run (and the CPU test)
    python3 benchmarks/gpu_validation.py --fetch-wheels benchmarks/tmp_gpu_wheels   # where an index is reachable

Sections (benchmarks/gpu_checks/): ``ddp`` (no_sync accumulation through StepRunner: gloo with 2
ranks on the CPU, NCCL with 1 rank), ``memory`` (estimate_step_memory(device="cuda") vs
max_memory_allocated/reserved over two real steps: MLP, CNN+BatchNorm, the char-LM, GPT-2 and
Llama-like transformers, one with activation checkpointing; fp32/bf16/fp16; AdamW foreach and
fused, SGD), ``check_model_gpu_memory``, ``oom_observer`` (a real OOM), ``fp16_grad_scaler``
(an overflowing model through the CLI), ``vram_headroom`` (the preflight's verdict vs a real run
on a card capped to the target size), ``throughput`` (eager, and compiled where
``trainer.compile`` exists) and ``fsdp`` (where ``trainer.strategy=fsdp`` exists). Without CUDA
every GPU part is reported as skipped with the reason, and what can run on a CPU runs (the
estimates, the 2-rank gloo DDP, the CPU-side log of check_model_gpu_memory).

Set-up (skipped with ``--no-setup``): the project's .venv holds the CPU wheel that
constraints.txt pins, so the script looks for an interpreter whose torch is a CUDA build (this
one, ``python3``, /opt/torch/.venv/bin/python3, ``--python``), makes a venv that reuses it,
installs the project there (editable, no dependencies) and whatever of hydra-core, omegaconf,
antlr4, psutil, tqdm, numpy and PyYAML is missing: from ``--wheels DIR`` (default
benchmarks/tmp_gpu_wheels when it exists) without an index, else from the index. Then it runs
the checks in that venv. ``--install-torch`` lets it pip-install torch when a GPU is there but
no CUDA torch is.

Outputs in ``--out``: gpu_validation.json, gpu_validation.md (the table) and gpu_validation.log;
scratch files (CLI run dirs, OOM traces) go to ``--work-dir``. Both files are rewritten after
every section, so a run stopped early still reports what it did. Exit code 1 when a section
failed or broke, else 0 (skips included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.gpu_checks import bootstrap  # noqa: E402  (standard library only)
from benchmarks.gpu_checks.report import SECTION_TITLES, Report, Section  # noqa: E402

DEFAULT_WHEELS = REPO / "benchmarks" / "tmp_gpu_wheels"
DEFAULT_BUDGET_S = 360.0  # leaves ~2 min of an 8-minute device lease for the machine's start and the copies
SETUP_ENV = "OPTIMUS_GPU_VALIDATION_SETUP"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for gpu_validation.json/.md/.log")
    parser.add_argument("--tiny", action="store_true", help="small models and runs: a smoke run, and the CPU test")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="total seconds, set-up included")
    parser.add_argument("--sections", default="", help="comma-separated subset of the sections")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "optimus-gpu-validation-work")
    parser.add_argument("--no-setup", action="store_true", help="run the checks in this interpreter as it is")
    parser.add_argument("--python", help="the interpreter whose (CUDA) torch to use")
    parser.add_argument("--venv", type=Path, help="where to create or reuse the venv")
    parser.add_argument("--wheels", type=Path, help="folder of wheels for an offline install")
    parser.add_argument("--install-torch", action="store_true", help="pip-install torch if no CUDA torch is found")
    parser.add_argument("--cpu", action="store_true", help="report every GPU part as skipped even with CUDA")
    parser.add_argument("--rehearse", action="store_true",
                        help="without CUDA, run the CLI sections (fp16, throughput, fsdp) on the CPU to try their plumbing")
    parser.add_argument("--fetch-wheels", type=Path, metavar="DIR", help="download the wheels to carry, then exit")
    args = parser.parse_args(argv)
    if args.fetch_wheels is None and args.out is None:
        parser.error("--out is required")
    return args


def child_argv(argv: list[str], budget_s: float, out: Path, work_dir: Path) -> list[str]:
    """This command line for the run inside the venv: no set-up flags, the budget that is left,
    absolute folders (the child runs in the repository root)."""
    drop_with_value = {"--python", "--venv", "--wheels", "--budget-s", "--out", "--work-dir"}
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        name = item.split("=", 1)[0]
        if name in drop_with_value:
            skip = "=" not in item
            continue
        if name in ("--install-torch", "--no-setup"):
            continue
        kept.append(item)
    return [*kept, "--out", str(out.resolve()), "--work-dir", str(work_dir.resolve()), "--no-setup", "--budget-s",
            f"{budget_s:.0f}"]


def setup_failed_report(args: argparse.Namespace, setup: dict, reason: str) -> int:
    report = Report(args.out, "tiny" if args.tiny else "full", args.budget_s, {"setup": setup})
    section = Section("setup", "find a CUDA torch, make the venv, install the project", status="error", reason=reason)
    section.data = setup
    report.sections.append(section)
    for name, title in SECTION_TITLES.items():
        report.sections.append(Section(name, title, status="skipped", reason=f"set-up failed: {reason}"))
    report.finished = True
    report.write()
    print(f"gpu_validation: set-up failed: {reason}; wrote {args.out}", flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.fetch_wheels is not None:
        return bootstrap.fetch_wheels(args.fetch_wheels)
    only = [name for name in args.sections.split(",") if name]
    unknown = sorted(set(only) - set(SECTION_TITLES))
    if unknown:
        print(f"gpu_validation: unknown sections {unknown}; choose from {', '.join(SECTION_TITLES)}", file=sys.stderr)
        return 2
    if not args.no_setup:
        started = time.monotonic()
        wheels = (args.wheels or (DEFAULT_WHEELS if DEFAULT_WHEELS.is_dir() else None))
        wheels = wheels.resolve() if wheels else None
        setup = bootstrap.prepare(REPO, explicit_python=args.python, venv=args.venv, wheels=wheels,
                                  install_torch=args.install_torch)
        record = setup.to_dict()
        if setup.status != "ready":
            return setup_failed_report(args, record, setup.reason or setup.status)
        left = args.budget_s - (time.monotonic() - started)
        command = [setup.python, str(Path(__file__).resolve()), *child_argv(argv, left, args.out, args.work_dir)]
        print(f"gpu_validation: set-up done in {setup.seconds:.0f} s; running the checks with {setup.python}", flush=True)
        env = {**os.environ, SETUP_ENV: json.dumps(record)}
        try:
            code = subprocess.run(command, env=env, cwd=REPO, timeout=left + 120).returncode
        except subprocess.TimeoutExpired:
            print("gpu_validation: the checks ran past the budget; the report holds the sections done", flush=True)
            return 1
        if not (args.out / "gpu_validation.json").exists():
            return setup_failed_report(args, record, f"the checks exited with {code} before writing a report")
        return code
    from benchmarks.gpu_checks import runner

    return runner.run(args.out, args.work_dir, tiny=args.tiny, budget_s=args.budget_s, only=only or None,
                      force_cpu=args.cpu, rehearse=args.rehearse)


if __name__ == "__main__":
    sys.exit(main())
