"""The effective llm-compressor recipe of a scheme: loaded from ``modelyard/recipes/`` (or ``--recipe``), fitted to
the model's Linear input widths (group sizes), serialized with its sha256."""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from modelyard import paths
from modelyard.errors import QuantizeError

RECIPES = paths.RECIPES
#: groups used by llm-compressor's preset schemes (compressed-tensors quant_scheme.py).
_PRESET_GROUP = {"NVFP4": 16, "NVFP4A16": 16, "MXFP4": 32, "W4A16": 128, "W4A16_ASYM": 128}



@dataclass(frozen=True)
class Recipe:
    """The effective recipe: YAML ``text``, its ``sha256``, where it came from, and what
    :func:`fit_recipe` changed (``adjustments``, human-readable)."""

    text: str
    sha256: str
    source: str
    adjustments: tuple[str, ...] = ()


def load_recipe(name: str, recipe_file: Path | None = None) -> tuple[dict[str, Any], str]:
    """The recipe dict of scheme ``name`` (or of ``recipe_file``) and its source label.
    Raises :class:`QuantizeError` for an unreadable or non-YAML recipe."""
    path = Path(recipe_file) if recipe_file else RECIPES / f"{name}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise QuantizeError(f"recipe {path}: cannot read it as YAML ({exc})",
                            fix="Pass an llm-compressor recipe YAML file.") from exc
    if not isinstance(data, dict):
        raise QuantizeError(f"recipe {path} is not a YAML mapping of stages", fix="See modelyard/recipes/*.yaml.")
    return data, (f"modelyard/recipes/{name}.yaml" if recipe_file is None else str(path))


def input_widths(cfg: dict[str, Any]) -> dict[str, int]:
    """Input widths (elements) of the Linear layers of a decoder: q/k/v/gate/up read hidden_size,
    o_proj reads heads x head_dim, down_proj reads intermediate_size."""
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    out = {}
    if isinstance(hidden, int):
        out["hidden_size"] = hidden
    head_dim = cfg.get("head_dim") if isinstance(cfg.get("head_dim"), int) else (
        hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None)
    if isinstance(heads, int) and head_dim:
        out["num_attention_heads x head_dim"] = heads * head_dim
    for k in ("intermediate_size", "moe_intermediate_size"):
        if isinstance(cfg.get(k), int):
            out[k] = cfg[k]
    return out


def fit_recipe(recipe: dict[str, Any], cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Lower every ``group_size`` (128 -> 64 -> 32) until it divides every Linear input width of
    ``cfg``; returns the new recipe and what changed. Raises :class:`QuantizeError` when no group
    down to 32 fits, or a preset scheme's fixed group does not."""
    widths = input_widths(cfg)
    out = copy.deepcopy(recipe)
    notes: list[str] = []

    def bad(g: int) -> list[str]:
        return [f"{k} {w}" for k, w in widths.items() if w % g]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            g = node.get("group_size")
            if isinstance(g, int) and g > 0 and node.get("strategy") == "group" and bad(g):
                new = next((c for c in (g // 2, g // 4) if c >= 32 and not bad(c)), None)
                if new is None:
                    raise QuantizeError(f"group_size {g}: {', '.join(bad(g))} is not a multiple of it, nor of 64 or 32",
                                        fix="Use a per-channel scheme (w8a8, fp8-dynamic) for this model.")
                notes.append(f"group_size {g} -> {new}: {', '.join(bad(g))} is not a multiple of {g}")
                node["group_size"] = new
            preset = node.get("scheme")
            if isinstance(preset, str) and preset in _PRESET_GROUP and bad(_PRESET_GROUP[preset]):
                raise QuantizeError(f"scheme {preset} quantizes in groups of {_PRESET_GROUP[preset]}, and "
                                    f"{', '.join(bad(_PRESET_GROUP[preset]))} is not a multiple of it",
                                    fix="Choose another scheme for this model.")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(out)
    return out, notes


def make_recipe(name: str, cfg: dict[str, Any], recipe_file: Path | None = None) -> Recipe:
    """Load, fit to ``cfg`` and serialize the recipe of scheme ``name``."""
    data, source = load_recipe(name, recipe_file)
    fitted, notes = fit_recipe(data, cfg)
    text = yaml.safe_dump(fitted, sort_keys=False)
    return Recipe(text, hashlib.sha256(text.encode()).hexdigest(), source, tuple(notes))
