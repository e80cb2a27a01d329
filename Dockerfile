# modelyard for production hosts: the pinned GPU vLLM image is the runtime (what serves the model);
# modelyard lives in its own venv beside it, because its pins (transformers, compressed-tensors)
# differ from vLLM's: the same two-interpreter split as on a development machine
# (MODELYARD_VLLM_PYTHON points at the image's vLLM interpreter).
#
#   docker build -t modelyard .
#   docker run --gpus all -v /srv/modelyard:/data -e MODELYARD_HOME=/data \
#       -e HF_TOKEN modelyard ingest hf://org/name@<revision>
#
# Not built in this project's CI (no Docker engine there); the CPU path is what CI tests.
FROM vllm/vllm-openai:v0.32.0

ENV MODELYARD_HOME=/data \
    MODELYARD_VLLM_PYTHON=/usr/bin/python3 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false

WORKDIR /opt/modelyard
COPY pyproject.toml README.md ./
COPY requirements/pipeline.lock requirements/pipeline.lock
COPY modelyard modelyard
# The pipeline only needs CPU torch (checks run on the meta device; GGUF conversion on CPU).
RUN python3 -m venv /opt/modelyard/venv \
 && /opt/modelyard/venv/bin/pip install --no-cache-dir \
      --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && /opt/modelyard/venv/bin/pip install --no-cache-dir -c requirements/pipeline.lock . \
 && ln -s /opt/modelyard/venv/bin/modelyard /usr/local/bin/modelyard

VOLUME ["/data"]
ENTRYPOINT ["modelyard"]
CMD ["--help"]
