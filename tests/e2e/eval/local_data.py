"""The tasks' data, read from the JSONL files next to this file, so that `lm_eval --include_path
tests/e2e/eval` finds them from any working directory (a YAML `dataset_kwargs: {data_files: ...}`
path is resolved against the cwd by `datasets`, not against the YAML)."""

from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent


def _jsonl(name: str) -> datasets.DatasetDict:
    return datasets.load_dataset("json", data_files={"test": str(HERE / name)})


def facts(**_kwargs) -> datasets.DatasetDict:
    return _jsonl("facts.jsonl")


def capitals(**_kwargs) -> datasets.DatasetDict:
    return _jsonl("capitals.jsonl")
