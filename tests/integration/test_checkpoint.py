"""The default model's conversion lands atomically, even when two converters race."""

import threading

import pytest

from batcher.checkpoint import save_atomically


def test_two_converters_at_once_leave_one_complete_checkpoint_and_no_leftovers(tmp_path):
    target = tmp_path / "models" / "SmolLM2"
    both_writing = threading.Barrier(2)
    errors = []

    def convert(name):
        def save(folder):
            (folder / "model.safetensors").write_text(name)
            both_writing.wait(10)  # each is half-way through its own folder while the other writes
            (folder / "config.json").write_text(name)

        try:
            save_atomically(target, save)
        except Exception as exc:  # reported below, with the other thread's outcome
            errors.append(exc)

    threads = [threading.Thread(target=convert, args=(name,)) for name in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert sorted(p.name for p in target.parent.iterdir()) == ["SmolLM2"]  # no temporary folder left
    weights, config = (target / "model.safetensors").read_text(), (target / "config.json").read_text()
    assert weights == config in ("first", "second")  # one converter's whole copy, not a mix
    assert oct(target.stat().st_mode & 0o777) == "0o755"


def test_a_failed_conversion_leaves_nothing(tmp_path):
    target = tmp_path / "SmolLM2"

    def save(folder):
        (folder / "model.safetensors").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_atomically(target, save)
    assert list(tmp_path.iterdir()) == []
