"""The front: the command line, tables, JSON/CSV/Markdown, Perfetto export, pictures and
serving. It calls the core and the analyses; nothing below imports it (tests/test_layers.py)."""
