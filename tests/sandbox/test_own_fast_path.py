"""The fast paths of the restricted language's attribute access (issue 38's speed goal): a method's writes and
``_x`` reads on its own ``self`` are native when ``self``'s class is the program's (``lowering._OwnWrites``,
``guards.OwnedClasses``), and a module proxy that withholds nothing has no ``__getattr__`` (so CPython
specialises reads of it). Each must decide exactly what the guard it skips would decide; the attacks on
them are in ``test_idiom_attacks.py`` (section "the own-object fast path")."""

from __future__ import annotations

import abc
import collections
import dis
import random
import textwrap

import pytest

from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig
from sandforge.sandbox.inside import compilation, guards, lowering, world


def _program_classes() -> dict[str, type]:
    """Classes made as the program makes them (its module name), against the library's."""
    namespace: dict[str, object] = {"__name__": world.PROGRAM_MODULE, "abc": abc, "random": random}
    exec(
        textwrap.dedent(
            """
            class Plain:
                pass
            class Child(Plain):
                pass
            class Error(ValueError):
                pass
            class Ordered(dict):
                pass
            class FromLibrary(random.Random):
                pass
            class Abstract(abc.ABC):
                pass
            """
        ),
        namespace,
    )
    return {name: value for name, value in namespace.items() if isinstance(value, type)}


@pytest.mark.parametrize(
    ("name", "level", "library_private"),
    [
        ("Plain", 2, None),
        ("Child", 2, None),
        ("Error", 2, None),
        ("Ordered", 2, None),
        ("FromLibrary", 1, "_randbelow"),
        ("Abstract", 1, "_abc_impl"),
    ],
)
def test_a_program_class_level_is_what_the_guards_decide(name: str, level: int, library_private: str | None) -> None:
    """Level 2 exactly when ``private_allowed`` allows every ``_x`` on an instance (none is in a library
    class); level 1 when a library base holds one; both when ``write_guard`` takes the instance as it is."""
    cls = _program_classes()[name]
    assert guards.OwnedClasses()[cls] == level
    instance = cls.__new__(cls)
    assert guards.private_allowed(instance, "_anything")
    assert guards.write_guard(instance) is instance
    if library_private is not None:
        assert not guards.private_allowed(instance, library_private)


@pytest.mark.parametrize("cls", [random.Random, collections.OrderedDict, dict, type, abc.ABC])
def test_a_library_class_is_level_zero(cls: type) -> None:
    assert guards.OwnedClasses()[cls] == 0


def test_a_method_body_tests_its_own_level_and_keeps_the_guard() -> None:
    """The compiled method reads ``_owned_`` once and keeps every guard call as the other branch."""
    code = "class A:\n    def f(self, v):\n        self.n = v\n        self._m = v\n        return self._m\nreturn 1"
    compiled, refusals = compilation.compile_checked(code)
    assert not refusals and compiled is not None
    tool = next(c for c in compiled.co_consts if hasattr(c, "co_code"))
    body = next(c for c in tool.co_consts if hasattr(c, "co_code"))
    method = next(c for c in body.co_consts if hasattr(c, "co_code"))
    globals_read = [i.argval for i in dis.get_instructions(method) if i.opname == "LOAD_GLOBAL"]
    assert globals_read.count(lowering.OWNED_TABLE) == 1
    assert {"_write_", "_write_private_", "_getattr_"} <= set(globals_read)


def test_only_modules_that_withhold_a_name_have_a_proxy_getattr() -> None:
    proxies = world.build_module_proxies()
    for name, proxy in proxies.items():
        withholds = bool(world.withheld(name)) or name in world.EXPOSED_ONLY
        assert ("__getattr__" in vars(proxy)) is withholds, name
    with pytest.raises(AttributeError, match="module 'math' has no attribute 'nope'"):
        proxies["math"].nope  # noqa: B018 - the read is the test


@pytest.fixture(scope="module", params=["subprocess", pytest.param("docker", marks=pytest.mark.docker)])
def sb(request: pytest.FixtureRequest) -> Sandbox:
    with Sandbox(SandboxConfig(backend=request.param, pool_size=1)) as sandbox:
        yield sandbox  # type: ignore[misc]


OWN_PROGRAM = textwrap.dedent(
    """
    import collections

    class Account:
        _count = 0

        def __init__(self, owner):
            self._owner = owner
            self.__balance = 0
            Account._count += 1

        def deposit(self, amount):
            self.__balance += amount
            self._last = amount
            return self.__balance

        def missing(self):
            try:
                return self._nothing
            except AttributeError as exc:
                return str(exc)

    class Failure(ValueError):
        def __init__(self, code):
            super().__init__(code)
            self._code = code

        def code(self):
            return self._code

    class Point(collections.namedtuple('Point', 'x y')):
        def moved(self):
            return self._replace(x=self.x + 1)._asdict()

    a = Account('ada')
    return [a.deposit(5), a.deposit(7), a._last, Account._count, a.missing(), Failure(3).code(),
            Point(1, 2).moved()]
    """
)


def test_own_objects_answer_as_cpython(sb: Sandbox) -> None:
    """Private state, mangled names, a class attribute, a missing name, a built-in base and a namedtuple
    base: the same values plain CPython gives."""
    out = sb.execute(ExecutionRequest(code=OWN_PROGRAM))
    assert out.ok, out.error_message
    assert out.value == [5, 12, 7, 1, "'Account' object has no attribute '_nothing'", 3, {"x": 2, "y": 2}]


def test_a_template_checked_once_is_not_trusted_for_a_look_alike(sb: Sandbox) -> None:
    """Accepted templates are remembered by value only for exact strings: a ``str`` subclass equal to every
    string (its own ``__eq__`` and ``__hash__``) is parsed again, and its attribute field refused."""
    code = (
        "class T(str):\n    def __eq__(self, other):\n        return True\n    def __hash__(self):\n"
        "        return hash('{0}')\nok = '{0}'.format(1)\nreturn T('{0.__class__}').format(1)"
    )
    out = sb.execute(ExecutionRequest(code=code))
    assert not out.ok, out.value
    assert "format field {0.__class__} reads an attribute" in (out.error_message or "")
