"""gunicorn settings. Runs in the master too, so it imports no torch: the app loads in the worker.

gunicorn -c gunicorn.conf.py wsgi:app
"""

import os
import shutil
import signal
import subprocess
import tempfile

from gunicorn.errors import HaltServer

from deploy.cluster import DEFAULT_HOST, warn_if_open
from deploy.starts import EXIT_STATUS, FailedStarts
from service.config import Config, SettingError

try:  # the worker's settings, read here too (no torch: service/config.py), and checked before anything starts
    SERVICE = Config.from_env()
except SettingError as exc:  # one line, no traceback: gunicorn lets SystemExit through
    raise SystemExit(f"gunicorn: not starting: {exc}") from None

HOST = os.environ.get("HOST") or DEFAULT_HOST
bind = f"{HOST}:{SERVICE.port}"

# One process: the model thread(s) and every request thread share the engines' memory, so no
# multiprocessing hop between web and model. More workers would each load their own models.
workers = 1
worker_class = "gthread"
# Each waiting request holds a thread (a stream holds one for its whole life): size this for the
# concurrency you promise. 128 (THREADS, service/config.py) covers the benchmark's 64 concurrent
# requests with room to spare; generate requests take at most MAX_INFLIGHT_REQUESTS of them (429
# past it), so that the rest always answer /health and /metrics (service/http/inflight.py).
threads = SERVICE.threads
# Open connections gthread holds (kept-alive ones included, at most this less THREADS); past it,
# it accepts none until one closes, and a probe waits in the listen backlog. A generate request
# past the cap is refused in about a millisecond and its connection freed, so gunicorn's default
# holds a flood of 500 and the probes beside it (docs/operations.md, measured).
worker_connections = 1000
# Connections the kernel queues before gthread accepts them (gunicorn's default, capped by
# net.core.somaxconn). A probe that arrives behind them waits while each is accepted and refused;
# a shorter queue would drop connection attempts instead (a client's retry waits a second).
backlog = 2048
# The arbiter's heartbeat; gthread's main loop keeps beating while requests wait on the model.
timeout = SERVICE.gunicorn_timeout
graceful_timeout = SERVICE.graceful_timeout
DRAIN_MARGIN_S = 5  # of graceful_timeout, for the last responses to be written after the drain
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


PROBE = {}  # the probe server (deploy/probe.py), the master's child: "process", "dir"
STARTS = FailedStarts()  # how each worker's start ended, counted in the master (deploy/starts.py)


def when_ready(server):
    """In the master, once it listens: say so when anyone who reaches it may generate (a host
    beyond loopback and no API_KEY). Before the worker loads anything: it is seen at once. With
    PROBE_PORT, start the probe server: the master binds its socket (a port in use stops the
    start here, with the error) and hands it over; the worker, forked after this, writes into
    its folder (service/ops/beacon.py)."""
    for address in server.cfg.address:  # (host, port), or a unix socket's path
        if isinstance(address, tuple):
            warn_if_open(server.log, "gunicorn", address[0], address[1], bool(SERVICE.api_keys))
    STARTS.open()
    if SERVICE.probe_port:
        from deploy.probe import spawn

        folder = tempfile.mkdtemp(prefix="batcher-probe-")
        try:
            process = spawn(HOST, SERVICE.probe_port, folder)
        except OSError as exc:
            server.log.error("PROBE_PORT %d: %s; not starting", SERVICE.probe_port, exc)
            raise SystemExit(1) from None
        os.environ["PROBE_DIR"] = folder  # the worker's copy of the environment names it
        PROBE.update(process=process, dir=folder)
        server.log.info(
            "probe server (pid %d) on %s:%d: /health, /livez, /metrics", process.pid, HOST, SERVICE.probe_port
        )


def child_exit(server, worker):
    """In the master, once a worker has gone: count its start if it failed (deploy/starts.py)."""
    failed = STARTS.worker_left(worker.pid)
    if failed is not None:
        server.log.error(
            "the %s engine failed to load (%s): failed start %d of %d in a row",
            failed["engine"],
            failed["error"],
            STARTS.in_a_row,
            STARTS.limit,
        )


