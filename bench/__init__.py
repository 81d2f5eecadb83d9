"""make bench: the static-vs-continuous table (python -m bench), and time to first token (python -m bench.ttft)."""
