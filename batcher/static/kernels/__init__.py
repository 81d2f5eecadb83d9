"""C++ kernels of the static engine, built at run time by batcher/static/blocks.py."""
