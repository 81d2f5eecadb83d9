"""gunicorn settings. Runs in the master too, so it imports no torch: the app loads in the worker.

gunicorn -c gunicorn.conf.py wsgi:app
"""

import os
import signal

bind = f"{os.environ.get('HOST', '0.0.0.0')}:{os.environ.get('PORT', '8000')}"

# One process: the model thread(s) and every request thread share the engines' memory, so no
# multiprocessing hop between web and model. More workers would each load their own models.
workers = 1
worker_class = "gthread"
# Each waiting request holds a thread (a stream holds one for its whole life): size this for the
# concurrency you promise. 128 covers the benchmark's 64 concurrent requests with room to spare.
threads = int(os.environ.get("THREADS", "128"))
# The arbiter's heartbeat; gthread's main loop keeps beating while requests wait on the model.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "300"))
graceful_timeout = int(os.environ.get("GRACEFUL_TIMEOUT", "30"))
keepalive = 5
# Threads do not survive fork, and CUDA must not start in the master: load the app in the worker.
preload_app = False

loglevel = os.environ.get("LOG_LEVEL", "info")
accesslog = os.environ.get("ACCESS_LOG") or None  # the app logs one line per generate request
# gunicorn configures only its own loggers; route the app's (one INFO line per round) to stdout.
logconfig_dict = {
    "root": {"level": loglevel.upper(), "handlers": ["console"]},
    "loggers": {  # gunicorn's own, without propagating to the root handler (no double lines)
        "gunicorn.error": {"level": loglevel.upper(), "handlers": ["error_console"], "propagate": False},
        "gunicorn.access": {"level": "INFO", "handlers": ["console"], "propagate": False},
    },
    "formatters": {
        "generic": {
            "format": "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s",
            "datefmt": "[%Y-%m-%d %H:%M:%S %z]",
            "class": "logging.Formatter",
        }
    },
}


def post_worker_init(worker):
    """On SIGTERM, first tell the engines (waiting requests answer 503 at once, the running round
    is abandoned), then let gunicorn stop accepting and drain connections as usual."""
    gunicorn_handler = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        from service import begin_shutdown

        begin_shutdown(worker.wsgi)
        gunicorn_handler(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)


def worker_exit(server, worker):
    """Join the engine threads before the worker process ends."""
    app = getattr(worker, "wsgi", None)
    if app is not None:
        from service import shutdown

        shutdown(app, timeout=10)
