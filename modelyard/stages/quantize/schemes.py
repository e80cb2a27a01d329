"""The quantization schemes modelyard knows: recipe name, family, calibration need, weight bits and the quality
thresholds of each family."""

from __future__ import annotations

from dataclasses import dataclass

from modelyard.errors import QuantizeError


@dataclass(frozen=True)
class Scheme:
    """A quantization scheme: its recipe file, family, whether it needs calibration data, the
    weight bits (for disk estimates) and the quality thresholds of its family."""

    name: str
    family: str
    needs_data: bool
    weight_bits: int
    max_ppl_ratio: float  # quantized / parent perplexity on the held-out text
    max_kl: float  # mean per-token KL(parent || quantized), nats
    backend: str = "llm-compressor"  # or a legacy backend of stages/quantize/legacy.py


#: Thresholds are per family: 8-bit schemes should be near-lossless; 4-bit ones lose more, most on
#: small models (measured on SmolLM2-135M: see README "Quantization").
SCHEMES: dict[str, Scheme] = {
    "w4a16": Scheme("w4a16", "int4", True, 4, 1.35, 0.35),
    "awq": Scheme("awq", "int4", True, 4, 1.35, 0.35),
    "w8a8": Scheme("w8a8", "int8", True, 8, 1.10, 0.10),
    "fp8-dynamic": Scheme("fp8-dynamic", "fp8", False, 8, 1.10, 0.10),
    "nvfp4": Scheme("nvfp4", "fp4", True, 4, 1.60, 0.60),
    "nvfp4a16": Scheme("nvfp4a16", "fp4", False, 4, 1.50, 0.50),
}
#: legacy formats (stages/quantize/legacy.py), each made by its own library in its own venv.
LEGACY_SCHEMES: dict[str, Scheme] = {
    "gptq": Scheme("gptq", "int4", True, 4, 1.35, 0.35, backend="gptqmodel"),
    "awq-gemm": Scheme("awq-gemm", "int4", True, 4, 1.35, 0.35, backend="autoawq"),
}
ALL_SCHEMES = {**SCHEMES, **LEGACY_SCHEMES}


def scheme(name: str) -> Scheme:
    """The :class:`Scheme` called ``name``; raises :class:`QuantizeError` listing the valid names."""
    try:
        return ALL_SCHEMES[name]
    except KeyError as exc:
        raise QuantizeError(f"--quantize/--scheme {name!r} is not a scheme modelyard knows",
                            fix=f"Use one of: {', '.join(ALL_SCHEMES)}.") from exc
