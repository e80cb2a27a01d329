"""The CNCF ModelPack description of an artifact for OCI: its config blob (``application/vnd.cncf.model.config.v1+json``:
descriptor, config, modelfs) and the manifest annotations (OCI image annotations and ``dev.modelyard.*``), read from
the artifact's manifest, its ``config.json`` and its safetensors headers (no weight bytes).

Sources: the CNCF model-spec (``config.md``: ``descriptor``, ``config.paramSize``, ``precision``, ``quantization``,
``transformerConfig``), the OCI image-spec annotation keys."""

from __future__ import annotations

import json
from typing import Any

from modelyard.model.checkpoint import read_safetensors_header
from modelyard.transport._transfer import LocalArtifact

TITLE = "org.opencontainers.image.title"


def model_config(art: LocalArtifact, diff_ids: list[str]) -> dict[str, Any]:
    """The ModelPack config (``application/vnd.cncf.model.config.v1+json``) of the artifact."""
    m = art.manifest
    cfg: dict[str, Any] = {}
    try:
        cfg = json.loads((art.root / "model" / "config.json").read_text())
    except (OSError, ValueError):
        pass
    text: dict[str, Any] = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
    quant = m.scheme or _hf_quant(cfg)
    precision = text.get("dtype") or text.get("torch_dtype") or cfg.get("dtype") or cfg.get("torch_dtype")
    params = _param_count(art)
    descriptor = {"name": m.name or art.root.parent.name, "version": m.revision,
                  "revision": str(m.source.commit or m.revision)}
    if m.created_at:
        descriptor["createdAt"] = m.created_at.replace("+00:00", "Z")
    if cfg.get("model_type"):
        descriptor["family"] = str(cfg["model_type"])
    src = m.source.uri
    if isinstance(src, str) and src.startswith(("https://", "http://", "hf://")):
        descriptor["sourceURL"] = src
    config: dict[str, Any] = {"architecture": "transformer", "format": "safetensors"}
    if params:
        config["paramSize"] = _param_size(params)
    if precision:
        config["precision"] = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(str(precision), str(precision))
    if quant:
        config["quantization"] = str(quant)
    tc: dict[str, int | str] = {k: v for k, v in (("numLayers", text.get("num_hidden_layers")),
                             ("numAttentionHeads", text.get("num_attention_heads")),
                             ("numKVHeads", text.get("num_key_value_heads") or text.get("num_attention_heads")),
                             ("hiddenSize", text.get("hidden_size")),
                             ("intermediateSize", text.get("intermediate_size"))) if isinstance(v, int) and v > 0}
    if tc:
        heads, kv = tc.get("numAttentionHeads"), tc.get("numKVHeads")
        if heads and kv:
            tc["attentionType"] = "mha" if heads == kv else "gqa"
        tc["mlpType"] = "moe" if any(k in text for k in ("num_experts", "num_local_experts", "n_routed_experts")) else "dense"
        config["transformerConfig"] = tc
    return {"descriptor": descriptor, "config": config, "modelfs": {"type": "layers", "diffIds": diff_ids}}


def _hf_quant(cfg: dict[str, Any]) -> str | None:
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        return str(q.get("quant_method") or q.get("format") or "") or None
    return None


def _param_count(art: LocalArtifact) -> int | None:
    """Parameters from the safetensors headers (header only, no weight bytes read)."""

    total = 0
    for f in art.files:
        if f.rel.startswith("model/") and f.rel.endswith(".safetensors"):
            try:
                for t in read_safetensors_header(f.path).tensors.values():
                    n = 1
                    for d in t.shape:
                        n *= d
                    total += n
            except (ValueError, OSError):
                return None
    return total or None


def _param_size(n: int) -> str:
    for scale, letter in ((10**15, "Q"), (10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}".rstrip("0").rstrip(".") + letter
    return str(n)


def annotations_of(art: LocalArtifact) -> dict[str, str]:
    m = art.manifest
    src = m.source
    quant = m.scheme
    out = {TITLE: m.name, "org.opencontainers.image.version": m.revision,
           "org.opencontainers.image.revision": str(src.commit or m.revision),
           "org.opencontainers.image.source": str(src.uri or ""),
           "org.opencontainers.image.created": m.created_at or "",
           "dev.modelyard.content-digest": m.content_digest,
           "dev.modelyard.source.commit": str(src.commit or ""),
           "dev.modelyard.quantization": str(quant or "none")}
    if m.is_lora and m.base is not None:  # an adapter names its base by digest (the signed report carries the same)
        out |= {"dev.modelyard.kind": "lora", "dev.modelyard.base.name": m.base.name,
                "dev.modelyard.base.revision": m.base.revision, "dev.modelyard.base.digest": m.base.digest}
    return {k: v for k, v in out.items() if v}
