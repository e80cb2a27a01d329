"""The verbs: fetch, verify, patch, quantize, serve, smoke; each a plain typed function the CLI and the flows call alike."""
