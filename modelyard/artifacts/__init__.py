"""Artifacts: layout and manifest, store."""
