"""Set bb: blind preflight cases for hand-written audio classification and session-based recommendation."""
