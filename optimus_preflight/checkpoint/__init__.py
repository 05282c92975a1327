from optimus_preflight.checkpoint.checkpointer import RunCheckpointer, resume_command
from optimus_preflight.checkpoint.store import CheckpointCorrupt, CheckpointStore, verify

__all__ = ["RunCheckpointer", "CheckpointStore", "CheckpointCorrupt", "verify", "resume_command"]
