"""Blind preflight evaluation set ar: time-series and signal training setups (forecasting, sensor anomaly
autoencoders, audio / spectrogram classifiers, wearable activity recognition)."""
