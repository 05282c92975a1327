"""`optimus-export RUN_DIR`: one consolidated model ``state_dict`` file for inference.

Works on any checkpoint the toolkit writes: a sharded (FSDP2, DCP) one is gathered in
this single process without a process group; a single-file one has its model taken out
of ``state.pt``. The checkpoint is verified against its manifest first, and the output
loads with ``torch.load(path, weights_only=True)`` into the model's ``load_state_dict``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

import torch

from optimus_preflight.checkpoint.store import CheckpointCorrupt, CheckpointStore, load_state, verify

DESCRIPTION = "Write the model weights of a run's checkpoint (sharded or not) as one state_dict file."
EPILOG = """\
The output holds plain tensors keyed by parameter name:
  model.load_state_dict(torch.load("model.pt", weights_only=True))

Exit codes: 0 written, 2 no usable checkpoint at PATH or the output cannot be written.

examples:
  optimus-export outputs/2026-11-25/12-00-00
  optimus-export outputs/2026-11-25/12-00-00/checkpoints/step_00000400 --out model.pt
"""


class ExportError(Exception):
    pass


def find_checkpoint(path: Path) -> Path:
    """A checkpoint directory as given, or the newest one of a run dir that verifies."""
    if (path / "manifest.json").exists():
        return path
    store = CheckpointStore(path / "checkpoints")
    ref, skipped = store.latest_valid()
    if ref is None:
        why = f" ({skipped[0][0].name}: {skipped[0][1]})" if skipped else ""
        raise ExportError(f"no checkpoint that verifies in {store.directory}{why}. Pass a run dir that saved one, "
                          "or a checkpoints/step_XXXXXXXX directory.")
    return ref.path


def consolidated_model_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    from optimus_preflight.checkpoint.sharded import full_model_state, is_sharded_checkpoint

    try:
        verify(checkpoint)
        if is_sharded_checkpoint(checkpoint):
            return full_model_state(checkpoint)
        return dict(load_state(checkpoint, ("model",))["model"])
    except CheckpointCorrupt as error:
        raise ExportError(str(error)) from None


def export(path: Path, out: Path | None = None) -> tuple[Path, Path, str]:
    """Write the consolidated weights; returns (checkpoint, output file, its SHA-256)."""
    checkpoint = find_checkpoint(path)
    state = consolidated_model_state(checkpoint)
    if out is None:
        out = checkpoint.parent.parent / "export" / f"model_{checkpoint.name}.pt"
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            torch.save({name: tensor.contiguous() for name, tensor in state.items()}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, out)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise ExportError(f"could not write {out}: {error.strerror or error}. Pass --out on a writable disk.") from None
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    return checkpoint, out, digest


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="optimus-export", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, help="a run dir (its newest valid checkpoint) or a checkpoint dir")
    parser.add_argument("--out", type=Path, default=None, help="output file (default: RUN_DIR/export/model_step_N.pt)")
    args = parser.parse_args(argv)
    if not args.path.is_dir():
        print(f"optimus-export: error: {args.path} is not a directory. Pass a run dir or a checkpoint dir.", file=sys.stderr)
        return 2
    try:
        checkpoint, out, digest = export(args.path, args.out)
    except ExportError as error:
        print(f"optimus-export: error: {error}", file=sys.stderr)
        return 2
    print(f"optimus-export: {checkpoint} -> {out} ({out.stat().st_size} bytes, sha256 {digest})")
    return 0


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
