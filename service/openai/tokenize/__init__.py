"""vLLM's `/tokenize` and `/detokenize`: protocol, serving, routes."""
