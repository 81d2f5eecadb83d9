"""deploy/: the rendered nginx and supervisord configs, checked by the tools themselves; no servers."""

from __future__ import annotations

import configparser
import dataclasses
import logging
import re
import runpy
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from deploy import cluster
from deploy.listen import is_loopback
from deploy.render import render
from deploy.rolling_restart import rolling_restart
from deploy.settings import Settings
from deploy.tools import find_tool
from service.config import Config

NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")


@pytest.fixture
def rendered(tmp_path, monkeypatch):
    if NGINX is None:
        pytest.skip("nginx is not installed (`make setup` installs it when run as root)")
    for key, value in {"PORT": "9100", "REPLICAS": "3", "HOST": "127.0.0.1", "CLUSTER_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("REQUEST_TIMEOUT_S", "200")
    monkeypatch.setenv("ACCEL", "gpu")
    monkeypatch.setenv("REPLICA_PRELOAD", "/lib/a%b.so")
    settings = Settings.from_env()
    render(settings)
    return settings


def test_nginx_accepts_the_rendered_config_as_an_unprivileged_foreground_process(rendered):
    conf = rendered.run_dir / "nginx.conf"
    out = subprocess.run(
        [NGINX, "-t", "-c", str(conf), "-p", f"{rendered.run_dir}/", "-e", "stderr"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    text = conf.read_text()
    for port in (9101, 9102, 9103):
        assert f"server 127.0.0.1:{port} max_fails=" in text
    assert "listen 127.0.0.1:9100;" in text and "least_conn;" in text and "proxy_buffering off;" in text
    # resent only when the replica did no work (refused, broken, 503), once, and never after a timeout
    assert "proxy_next_upstream error http_503 non_idempotent;" in text
    assert "proxy_next_upstream_tries 2;" in text and "proxy_next_upstream_timeout 10s;" in text
    assert not re.search(r"proxy_next_upstream [^;]*timeout", text)
    assert "proxy_read_timeout 230s;" in text  # above REQUEST_TIMEOUT_S
    assert "daemon off;" in text and f"pid {rendered.run_dir}/nginx.pid;" in text
    assert " down;" not in text


def test_a_restarting_replica_is_marked_down_and_the_settings_are_kept_for_the_restart(rendered):
    rendered.save()
    again = Settings.load(rendered.run_dir)
    assert again == rendered
    render(again, down=2)
    text = (rendered.run_dir / "nginx.conf").read_text()
    assert "server 127.0.0.1:9102 max_fails=3 fail_timeout=5s down;" in text
    # its probe server too (the ports after the replicas': 9104-9106), out of the probes' upstream
    assert "server 127.0.0.1:9105 max_fails=3 fail_timeout=5s down;" in text
    assert text.count(" down;") == 2


def test_each_replica_binds_is_reached_and_runs_where_its_settings_place_it(rendered):
    """replica_hosts and prefixes (deploy/hosts.py's test hosts): replica i binds to its own host,
    nginx's upstream names that host, and each program's command starts with its prefix (after the
    parent-death guard); kept for the rolling restart."""
    placed = dataclasses.replace(
        rendered,
        replica_hosts=("10.9.0.2", "10.9.0.3", "0.0.0.0"),
        prefixes={"nginx": "ip netns exec lb", "replica1": "ip netns exec h1", "replica2": "ip netns exec h2"},
    )
    render(placed, down=2)
    placed.save()
    assert Settings.load(placed.run_dir) == placed
    nginx = (placed.run_dir / "nginx.conf").read_text()
    assert (
        "server 10.9.0.2:9101 max_fails=" in nginx and "server 10.9.0.3:9102 max_fails=3 fail_timeout=5s down;" in nginx
    )
    assert "server 127.0.0.1:9103 max_fails=" in nginx  # a wildcard is reached on loopback
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";",))
    parser.read(placed.run_dir / "supervisord.conf")
    guard = f"{find_tool('setpriv')} --pdeathsig TERM -- "
    assert parser.get("program:nginx", "command").startswith(f"{guard}ip netns exec lb {find_tool('nginx')} -c ")
    for i, (host, prefix) in enumerate(
        [("10.9.0.2", "ip netns exec h1 "), ("10.9.0.3", "ip netns exec h2 "), ("0.0.0.0", "")], 1
    ):
        section = f"program:replica{i}"
        assert f'HOST="{host}"' in parser.get(section, "environment")
        command = parser.get(section, "command")
        assert command.startswith(f"{guard}{prefix}{find_tool('gunicorn')} -c gunicorn.conf.py"), command
    with pytest.raises(ValueError, match="replica_hosts"):
        dataclasses.replace(rendered, replica_hosts=("10.9.0.2",))
    with pytest.raises(ValueError, match="replica4"):
        dataclasses.replace(rendered, prefixes={"replica4": "ip netns exec h4"})


def test_supervisord_runs_nginx_and_one_program_per_replica_in_one_group(rendered):
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";",))
    parser.read(rendered.run_dir / "supervisord.conf")
    assert parser.get("supervisord", "nodaemon") == "true"
    assert parser.get("group:replicas", "programs") == "replica1,replica2,replica3"
    for i, port in enumerate((9101, 9102, 9103), 1):
        section = f"program:replica{i}"
        env = parser.get(section, "environment")
        assert f'PORT="{port}"' in env and f'CUDA_VISIBLE_DEVICES="{i - 1}"' in env
        assert 'LD_PRELOAD="/lib/a%%b.so"' in env  # supervisord expands %: doubled
        assert parser.get(section, "stopsignal") == "TERM"
        assert int(parser.get(section, "stopwaitsecs")) > 30  # longer than GRACEFUL_TIMEOUT
    assert parser.get("program:nginx", "stopsignal") == "QUIT"
    assert int(parser.get("program:nginx", "priority")) < int(parser.get("program:replica1", "priority"))