def pre_fork(server, worker):
    """In the master, before it forks a worker: after STARTS.limit failed starts in a row, stop
    instead, naming the engine and the error ("Reason: ..."), so that the supervisor's backoff
    takes over. Raised here, not in child_exit, since gunicorn reaps workers while it stops too."""
    reason = STARTS.give_up()
    if reason is not None:
        raise HaltServer(reason, EXIT_STATUS)


def on_exit(server):
    """The master leaves: the probe server with it, and the folder its workers report starts in."""
    STARTS.close()
    process = PROBE.get("process")
    if process is not None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(PROBE["dir"], ignore_errors=True)


def post_fork(server, worker):
    """In the worker, before it loads the app: with a probe server, start publishing to it
    ("starting" until post_worker_init attaches the app)."""
    if os.environ.get("PROBE_DIR"):
        from deploy.probe import HEALTH, METRICS
        from service.ops.beacon import Beacon

        worker.beacon = Beacon(os.environ["PROBE_DIR"], HEALTH, METRICS).start()


def post_worker_init(worker):
    """Drain on SIGTERM. gthread's own SIGTERM handler stops accepting at once and gives open
    connections `graceful_timeout`; but a request waiting for a model has not finished, and a
    balancer needs /health to say "draining". So SIGTERM first only tells the engines (new work
    503 `shutting_down`, /health 503 "draining"; the worker keeps accepting to say so), a thread
    waits until what they hold has finished, and only then hands over to gunicorn's handler,
    which lets the last responses and streams finish writing and exits. The engines get
    `graceful_timeout` minus DRAIN_MARGIN_S of it: the master kills the worker at `graceful_timeout`."""
    import threading

    from service import begin_shutdown, shutdown
    from service.http.state import app_state

    app = worker.wsgi
    gunicorn_handler = signal.getsignal(signal.SIGTERM)
    sigterm = threading.Event()
    budget = max(worker.cfg.graceful_timeout - DRAIN_MARGIN_S, worker.cfg.graceful_timeout / 2)

    def drain_then_exit():
        sigterm.wait()
        try:
            shutdown(app, timeout=budget)
        finally:
            gunicorn_handler(signal.SIGTERM, None)

    beacon = getattr(worker, "beacon", None)
    if beacon is not None:  # the probe port answers what the worker's /health would
        from service.ops.health import health_reply
        from service.ops.routes import metrics_text

        state = app_state(app)
        config, engines, registry = state.config, state.engines, state.metrics.registry
        beacon.attach(lambda: health_reply(engines, config), lambda: metrics_text(registry))

    def on_sigterm(signum, frame):  # only sets events: the drain runs in its own thread
        begin_shutdown(app)
        sigterm.set()
        if beacon is not None:
            beacon.kick()  # the probe port says "draining" now, not at the next tick

    threading.Thread(target=drain_then_exit, name="drain-on-sigterm", daemon=True).start()
    signal.signal(signal.SIGTERM, on_sigterm)

    def leave(engine: str, error: str) -> None:
        """Crash-only (batcher/watchdog.py): an engine that died or failed to load leaves the process
        no good, so the worker drains what the other engine holds and exits, the way SIGTERM
        does, and gunicorn's master starts a fresh worker (or stops: deploy/starts.py)."""
        worker.log.error("the %s engine failed (%s): this worker leaves; the master starts a fresh one", engine, error)
        if beacon is not None:
            beacon.kick()
        os.kill(os.getpid(), signal.SIGTERM)

    engines = app_state(app).engines
    STARTS.watch(engines)  # first: a failed load is reported before the worker leaves
    for engine in engines.values():
        engine.when_dead(leave)


def worker_exit(server, worker):
    """Join the engine threads before the worker process ends (after a drain, at once)."""
    app = getattr(worker, "wsgi", None)
    if app is not None:
        from service import shutdown

        shutdown(app, timeout=10)
