"""The real-GPU tier (tests/gpu/run): one module per group of checks."""
