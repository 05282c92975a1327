"""Training: one optimizer step and everything it runs on.

The step (``step``, ``gradients``), the data it reads (``loaders``, ``stream``,
``epoch_replay``, ``batches``), its numerics (``precision``, ``rng``), the context it
runs in (``training_context``, ``distributed``, ``peers``), the optimizer and schedules
(``optim``), evaluation, the run's counters (``run_state``) and DataLoader worker
failures (``worker_deaths``).
"""
