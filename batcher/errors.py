"""What an engine can refuse or fail with; service/errors.py gives each its HTTP status."""


class EngineError(Exception):
    """Base class."""


class QueueFull(EngineError):
    """Not all of a request's sequences fit: none of them was enqueued (429)."""


class NeverFits(EngineError):
    """More sequences than the engine's queue can ever hold: no retry can succeed (400)."""


class EngineDied(EngineError):
    """The engine thread died or stopped making progress: what it held is answered with this
    (503), and the process leaves so that its supervisor starts a fresh one (batcher/engine.py)."""


class NotReady(EngineError):
    """The engine is still loading, or failed to load, or is disabled (503)."""


class ShuttingDown(EngineError):
    """The engine is stopping and takes no more work; waiting sequences get this (503)."""


class RoundFailed(EngineError):
    """The batch this sequence ran in raised; only that batch's sequences get this (500)."""


class RowFailed(EngineError):
    """This sequence's own work in its round raised (its tokenization, its grammar, its stop
    strings): it alone fails (500); the others of the round run on (batcher/static/isolation.py)."""


class InvalidParams(EngineError):
    """A sampling parameter only the loaded model can judge (a token id beyond its vocabulary):
    nothing was enqueued (422). `param` names the request field."""

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.param = param


class WaitTooLong(EngineError):
    """The predicted wait is longer than the request allows (its deadline, or REQUEST_TIMEOUT_S
    for the whole of it): nothing was enqueued (429, Retry-After from `prediction`)."""

    def __init__(self, message: str, *, prediction):
        super().__init__(message)
        self.prediction = prediction  # batcher.predict.Prediction
