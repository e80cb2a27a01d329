"""The suite's tiers and its clock (a pytest plugin, loaded by ``tests/conftest.py``).

Every test gets exactly one tier marker at collection, from where it lives and what it is marked with:

- ``slow``: it loads a real vLLM engine, runs llm-compressor or a legacy quantizer, brings up a Ray cluster or
  the scale-out workers (markers ``vllm``, ``quantize``, ``ray``, ``scale_out``), or it says ``slow`` itself;
- ``integration``: the rest of ``tests/e2e`` (real servers, the CLI as a subprocess, whole flows), and the
  tests of ``tests/unit`` that say ``integration`` themselves or carry a server marker (``hub``, ``e2e``,
  ``publish``, ``prefect_server``, ``prometheus``, ``nginx``);
- ``unit``: everything else (``make test-fast`` runs ``-m unit``).

At the end the clock prints, per tier, the tests run and their wall time (setup + call + teardown of each test,
so a session fixture counts where it is first built), and the session's wall time. With
``MODELYARD_SUITE_BUDGET_S`` set (``make test`` sets it), a run whose wall time exceeds that many seconds
fails (exit status 1) after printing which tier took what; ``MODELYARD_SUITE_TIMES`` names a JSON file to
write the same figures to.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

TIERS = ("unit", "integration", "slow")
#: markers that put a test in the slow tier
SLOW_MARKERS = frozenset({"vllm", "quantize", "ray", "scale_out"})
#: markers that put a test of tests/unit in the integration tier
SERVER_MARKERS = frozenset({"hub", "e2e", "publish", "prefect_server", "prometheus", "nginx"})
BUDGET_ENV = "MODELYARD_SUITE_BUDGET_S"
TIMES_ENV = "MODELYARD_SUITE_TIMES"

_E2E = Path(__file__).resolve().parent / "e2e"


def tier_of(path: Path, markers: set[str]) -> str:
    """The tier of a test in file ``path`` carrying ``markers`` (module doc)."""
    if "slow" in markers or markers & SLOW_MARKERS:
        return "slow"
    if "integration" in markers or markers & SERVER_MARKERS or _E2E in Path(path).resolve().parents:
        return "integration"
    return "unit"


class SuiteClock:
    def __init__(self) -> None:
        self.start = time.monotonic()
        self.tier: dict[str, str] = {}
        self.seconds = dict.fromkeys(TIERS, 0.0)
        self.tests = dict.fromkeys(TIERS, 0)
        self.over_budget: str | None = None

    @pytest.hookimpl(tryfirst=True)  # before `-m` deselects: `-m unit` must see the tier markers
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            names = {m.name for m in item.iter_markers()}
            own = [t for t in TIERS if t in names]
            tier = tier_of(item.path, names)
            if not own:
                item.add_marker(getattr(pytest.mark, tier))
            self.tier[item.nodeid] = tier

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # under pytest-xdist the workers collect (and mark); the controller reads the tier from the report
        tier = self.tier.get(report.nodeid) or next((t for t in TIERS if t in report.keywords), None)
        if tier is None:
            return
        self.seconds[tier] += report.duration
        if report.when == "setup":
            self.tests[tier] += 1

    def figures(self) -> dict[str, object]:
        return {"wall_seconds": round(time.monotonic() - self.start, 1),
                "tiers": {t: {"tests": self.tests[t], "seconds": round(self.seconds[t], 1)} for t in TIERS}}

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        figures = self.figures()
        if out := os.environ.get(TIMES_ENV):
            Path(out).write_text(json.dumps(figures, indent=2) + "\n")
        budget = os.environ.get(BUDGET_ENV)
        if budget and float(figures["wall_seconds"]) > float(budget):  # type: ignore[arg-type]
            self.over_budget = (f"the suite took {figures['wall_seconds']} s, over its budget of {float(budget):g} s "
                                f"({BUDGET_ENV}): make it faster before adding to it (docs/reference/tests.md)")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001 - pytest's TerminalReporter
        figures = self.figures()
        tr = terminalreporter
        tr.write_sep("=", "suite time per tier")
        for t in TIERS:
            tr.write_line(f"{t:<12} {self.tests[t]:>5} tests {self.seconds[t]:>9.1f} s")
        tr.write_line(f"{'wall':<12} {sum(self.tests.values()):>5} tests {figures['wall_seconds']:>9.1f} s"
                      + (f" (budget {float(os.environ[BUDGET_ENV]):g} s)" if os.environ.get(BUDGET_ENV) else ""))
        if self.over_budget:
            tr.write_line(f"FAILED: {self.over_budget}", red=True, bold=True)


def pytest_configure(config: pytest.Config) -> None:
    for t, what in (("unit", "fast, in-process: `make test-fast` runs these"),
                    ("integration", "real servers, the CLI as a subprocess or a whole flow"),
                    ("slow", "a real vLLM engine, a quantizer, a Ray cluster or the scale-out workers")):
        config.addinivalue_line("markers", f"{t}: {what} (tests/suite_clock.py gives every test one tier)")
    if not config.pluginmanager.has_plugin("suite-clock"):
        config.pluginmanager.register(SuiteClock(), "suite-clock")
