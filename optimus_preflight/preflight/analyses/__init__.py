"""Analyses the checks judge from, defining no check: the criterion spy, its findings and
the observed first step (``loss_spy``, ``loss_findings``, ``probe``, ``trial_steps``),
padding in sequence batches (``padding``, ``padded_loss``), byte sizes and the memory
estimate's inputs (``sizes``, ``step_inputs``), and the memory verdicts (``memory_limit``,
``memory_verdict``, ``memory_fsdp``). Imports the framework and the data access, never a
check."""
