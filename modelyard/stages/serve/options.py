"""What a user asks of the serve plan: the GPUs ingest writes serve/ for (``--gpu``, ``--gpus``), and serve-plan's target."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field

from modelyard.model.options import Flag
from modelyard.stages.serve.gpus import GPUS
from modelyard.stages.serve.plan import KV_CACHE_DTYPES


class ServeFlags(BaseModel):
    """The serve plan's target: GPU class and count (None: H100-80GB on the fewest that fit)."""

    model_config = ConfigDict(frozen=True)

    gpu: Annotated[Optional[str], Flag("--gpu", choices=GPUS)] = Field(
        None, description="serve/ plan target GPU (default: H100-80GB on the fewest GPUs that fit)")
    gpus: Annotated[Optional[int], Flag("--gpus")] = Field(None, gt=0, description="serve/ plan GPU count")


class ServePlanFlags(BaseModel):
    """``serve-plan``'s target (:class:`~modelyard.stages.serve.plan.ServeTarget`): the GPU model and how many
    (per node), nodes, the parallel sizes (None: the plan picks), vLLM's memory fraction, the KV cache dtype
    and the context to plan for (tokens)."""

    model_config = ConfigDict(frozen=True)

    gpu: Annotated[str, Flag("--gpu", choices=GPUS)] = Field(description="GPU model")
    gpus: Annotated[int, Flag("--gpus", "--gpus-per-node")] = Field(
        1, gt=0, description="GPUs available on the host (on each node)")
    nodes: Annotated[int, Flag("--nodes")] = Field(
        1, gt=0, description="nodes available; the plan uses the fewest that hold the model and its context (tensor "
                             "parallel inside a node, pipeline parallel across nodes, served through Ray)")
    pipeline_parallel_size: Annotated[Optional[int], Flag("--pipeline-parallel-size", "--pp")] = Field(
        None, gt=0, description="default: one stage per node used")
    gpu_memory_utilization: Annotated[float, Flag("--gpu-memory-utilization")] = Field(
        0.9, ge=0.01, le=1.0, description="vLLM's fraction of GPU memory")
    kv_cache_dtype: Annotated[str, Flag("--kv-cache-dtype", choices=KV_CACHE_DTYPES)] = Field(
        "auto", description="KV cache dtype (auto: the model's dtype)")
    tensor_parallel_size: Annotated[Optional[int], Flag("--tensor-parallel-size", "--tp")] = Field(
        None, gt=0, description="default: the largest valid size <= --gpus")
    max_model_len: Annotated[Optional[int], Flag("--max-model-len")] = Field(
        None, gt=0, description="context to plan for (tokens)")


class VerifyOnLoadFlags(BaseModel):
    """serve/k8s's verify-on-load: the pod pulls the artifact by digest into its own volume with ``modelyard
    pull`` (an init container) and vLLM starts only when every file's sha256 and the signature check out."""

    model_config = ConfigDict(frozen=True)

    verify_from: Annotated[Optional[str], Flag("--verify-from")] = Field(
        None, description="oci://HOST/REPO@sha256:DIGEST of the published artifact: serve/k8s pulls it by digest in an "
                          "init container and serves only what checked out (implies --k8s)")
    require_signature: Annotated[bool, Flag("--allow-unsigned", negate=True)] = Field(
        True, description="with --verify-from: do not require the artifact's signature (the init container still "
                          "checks every file's sha256 against the manifest pulled by digest)")
    signing_key_secret: Annotated[Optional[str], Flag("--signing-key-secret")] = Field(
        None, description="the Secret holding the public key (key model.pub) for --verify-from (default: "
                          "NAME-signing-key)")
    registry_secret: Annotated[Optional[str], Flag("--registry-secret")] = Field(
        None, description="with --verify-from: a kubernetes.io/basic-auth Secret (keys username, password) with the "
                          "registry's pull credentials for the init container (default: an anonymous pull)")
    verifier_image: Annotated[Optional[str], Flag("--verifier-image")] = Field(
        None, description="the image of the init container: one with modelyard installed (default: modelyard's "
                          "Dockerfile image, modelyard:VERSION)")