def test_a_rolling_restart_without_a_cluster_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTER_DIR", str(tmp_path / "none"))
    with pytest.raises(SystemExit, match="no cluster at"):
        rolling_restart(tmp_path / "none", health_timeout_s=1)


@pytest.mark.parametrize("replicas", ["0", "-1"])
def test_bad_replica_counts_are_refused(monkeypatch, replicas):
    monkeypatch.setenv("REPLICAS", replicas)
    with pytest.raises(ValueError, match="REPLICAS"):
        Settings.from_env()


def test_tensor_parallel_size_must_be_positive():
    assert Config(vllm_tensor_parallel_size=2).vllm_tensor_parallel_size == 2
    with pytest.raises(ValueError, match="VLLM_TENSOR_PARALLEL_SIZE"):
        Config.from_env(vllm_tensor_parallel_size=0)


def test_serve_is_one_replica_on_loopback_behind_nginx_with_its_log_on_the_terminal(tmp_path, monkeypatch):
    if NGINX is None:
        pytest.skip("nginx is not installed (`make setup` installs it when run as root)")
    for key, value in {"PORT": "9200", "REPLICAS": "3", "HOST": "0.0.0.0", "CLUSTER_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    execs = []
    monkeypatch.setattr(cluster.os, "execv", lambda path, argv: execs.append(argv))
    monkeypatch.setattr(cluster, "missing", lambda accel: False)  # this machine has its profile
    cluster.serve(Settings.from_env())
    assert execs and execs[0][0].endswith("supervisord")  # the cluster's launcher, one replica
    nginx, supervisord = (tmp_path / "nginx.conf").read_text(), (tmp_path / "supervisord.conf").read_text()
    assert "listen 0.0.0.0:9200;" in nginx and "server 127.0.0.1:9201 max_fails=" in nginx and ":9203" not in nginx
    probes = nginx[nginx.index("upstream probes") :]  # one replica's probe server, on the port after it
    assert "server 127.0.0.1:9202 max_fails=" in probes[: probes.index("}")] and 'PROBE_PORT="9202"' in supervisord
    assert "client_header_timeout 30s;" in nginx and "client_body_timeout 30s;" in nginx
    assert 'HOST="127.0.0.1"' in supervisord and "stdout_logfile=/dev/stdout" in supervisord
    assert Settings.load(tmp_path).replica_host == "127.0.0.1"  # a rolling restart renders the same


def test_serve_with_no_profile_yet_starts_one_replica_and_keeps_a_second_for_the_switch(tmp_path, monkeypatch):
    """deploy/first_profile.py's cluster: replica1 starts and serves, replica2 neither starts nor
    gets traffic until the switch, and the first-profile program runs once beside them."""
    if NGINX is None:
        pytest.skip("nginx is not installed (`make setup` installs it when run as root)")
    for key, value in {"PORT": "9400", "REPLICA_PRELOAD": "/lib/t.so", "CLUSTER_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(cluster.os, "execv", lambda path, argv: None)
    monkeypatch.setattr(cluster, "missing", lambda accel: True)
    cluster.serve(Settings.from_env())
    nginx = (tmp_path / "nginx.conf").read_text()
    assert "server 127.0.0.1:9401 max_fails=3 fail_timeout=5s;" in nginx
    assert "server 127.0.0.1:9402 max_fails=3 fail_timeout=5s down;" in nginx
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";",))
    parser.read(tmp_path / "supervisord.conf")
    assert parser.get("program:replica1", "autostart") == "true"
    assert parser.get("program:replica2", "autostart") == "false"
    assert parser.get("program:first-profile", "command").endswith(f"-m deploy.first_profile {tmp_path}")
    assert parser.get("program:first-profile", "autorestart") == "false"
    assert parser.get("program:first-profile", "environment") == 'LD_PRELOAD="/lib/t.so"'
    assert Settings.load(tmp_path).first_profile  # what the switch renders from
    render(Settings.load(tmp_path), down=1)  # the switch: replica1 out, replica2 in
    nginx = (tmp_path / "nginx.conf").read_text()
    assert "server 127.0.0.1:9401 max_fails=3 fail_timeout=5s down;" in nginx
    assert "server 127.0.0.1:9402 max_fails=3 fail_timeout=5s;" in nginx


