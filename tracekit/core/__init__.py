"""The trace core: decoding, loading, the cache, classification and the trace model.

Imports nothing from `tracekit.analyses` or `tracekit.front` (tests/test_layers.py)."""
