"""Second blind preflight evaluation set (set b): run with ``python -m benchmarks.blind_preflight.run --set b``."""
