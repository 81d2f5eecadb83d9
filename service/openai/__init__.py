"""The OpenAI API on both engines (`/v1` for vLLM, `/static/v1` for the static batcher), a folder
per API: chat/, completions/, responses/, models/, tokenize/ (vLLM's /tokenize, /detokenize),
each with protocol.py (the request), serving.py (request -> plan -> run or stream -> reply) and
routes.py (thin views); router.py adds them to their base URLs. What the APIs share sits beside
them: protocol.py (the bodies' common fields), fields.py (every route's field table, the one
check), serving.py (the plan and the run of chat and completions), replies.py, stream.py, echo.py."""
