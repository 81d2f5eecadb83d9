"""bench/peers.py: where it finds llama.cpp's converter beside the llama-server it is given."""

from __future__ import annotations

import pytest

from bench import peers


def test_the_converter_is_found_in_the_tree_the_server_was_built_in(tmp_path):
    tree = tmp_path / "llama.cpp"
    (tree / "build" / "bin").mkdir(parents=True)
    (tree / peers.CONVERTER).write_text("")
    assert peers.llama_tree(tree / "build" / "bin" / "llama-server") == tree


def test_a_server_outside_a_llama_cpp_tree_is_refused_by_name(tmp_path):
    (tmp_path / "bin").mkdir()
    with pytest.raises(FileNotFoundError, match=peers.CONVERTER):
        peers.llama_tree(tmp_path / "bin" / "llama-server")
