"""Test-only runner: the real boot and lock-down, then the program runs as UNRESTRICTED Python.

It models an attacker who has fully escaped RestrictedPython inside the sandbox, so the tests that use it
exercise only the OS boundary (namespaces, private root, dropped privileges, seccomp, rlimits). It keeps
the modules an escaped attacker would find already loaded in the real runner (os, ctypes, ...).
"""

import ast
import os
import signal  # noqa: F401 - available to the attacker, as in a real escape
import socket  # noqa: F401
import sys
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sandbox"))
from inside import serving, start, world, zygote


def compile_unrestricted(code: str):
    module = ast.parse(code, world.TOOL_FILENAME, "exec")
    args = ast.arguments(
        posonlyargs=[],
        args=[ast.arg(arg=n) for n in ("context", "args", "kwargs")],
        vararg=None,
        kwonlyargs=[],
        kw_defaults=[],
        kwarg=None,
        defaults=[],
    )
    func = ast.FunctionDef(
        name=world.TOOL_FUNCTION, args=args, body=module.body or [ast.Pass()], decorator_list=[], returns=None
    )
    wrapper = ast.fix_missing_locations(ast.Module(body=[func], type_ignores=[]))
    return compile(wrapper, world.TOOL_FILENAME, "exec"), None


def unrestricted_globals(proxies, stdout, bridge):
    def _print(*values, **kwargs):
        stdout.write(" ".join(str(v) for v in values) + kwargs.get("end", "\n"))

    namespace = {"__builtins__": __builtins__, "__name__": "escaped", "print": _print}
    zygote_child = "--zygote" in sys.argv
    namespace["result_fd"] = (
        zygote.CHILD_RESULT_FD if zygote_child else int(sys.argv[sys.argv.index("--result-fd") + 1])
    )
    namespace["sys_modules"] = types.MappingProxyType(sys.modules)
    return namespace


# ``serving.execute`` compiles and builds the program's globals through these names.
serving.compile_program = compile_unrestricted
serving.build_globals = unrestricted_globals
# Never the code the host shipped precompiled (it compiles a text it has seen before, in this test process,
# with the restricted compiler): the program's text, compiled unrestricted here.
serving.shipped_code = lambda frame: None
# The runner drops ctypes, mmap, socket... from sys.modules after lock-down; the attacker modelled here is
# assumed to have got them back (defence in depth), so the OS boundary is tested against all of them.
serving.forget_lockdown_modules = lambda: []
# The attacker modelled here has beaten the tripwire too (the OS boundary alone is under test): the runner
# reports the protection without installing the hook. ``escaped_runner_armed.py`` keeps the real tripwire.
serving.tripwire = types.SimpleNamespace(install=lambda: True, arm=lambda *args: None)

if __name__ == "__main__":
    os._exit(start.main(sys.argv[1:]))
