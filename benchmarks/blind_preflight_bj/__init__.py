"""Blind preflight set bj: time-series forecasting and anomaly detection."""
