"""`GET /v1/models`: the one model this service serves, as its card."""

from __future__ import annotations

from service import structured
from service.http.state import AppState


def model_card(state: AppState) -> dict:
    config = state.config
    return {
        "id": config.model_name,
        "object": "model",
        "created": state.started_at,
        "owned_by": "batching-service",
        "root": state.model_path,
        "max_model_len": config.max_model_len,
        "structured_outputs": structured.SUPPORTED,  # the kinds both engines constrain decoding to
    }
