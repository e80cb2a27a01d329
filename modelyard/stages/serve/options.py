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


class CanaryFlags(BaseModel):
    """serve-plan's canary forms: a second artifact behind the nginx front (``--canary``), or KServe's split."""

    model_config = ConfigDict(frozen=True)

    canary: Annotated[Optional[str], Flag("--canary")] = Field(
        None, description="a second artifact (folder or NAME[@REVISION]) to roll out beside PATH: serve/ gets its canary "
                          "form (a vllm-canary server, weighted nginx upstreams for `modelyard rollout`; implies --proxy, "
                          "needs --output)")
    canary_percent: Annotated[Optional[int], Flag("--canary-percent")] = Field(
        None, description="with --storage-uri: the KServe InferenceService's canaryTrafficPercent (1..99; Serverless mode)")


class LoraFlags(BaseModel):
    """serve-plan's LoRA adapters served on one base (vLLM ``--enable-lora --lora-modules``)."""

    model_config = ConfigDict(frozen=True)

    lora: Annotated[tuple[str, ...], Flag("--lora")] = Field(
        (), description="a LoRA adapter artifact (folder or NAME[@REVISION]) to serve on PATH's base, beside any other "
                        "--lora (repeat it); each must name that base by digest")


class RolloutFlags(BaseModel):
    """``rollout``'s traffic steps and where the front, the canary and nginx's reload are."""

    model_config = ConfigDict(frozen=True)

    steps: Annotated[str, Flag("--steps")] = Field(
        "10,50,100", description="percent of requests to the canary at each step, increasing")
    front: Annotated[str, Flag("--front")] = Field(
        "http://127.0.0.1:8080", description="the nginx front's URL (MODELYARD_API_KEY is sent as its Bearer key)")
    canary_url: Annotated[str, Flag("--canary-url")] = Field(
        "http://127.0.0.1:8001", description="the canary server's own URL, where each step judges it")
    reload: Annotated[str, Flag("--reload")] = Field(
        "docker compose exec -T nginx nginx -s reload", description="the command that reloads nginx, run in --serve")
    stable_server: Annotated[str, Flag("--stable-server")] = Field(
        "vllm:8000", description="the stable server's HOST:PORT as nginx reaches it")
    canary_server: Annotated[str, Flag("--canary-server")] = Field(
        "vllm-canary:8000", description="the canary server's HOST:PORT as nginx reaches it")
    bake: Annotated[float, Flag("--bake")] = Field(
        60.0, ge=0, description="seconds each step bakes under the front's real traffic once its smoke passed: the "
                                "canary's /health and its 5xx answers (its own http_requests_total) are watched")
    step_timeout: Annotated[float, Flag("--step-timeout")] = Field(
        1800.0, gt=0, description="seconds a step may take (front check, smoke and bake) before it is rolled back")
    resume: Annotated[bool, Flag("--resume")] = Field(
        False, description="continue the unfinished rollout of serve/canary/rollout.json after its last passed step")
    rollback: Annotated[bool, Flag("--rollback")] = Field(
        False, description="send all traffic to the stable server now, from serve/canary/rollout.json alone")
