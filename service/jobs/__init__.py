"""Batch jobs, durable: the database of files, batches and lines (tables.py, store.py, lines.py),
an input file read (input_file.py), and the runner that moves each batch to its end (runner.py)."""
