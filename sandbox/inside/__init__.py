"""The inside: the only sandforge code that runs inside the sandbox (gVisor's ``runsc/boot`` to the host's
``sandbox/``).

It imports nothing but the standard library and RestrictedPython, and only relatively within itself, so it
runs as ``sandforge.sandbox.inside`` on the host (which imports ``wire`` for the shared constants and
``compilation`` for the one compiler) and as the top-level package ``inside`` in a sandbox, where the
directory holding it is put on ``sys.path`` and neither ``sandforge`` nor pydantic is ever imported. One
runner process serves exactly one execution:

1. read a ``boot`` frame, import what the program may use, lock the process down (``lockdown``: rlimits,
   namespaces, private tmpfs root, dropped privileges, no_new_privs, seccomp), then report ``ready``;
2. read one ``execute`` frame and the context's texts (``channel``), run the program (``compilation``,
   ``world``, ``guards``, ``lazycontext``), answer nested calls (``bridge``);
3. write exactly one ``result`` frame (``serving``) and exit.

``start`` is the entry point (``__main__`` starts it from a file path); ``zygote`` forks fresh runners from
a pre-imported template. The OS boundary is the security boundary; RestrictedPython here is defence in
depth. This module imports nothing, so importing ``wire`` on the host costs nothing more.
"""
