"""The stages: plain typed functions, one module each."""
