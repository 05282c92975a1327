"""Reporting: what a run tells. Metric sinks (metrics.jsonl, TensorBoard), the per-step
log and progress bar, summary.json, the sweep table, strict JSON, and train.log."""
