"""Continuous batching through an in-process vLLM engine, stepped by one engine thread."""
