"""The verification suite: checks by concern, a registry, and report rendering."""

from modelyard.checks.base import CheckContext, Finding, Severity, Target, check
from modelyard.checks.report import Report
from modelyard.checks.suite import registered, run_checks

__all__ = ["CheckContext", "Finding", "Report", "Severity", "Target", "check", "registered", "run_checks"]