def test_serve_without_nginx_warns_and_runs_plain_gunicorn_on_host_and_port(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PORT", "9300")
    monkeypatch.setenv("HOST", "0.0.0.0")
    monkeypatch.setenv("CLUSTER_DIR", str(tmp_path))
    real = find_tool
    monkeypatch.setattr(cluster, "find_tool", lambda name: None if name == "nginx" else real(name))
    monkeypatch.setattr(cluster.os, "chdir", lambda path: None)
    execs = []
    monkeypatch.setattr(cluster.os, "execve", lambda path, argv, env: execs.append((argv, env)))
    monkeypatch.setattr(cluster, "missing", lambda accel: False)
    with caplog.at_level("WARNING", logger="deploy.serve"):
        cluster.serve(Settings.from_env())
    ((argv, env),) = execs
    assert argv[0].endswith("gunicorn") and argv[1:] == ["-c", "gunicorn.conf.py", "wsgi:app"]
    assert env["HOST"] == "0.0.0.0" and env["PORT"] == "9300"
    assert "nginx not found" in caplog.text and "plain gunicorn on 0.0.0.0:9300" in caplog.text
    assert not (tmp_path / "supervisord.conf").exists()


# --- safe by default: loopback unless HOST says otherwise, and a warning when open to all ---------
GUNICORN_CONF = Path(__file__).resolve().parents[2] / "gunicorn.conf.py"


@pytest.mark.parametrize(
    "host, loopback",
    [("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True)]
    + [("0.0.0.0", False), ("::", False), ("10.0.0.12", False), ("example.com", False)],
)
def test_loopback_is_127_0_0_0_8_ipv6s_one_and_localhost(host, loopback):
    assert is_loopback(host) is loopback


def test_cluster_and_replicas_bind_loopback_unless_host_says_otherwise(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTER_DIR", str(tmp_path))
    for name in ("HOST", "REPLICA_HOST"):
        monkeypatch.delenv(name, raising=False)
    s = Settings.from_env()
    assert (s.host, s.replica_at(1)) == ("127.0.0.1", ("127.0.0.1", "127.0.0.1"))
    monkeypatch.setenv("HOST", "")  # what `make cluster` passes when HOST is not given
    assert Settings.from_env().host == "127.0.0.1"
    monkeypatch.setenv("HOST", "0.0.0.0")  # nginx on every interface; the replicas stay on loopback
    assert (Settings.from_env().host, Settings.from_env().replica_host) == ("0.0.0.0", "127.0.0.1")
    monkeypatch.setenv("REPLICA_HOST", "0.0.0.0")  # asked for: e.g. /metrics scraped from another machine
    s = Settings.from_env()
    assert s.replica_at(2) == ("0.0.0.0", "127.0.0.1")


@pytest.mark.parametrize(
    "host, api_key, warned",
    [("0.0.0.0", None, True), ("0.0.0.0", "k", False), ("127.0.0.1", None, False), ("", None, False)],
)
def test_the_cluster_warns_when_nginx_listens_beyond_loopback_without_an_api_key(
    tmp_path, monkeypatch, caplog, host, api_key, warned
):
    if NGINX is None:
        pytest.skip("nginx is not installed (`make setup` installs it when run as root)")
    for key, value in {"PORT": "9400", "HOST": host, "API_KEY": api_key, "CLUSTER_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(key, value) if value is not None else monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(cluster.os, "execv", lambda path, argv: None)
    with caplog.at_level("WARNING", logger="deploy.cluster"):
        cluster.run(Settings.from_env())
    assert ("beyond loopback, with no API_KEY" in caplog.text) is warned, caplog.text
    if warned:
        assert "nginx listens on 0.0.0.0:9400" in caplog.text


def gunicorn_settings(monkeypatch, **env) -> dict:
    """gunicorn.conf.py's settings as gunicorn reads them, with `env` (None: unset)."""
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    return runpy.run_path(str(GUNICORN_CONF))


def test_gunicorn_binds_loopback_unless_host_says_otherwise(monkeypatch):
    assert gunicorn_settings(monkeypatch, HOST=None, PORT=None)["bind"] == "127.0.0.1:8000"
    assert gunicorn_settings(monkeypatch, HOST="0.0.0.0", PORT="9000")["bind"] == "0.0.0.0:9000"


def test_gunicorn_threads_and_the_cap_below_them_come_from_one_setting(monkeypatch):
    conf = gunicorn_settings(monkeypatch, THREADS=None, MAX_INFLIGHT_REQUESTS=None)
    assert conf["threads"] == Config().threads == 128 and Config().inflight_limit < conf["threads"]
    conf = gunicorn_settings(monkeypatch, THREADS="24")
    assert conf["threads"] == 24 and Config.from_env().inflight_limit == 16
    assert conf["worker_connections"] > conf["threads"]  # room for kept-alive connections and probes
    with pytest.raises(SystemExit, match="MAX_INFLIGHT_REQUESTS"):
        gunicorn_settings(monkeypatch, THREADS="24", MAX_INFLIGHT_REQUESTS="24")  # refused at start


@pytest.mark.parametrize(
    "bind, api_key, warned",
    [("0.0.0.0:8000", None, True), ("0.0.0.0:8000", "k", False), ("127.0.0.1:8000", None, False)]
    + [("unix:/tmp/x.sock", None, False)],
)
def test_gunicorn_warns_at_start_when_it_listens_beyond_loopback_without_an_api_key(
    monkeypatch, caplog, bind, api_key, warned
):
    from gunicorn.config import Config as GunicornConfig

    conf = gunicorn_settings(monkeypatch, API_KEY=api_key)
    settings = GunicornConfig()
    settings.set("bind", [bind])
    arbiter = SimpleNamespace(cfg=settings, log=logging.getLogger("gunicorn.error"))  # what the hook reads
    with caplog.at_level("WARNING", logger="gunicorn.error"):
        conf["when_ready"](arbiter)
    assert ("beyond loopback, with no API_KEY" in caplog.text) is warned, caplog.text
