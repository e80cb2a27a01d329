"""Every failure has a stable code: each modelyard error class declares its own, the verdicts the CLI reports
without raising are declared beside them, the one-line error and the JSON envelope carry it, and
docs/reference/errors.md is generated from the declarations."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from modelyard import errors
from tests.conftest import generated_doc, json_error, run_cli

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reference" / "errors.md"


def test_every_error_class_declares_its_own_unique_snake_case_code():
    classes = {c for c in errors._subclasses(errors.ModelyardError) if c.__module__ == "modelyard.errors"}
    assert len(classes) == 32
    assert [c.__name__ for c in classes if "code" not in vars(c)] == []  # none inherits its parent's
    codes = [k.code for k in errors.kinds()]
    assert len(codes) == len(set(codes)) == 39
    assert all(re.fullmatch(r"[a-z]+(?:_[a-z]+)*", c) for c in codes)


def test_codes_are_stable():
    """A code is a contract (scripts branch on it): renaming one is a breaking change, made here on purpose."""
    assert {k.type: k.code for k in errors.kinds()} == {
        "ArtifactConflictError": "artifact_conflict", "AttemptsExhaustedError": "attempts_exhausted",
        "BundleHashMismatchError": "bundle_hash_mismatch", "BundleError": "bundle_invalid",
        "ConversionError": "conversion_failed", "DeployError": "deploy_refused",
        "EndpointUnreachableError": "endpoint_unreachable", "HashMismatchError": "hash_mismatch",
        "IngestFailed": "ingest_failed", "InsufficientResourcesError": "insufficient_resources",
        "InternalError": "internal", "Interrupted": "interrupted", "InvalidSourceError": "invalid_source",
        "InvalidTargetError": "invalid_target", "LegacyBackendError": "legacy_backend_failed",
        "ManifestError": "manifest_invalid", "MissingConfigError": "missing_config", "NeedsNotMet": "needs_not_met",
        "PatchError": "patch_refused", "PromotionGateError": "promotion_gate_failed",
        "PromotionRejectedError": "promotion_rejected", "PublishError": "publish_failed",
        "QualityGateError": "quality_gate_failed", "QuantizeError": "quantize_refused",
        "RolledBackError": "rolled_back", "RolloutError": "rollout_failed", "RuntimeNotFoundError": "runtime_not_found",
        "ServePlanError": "serve_plan_does_not_fit", "ServerError": "server_failed",
        "ServerNotRunning": "server_not_running", "SignatureError": "signature_invalid",
        "SigningKeyError": "signing_key_invalid", "SmokeFailedError": "smoke_failed",
        "SourceNotFoundError": "source_not_found", "StoreError": "store_failed",
        "UnsupportedWeightsError": "unsupported_weights", "UpgradeRegression": "upgrade_regression",
        "UsageError": "usage", "VerificationFailedError": "verification_failed"}
    assert errors.code_of("BundleHashMismatchError") == "bundle_hash_mismatch"


def test_an_undeclared_verdict_type_is_refused():
    try:
        errors.code_of("NoSuchVerdict")
    except KeyError as exc:
        assert "no error kind 'NoSuchVerdict' is declared in modelyard/errors.py" in str(exc)
    else:
        raise AssertionError("code_of accepted an undeclared type")


def test_every_verdict_the_cli_builds_is_declared():
    """The CLI builds a verdict's error only through errors.verdict("Type", ...), with a declared type."""
    used = set()
    for f in (ROOT / "modelyard" / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "verdict":
                used.add(node.args[0].value)  # type: ignore[attr-defined]
            if isinstance(node, ast.Dict):  # no hand-made {"type": ..., "message": ...} error left
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                assert not {"type", "message", "fix"} <= keys or "code" in keys, \
                    f"{f.name}:{node.lineno} builds an error without its code"
    assert used == {"UsageError", "Interrupted", "InternalError", "NeedsNotMet", "UpgradeRegression", "IngestFailed",
                    "ServerNotRunning"}
    assert all(errors.code_of(t) for t in used)


def test_the_one_line_error_and_the_envelope_carry_the_code(tmp_path):
    missing = tmp_path / "nope"
    r = run_cli("verify", str(missing))
    assert r.returncode == 2 and r.stderr.startswith(f"error[source_not_found]: {missing} does not exist\n")
    r = run_cli("verify", str(missing), "--json")
    err = json_error(r.stdout, "verify", 2)
    assert list(err) == ["type", "code", "message", "fix"]
    assert (err["type"], err["code"]) == ("SourceNotFoundError", "source_not_found")
    r = run_cli("verify", str(missing), "--no-such-flag", "--json")
    assert (json_error(r.stdout, "verify", 2)["type"], json_error(r.stdout, "verify", 2)["code"]) == ("UsageError", "usage")


def test_errors_reference_is_generated_from_the_declarations():
    text = errors.markdown()
    generated_doc(DOC, text)
    assert text.count("\n| `") == 39
    assert "| `hash_mismatch` | `HashMismatchError` | 1 | A file's SHA256 (or size) differs from the digest the hub or " \
           "manifest promised. |" in text
    assert ":class:" not in text and "``" not in text
