"""modelyard: turn an LLM checkpoint into a verified, servable artifact for vLLM.

The small public facade. ``verify(path)`` judges a model folder; ``ingest(source)`` runs the whole
Prefect flow (fetch → hash → verify → package → smoke → publish) and returns the artifact.
"""

from modelyard.version import __version__


def verify(path, target=None):  # noqa: ANN001, ANN201 - thin re-export, documented in pipeline.verify
    from modelyard.stages.verify import verify_folder  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use

    return verify_folder(path, target)


def ingest(source, home=None, **options):  # noqa: ANN001, ANN003, ANN201
    """Run the ingest flow on ``source`` into the store ``home`` (default MODELYARD_HOME);
    ``options`` are :class:`modelyard.flows.options.IngestOptions` fields. Returns IngestResult."""
    from modelyard.flows.ingest import ingest_flow  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use
    from modelyard.flows.options import IngestOptions  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use

    return ingest_flow(source, IngestOptions(**options), str(home) if home is not None else None)


__all__ = ["__version__", "ingest", "verify"]
