"""Blind evaluation set for the preflight: broken and healthy training setups, written
without reading the checks. Run: ``.venv/bin/python -m benchmarks.blind_preflight.run``."""
