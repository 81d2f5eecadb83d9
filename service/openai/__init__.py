"""The OpenAI API on both engines (`/v1` for vLLM, `/static/v1` for the static batcher):
completions, chat, Responses, models, and vLLM's /tokenize and /detokenize; their reply shapes
and streams."""
