"""The choice types of the CLI's options, each built from the registry that owns the valid set, so that
``--help`` lists exactly what the code accepts and a bad value is typer's own usage error (exit 2) before
any work (:func:`~modelyard.cli._common.choice`).

========================  ================================================================================
type                      registry
========================  ================================================================================
:data:`Serve`             ``--serve``: :data:`modelyard.model.modes.SERVE_MODES`
:data:`Dtype`             ``--dtype``: vLLM's ``--dtype`` values, :data:`modelyard.checks.base.VLLM_DTYPES`
:data:`Scheme`            ``--quantize``/``--scheme``: :data:`modelyard.stages.quantize.ALL_SCHEMES`
:data:`QuantRuntime`      ``--runtime`` of ingest/quantize: :data:`modelyard.stages.quantize.compat.RUNTIMES`
:data:`VerifyRuntime`     ``--runtime`` of verify: :data:`modelyard.stages.verify.RUNTIME_CHOICES`
:data:`ReportFormat`      ``--format`` of verify: :data:`REPORT_FORMATS`
:data:`SmokeLevel`        ``--smoke``: :data:`modelyard.stages.smoke.server.LEVELS`
:data:`RequiredSmoke`     ``promote --require-smoke``: :data:`modelyard.artifact.identity.SMOKE_LEVEL_RANK`
:data:`Gpu`               ``--gpu``: the GPU table, :data:`modelyard.stages.serve.gpus.GPUS`
:data:`KvCacheDtype`      ``--kv-cache-dtype``: :data:`modelyard.stages.serve.plan.KV_CACHE_DTYPES`
========================  ================================================================================
"""

from __future__ import annotations

from modelyard.artifact.identity import SMOKE_LEVEL_RANK
from modelyard.checks.base import VLLM_DTYPES
from modelyard.cli._common import Serve, choice
from modelyard.stages.quantize import ALL_SCHEMES
from modelyard.stages.quantize.compat import RUNTIMES
from modelyard.stages.serve.gpus import GPUS
from modelyard.stages.serve.plan import KV_CACHE_DTYPES
from modelyard.stages.smoke.server import LEVELS
from modelyard.stages.verify import RUNTIME_CHOICES

__all__ = ["Dtype", "Gpu", "KvCacheDtype", "QuantRuntime", "RequiredSmoke", "Scheme", "Serve", "SmokeLevel",
           "ReportFormat", "VerifyRuntime"]

#: the report formats ``verify --format`` prints: the table, the JSON report, Markdown, SARIF 2.1.0
REPORT_FORMATS = ("table", "json", "markdown", "sarif")

Dtype = choice(VLLM_DTYPES)
Scheme = choice(ALL_SCHEMES)
QuantRuntime = choice(RUNTIMES)
VerifyRuntime = choice(RUNTIME_CHOICES)
ReportFormat = choice(REPORT_FORMATS)
SmokeLevel = choice(LEVELS)
RequiredSmoke = choice(SMOKE_LEVEL_RANK)
Gpu = choice(GPUS)
KvCacheDtype = choice(KV_CACHE_DTYPES)
