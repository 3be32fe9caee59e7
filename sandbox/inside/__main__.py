"""Start the inside from a file path: ``python -I -S -B <dir>/inside/__main__.py ARGS`` (the subprocess
backend; ``-I`` puts no script directory on ``sys.path``, so the directory holding this package is added
here, at the end, and ``inside`` is imported as a top-level package: never ``sandforge`` nor its
``__init__``). Containers import ``inside.start`` from the image's precompiled files instead."""

import os
import sys

if not __package__:  # run as a file, not as ``python -m inside``
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # noqa: PTH100, PTH120
    __import__("inside.start", fromlist=["run"]).run(sys.argv[1:])
else:
    __import__(f"{__package__}.start", fromlist=["run"]).run(sys.argv[1:])
