"""The verification suite: checks by concern, a registry, and report rendering."""

from modelyard.checks.findings import CheckContext, Finding, Severity, Target
from modelyard.checks.registry import check, registered, run_checks
from modelyard.checks.report import Report

__all__ = ["CheckContext", "Finding", "Report", "Severity", "Target", "check", "registered", "run_checks"]
