"""Input nouns: checkpoint, snapshot, digest (hashing), source URIs, serving modes; what checks, stages and the artifact all read."""
