"""Prefect flows: orchestration only; tasks call stage functions."""
