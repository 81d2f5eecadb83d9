"""The benchmark itself, tiny: it measures the real service (the session's static-only gunicorn,
`static_server`, through `--url`: a start of its own cost this module 18 of its 25 s) and writes
its results; a few seconds of the soak, for its accounting; and the batch phase on four lines,
through the Files and Batches API."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_runs_and_writes_json_with_the_round_model(static_server, tmp_path):
    # 4 tokens a prompt: what is checked (rounds, the tables, the JSON) does not depend on how many
    cmd = [sys.executable, "-m", "bench", "--url", static_server.url, "--batch-size", "4", "--n", "1", "4"]
    cmd += ["--max-tokens", "4", "--only", "grid", "--out", str(tmp_path)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "| N |" in run.stdout  # the markdown table
    result = json.loads((tmp_path / "latest.json").read_text())
    static_one = {c["n"]: c for c in result["cells"] if c["path"] == "static" and c["method"] == "one"}
    assert static_one[1]["rounds"] == [1] and static_one[4]["rounds"] == [1]  # ceil(N / 4)
    assert result["machine"]["cores"] >= 1 and result["config"]["url"] == static_server.url
    assert any("vLLM engine disabled" in note for note in result["notes"])  # static_server's: the static path alone
    assert [r["rounds"] for r in result["round_model"]] == ["PASS", "PASS"]  # the round model's table


def test_soak_accounts_for_every_request(static_server, tmp_path):
    # a few seconds of the soak (bench/soak.py): with vLLM disabled it must say so and use the static
    # routes alone; its verdict may be either (a busy shared machine can make /health slow), but
    # every request it sent must be accounted for, and a FAIL must say why
    cmd = [sys.executable, "-m", "bench", "--url", static_server.url, "--only", "soak", "--soak-seconds", "6"]
    cmd += ["--probe-url", static_server.probe_url, "--max-tokens", "4", "--out", str(tmp_path)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    result = json.loads((tmp_path / "latest.json").read_text())
    assert "soak" in result, run.stdout[-3000:] + run.stderr[-3000:]  # the phase ran to its verdict
    # the probe server's answers are the ones ruled; the worker's are shown beside them
    rows = {row["what"]: row["detail"] for row in result["soak"]}
    assert "shown, not ruled" not in rows["probe server /health max latency (ms)"]
    assert "shown, not ruled" in rows["worker /health max latency (ms)"]
    assert "### Soak" in run.stdout and "vllm skipped: disabled" in run.stdout
    counts = result["soak_counts"]
    assert counts["sent"] > 0 and sum(counts["outcomes"].values()) == counts["sent"], counts
    assert all(k.split(" ")[0].rstrip(":,") in ("200", "429", "503", "504", "LOST", "FAIL") for k in counts["outcomes"])
    assert run.returncode == (1 if result["soak_failures"] else 0), run.stdout[-3000:]
    assert ("soak FAILED: " in run.stdout) == bool(result["soak_failures"])


def test_batch_phase_runs_a_small_batch_through_the_api(static_server, tmp_path):
    # four lines through the Files and Batches API on the static engine alone (the server's vLLM is
    # disabled: /v1 and vLLM's run_batch are left out, with a note), then the spare room's two loads
    cmd = [sys.executable, "-m", "bench", "--url", static_server.url, "--only", "batch", "--batch-lines", "4"]
    cmd += ["--max-tokens", "4", "--out", str(tmp_path)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "latest.json").read_text())
    (row,) = result["batch"]
    assert row["run"] == "ours /static/v1 (static engine)" and row["answered 200"] == 4, (row, result["notes"])
    made, asked = row["output tokens (asked)"].replace("(", "").replace(")", "").split()
    assert made == asked and row["lines/s"] > 0  # ignore_eos: every line made exactly its max_tokens
    (spare,) = result["batch_spare_room"]
    assert spare["engine"] == "static" and spare["other failures"] == 0, spare
    assert spare["TTFT p50 alone (ms)"] > 0 and spare["TTFT p50 with a batch (ms)"] > 0, spare
    assert any("run_batch skipped" in note for note in result["notes"]), result["notes"]
    assert "### Batch jobs" in run.stdout and "### A batch in the spare room" in run.stdout
    targets = {r["target"]: r["result"] for r in result["targets"]}
    assert targets["batch: vLLM run_batch's lines/s over ours on /v1"] == "SKIP"
    assert "batch behind interactive streams, static: interactive 429s it added" in targets
