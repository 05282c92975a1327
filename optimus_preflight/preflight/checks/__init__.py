"""The preflight checks, one module per subject (environment, config, data, batches,
model, memory, step); the framework that runs them is one package up."""
