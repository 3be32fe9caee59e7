"""Test-only runner: ``escaped_runner`` (the program runs as unrestricted Python, as after a full escape from
RestrictedPython) with the real tripwire installed and armed, as in the production runner."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import escaped_runner
from inside import start, tripwire

escaped_runner.serving.tripwire = tripwire

if __name__ == "__main__":
    os._exit(start.main(sys.argv[1:]))
