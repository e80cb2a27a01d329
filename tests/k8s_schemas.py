"""Validate generated Kubernetes manifests against the real schemas, strictly (an unknown key is an error).

- Built-in kinds (Deployment, Service, PersistentVolumeClaim): ``kubernetes-validate`` with its strict
  JSON schemas for Kubernetes :data:`K8S_VERSION`.
- ``InferenceService``: the KServe SDK's model classes (``kserve.models``, generated from KServe's
  OpenAPI spec). Each key must be in the class's ``attribute_map``, each value of its ``openapi_types``
  type, and the class must accept the values (its required-field checks); the Kubernetes types it embeds
  (``V1Container``, ``V1Volume``, ``V1ObjectMeta`` ...) are checked against the same strict Kubernetes
  definitions as above.

The KServe SDK wheel is installed ``--no-deps`` into ``.kserve-sdk/`` by the Makefile: its package
``__init__`` starts the model-server stack, whose pins (pandas<3, protobuf<7) clash with the pipeline's, so
``kserve.models`` (which needs only six and urllib3) is imported without it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

K8S_VERSION = "1.33.0"
KSERVE_SDK = Path(__file__).resolve().parents[1] / ".kserve-sdk"
_PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "object": (object,),
               "datetime": (str,), "date": (str,)}


def validate_builtin(doc: dict[str, Any]) -> str:
    """Strict kubernetes-validate; returns the schema version used, raises its ValidationError."""
    return kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def kserve_models():  # noqa: ANN201
    """``kserve.models`` from ``.kserve-sdk`` (see the module docstring)."""
    if "kserve" not in sys.modules:
        pkg = KSERVE_SDK / "kserve"
        if not (pkg / "models" / "v1beta1_inference_service.py").is_file():
            raise RuntimeError(f"{pkg} is missing: `make .kserve-sdk/.stamp` installs the KServe SDK wheel there")
        mod = importlib.util.module_from_spec(importlib.machinery.ModuleSpec("kserve", None, is_package=True))
        mod.__path__ = [str(pkg)]
        sys.modules["kserve"] = mod
    return importlib.import_module("kserve.models")


@cache
def _k8s_defs() -> tuple[dict[str, Any], Registry]:
    ver = K8S_VERSION
    defs = schema_contents(f"kubernetes-json-schema/v{ver}-local-strict/_definitions.json", ver)
    return defs, Resource.from_contents(defs) @ Registry()


def _k8s_definition(type_name: str) -> str | None:
    """The Kubernetes OpenAPI definition for a generated client type name (``V1Container`` ...)."""
    defs = _k8s_defs()[0]["$defs"]
    if type_name == "ResourceQuantity":
        return "io.k8s.apimachinery.pkg.api.resource.Quantity"
    if type_name.startswith("K8sIoApi"):  # K8sIoApiAppsV1DeploymentStrategy
        group, rest = type_name[len("K8sIoApi"):].split("V1", 1)
        key = f"io.k8s.api.{group.lower()}.v1.{rest}"
        return key if key in defs else None
    if type_name.startswith("V1"):
        for prefix in ("io.k8s.api.core.v1.", "io.k8s.apimachinery.pkg.apis.meta.v1."):
            if prefix + type_name[2:] in defs:
                return prefix + type_name[2:]
    return None


def _check_k8s_type(value: Any, type_name: str, path: str) -> list[str]:
    name = _k8s_definition(type_name)
    if name is None:
        return [f"{path}: no Kubernetes definition for {type_name}"]
    defs, registry = _k8s_defs()
    validator = jsonschema.Draft202012Validator({"$ref": f"{defs['$id']}#/$defs/{name}"}, registry=registry)
    return [f"{path}{''.join(f'.{p}' for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(value)]


def _check_value(value: Any, typ: str, path: str) -> list[str]:
    if typ.startswith("list["):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in _check_value(v, typ[5:-1], f"{path}[{i}]")]
    if typ.startswith("dict("):
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {type(value).__name__}"]
        inner = typ[typ.index(",") + 1:-1].strip()
        return [p for k, v in value.items() for p in _check_value(v, inner, f"{path}.{k}")]
    if typ in _PRIMITIVES:
        ok = isinstance(value, _PRIMITIVES[typ]) and not (typ in ("int", "float") and isinstance(value, bool))
        return [] if ok else [f"{path}: expected {typ}, got {type(value).__name__} {value!r}"]
    if hasattr(kserve_models(), typ):
        return check_kserve(value, typ, path)
    return _check_k8s_type(value, typ, path)


def check_kserve(data: Any, class_name: str = "V1beta1InferenceService", path: str = "") -> list[str]:
    """Problems of ``data`` as the KServe SDK class ``class_name`` (empty when it is valid)."""
    cls = getattr(kserve_models(), class_name)
    if not isinstance(data, dict):
        return [f"{path or class_name}: expected a {class_name} mapping, got {type(data).__name__}"]
    by_key = {v: k for k, v in cls.attribute_map.items()}
    problems = []
    for key, value in data.items():
        attr = by_key.get(key)
        if attr is None:
            problems.append(f"{path}.{key}: not a field of {class_name}")
            continue
        problems += _check_value(value, cls.openapi_types[attr], f"{path}.{key}")
    try:  # the generated class's own checks: required fields, allowed values
        cls(**{by_key[k]: v for k, v in data.items() if k in by_key})
    except (ValueError, TypeError) as exc:
        problems.append(f"{path or class_name}: {exc}")
    return problems
