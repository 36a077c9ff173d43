"""Decode backends, one module each, behind gpupipe.decode's public functions."""
