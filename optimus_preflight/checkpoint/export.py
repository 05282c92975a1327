"""`optimus-export RUN_DIR`: the model weights of a checkpoint as one file for inference,
``model_step_N.safetensors`` and ``model_step_N.pt`` (``torch.save`` of a state_dict).

Works on any checkpoint the toolkit writes: DCP's files (any strategy; an FSDP run's
shards are gathered in this single process without a process group) or an earlier
format's ``state.pt`` (legacy.py). The checkpoint is verified against its manifest first.
Safetensors needs the ``safetensors`` package (extra ``[safetensors]``); without it the
default export writes the ``.pt`` alone and says so.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Callable

import torch

from optimus_preflight.checkpoint.store import CheckpointCorrupt, CheckpointStore, load_state, verify

DESCRIPTION = "Write the model weights of a run's checkpoint (sharded or not) as safetensors and a torch state_dict file."
EPILOG = """\
The outputs hold plain tensors keyed by parameter name:
  model.load_state_dict(safetensors.torch.load_file("model.safetensors"))
  model.load_state_dict(torch.load("model.pt", weights_only=True))

Exit codes: 0 written, 2 no usable checkpoint at PATH, the output cannot be written, or
safetensors asked for and not installed.

examples:
  optimus-export outputs/2026-11-25/12-00-00
  optimus-export outputs/2026-11-25/12-00-00/checkpoints/step_00000400 --out model.safetensors
  optimus-export outputs/2026-11-25/12-00-00 --format pt
"""
FORMATS = ("safetensors", "pt")


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


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, none sharing memory with another (tied weights of an
    earlier format's checkpoint): safetensors refuses shared storage."""
    seen: set[int] = set()
    out = {}
    for name, tensor in state.items():
        tensor = tensor.detach().to("cpu").contiguous()
        key = tensor.untyped_storage().data_ptr()
        if key in seen and tensor.numel():
            tensor = tensor.clone()
        seen.add(key)
        out[name] = tensor
    return out


def _write_pt(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    torch.save(state, path)


def _write_safetensors(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    save_file(state, str(path), metadata=metadata)


WRITERS: dict[str, Callable[[dict[str, torch.Tensor], Path, dict[str, str]], None]] = {
    "safetensors": _write_safetensors, "pt": _write_pt}


def have_safetensors() -> bool:
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        return False
    return True


def _write_atomic(write: Callable[[Path], None], out: Path) -> str:
    """``write`` into a temporary file beside ``out``, fsync, rename; its SHA-256."""
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        digest = hashlib.sha256()
        with open(tmp, "rb+") as handle:
            while block := handle.read(1 << 22):
                digest.update(block)
            os.fsync(handle.fileno())
        os.replace(tmp, out)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise ExportError(f"could not write {out}: {error.strerror or error}. Pass --out on a writable disk.") from None
    return digest.hexdigest()


def export_files(path: Path, outputs: dict[str, Path | None] | None = None) -> tuple[Path, dict[str, tuple[Path, str]]]:
    """Write the consolidated weights in each format of ``outputs`` (format -> file, or
    None for ``RUN_DIR/export/model_step_N.<format>``; default: both formats, safetensors
    only when installed). Returns the checkpoint and, per format, (file, SHA-256)."""
    checkpoint = find_checkpoint(path)
    if outputs is None:
        outputs = {name: None for name in FORMATS if name != "safetensors" or have_safetensors()}
    if "safetensors" in outputs and not have_safetensors():
        raise ExportError("safetensors is not installed. Install the extra: pip install 'optimus_preflight[safetensors]', "
                          "or pass --format pt.")
    state = _unshared(consolidated_model_state(checkpoint))
    metadata = {"format": "pt", "checkpoint": checkpoint.name}
    written = {}
    for name, out in outputs.items():
        out = out or checkpoint.parent.parent / "export" / f"model_{checkpoint.name}.{name}"
        written[name] = (out, _write_atomic(lambda tmp, name=name: WRITERS[name](state, tmp, metadata), out))
    return checkpoint, written


def export(path: Path, out: Path | None = None) -> tuple[Path, Path, str]:
    """The ``.pt`` export alone (or the format ``out``'s suffix names): (checkpoint,
    output file, its SHA-256)."""
    name = "safetensors" if out is not None and out.suffix == ".safetensors" else "pt"
    checkpoint, written = export_files(path, {name: out})
    return (checkpoint, *written[name])


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="optimus-export", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, help="a run dir (its newest valid checkpoint) or a checkpoint dir")
    parser.add_argument("--format", choices=("both", *FORMATS), default=None,
                        help="what to write (default: both; with --out, the format its suffix names)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output file, one format (default: RUN_DIR/export/model_step_N.safetensors and .pt)")
    args = parser.parse_args(argv)
    if not args.path.is_dir():
        print(f"optimus-export: error: {args.path} is not a directory. Pass a run dir or a checkpoint dir.", file=sys.stderr)
        return 2
    chosen = args.format or ("both" if args.out is None else "safetensors" if args.out.suffix == ".safetensors" else "pt")
    if chosen == "both" and args.out is not None:
        print("optimus-export: error: --out names one file; pass --format safetensors or --format pt with it.", file=sys.stderr)
        return 2
    outputs = None if chosen == "both" and args.format is None else (
        {name: None for name in FORMATS} if chosen == "both" else {chosen: args.out})
    try:
        checkpoint, written = export_files(args.path, outputs)
    except ExportError as error:
        print(f"optimus-export: error: {error}", file=sys.stderr)
        return 2
    for out, digest in written.values():
        print(f"optimus-export: {checkpoint} -> {out} ({out.stat().st_size} bytes, sha256 {digest})")
    if "safetensors" not in written and outputs is None:
        print("optimus-export: safetensors is not installed, so only the .pt was written "
              "(pip install 'optimus_preflight[safetensors]')", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
