"""The preflight checks, and nothing else: one module per subject (environment, config,
data, batches, model, memory, step). Each ``Check`` subclass declares its ``codes``. The
framework that runs them, the data access and the analyses are sibling packages."""
