"""``python -m sandforge``: the same command line as ``sandforge``."""

from sandforge.runtime.cli import main

main()
