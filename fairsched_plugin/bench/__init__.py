"""Workloads, replay, metrics and reports for comparing scheduling policies."""
