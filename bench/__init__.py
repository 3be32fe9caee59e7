"""sandforge benchmarks (``python -m bench``). Standard library only at import time: the peers' driver
imports ``bench.loops``, ``bench.stats`` and ``bench.workloads`` from the peers' own interpreter."""
