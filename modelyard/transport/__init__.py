"""Moving artifacts: bundles (tar.zst), the HF cache, OCI registries, S3, signatures."""
