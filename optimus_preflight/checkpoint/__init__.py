from optimus_preflight.checkpoint.checkpointer import RunCheckpointer
from optimus_preflight.checkpoint.resume_command import resume_command
from optimus_preflight.checkpoint.store import CheckpointCorrupt, CheckpointStore, verify

__all__ = ["RunCheckpointer", "CheckpointStore", "CheckpointCorrupt", "verify", "resume_command"]
