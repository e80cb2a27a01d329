"""modelyard: turn an LLM checkpoint into a verified, servable artifact for vLLM.

The small public facade. ``verify(path)`` judges a model folder; ``ingest(source)`` runs the whole
Prefect flow (fetch → hash → verify → package → smoke → publish) and returns the artifact.
"""

__version__ = "0.1.0"


def verify(path, target=None):  # noqa: ANN001, ANN201 - thin re-export, documented in pipeline.verify
    from modelyard.pipeline.verify import verify_folder

    return verify_folder(path, target)


def ingest(source, home=None, **options):  # noqa: ANN001, ANN003, ANN201
    """Run the ingest flow on ``source`` into the store ``home`` (default MODELYARD_HOME);
    ``options`` are :class:`modelyard.pipeline.options.IngestOptions` fields. Returns IngestResult."""
    from modelyard.flows.ingest import ingest_flow
    from modelyard.pipeline.options import IngestOptions

    return ingest_flow(source, IngestOptions(**options), str(home) if home is not None else None)


__all__ = ["__version__", "ingest", "verify"]
