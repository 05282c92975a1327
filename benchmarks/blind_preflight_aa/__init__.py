"""Blind preflight evaluation set aa: vision, audio and time-series practitioners' bugs (see README.md)."""
