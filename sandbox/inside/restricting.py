"""sandforge's RestrictedPython policy: RestrictedPython's static rules, with native operations where its
guards would check nothing (see ``compilation.py``, which imports this module on first use, once
RestrictedPython is importable)."""

from __future__ import annotations

import ast
from typing import Any

from RestrictedPython import transformer as rp

from .lowering import (
    GUARDED_READS,
    LIBRARY_PRIVATE,
    OWN_FLAG,
    OWNED_TABLE,
    READ_ONLY_NAMES,
    RESERVED_NAMES,
    SPECIAL_METHODS,
    SUPER_METHODS,
    _OwnWrites,
    is_private,
)
from .packages import REFUSED_ATTRIBUTES
from .world import PROGRAM_MODULE


def is_super_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"

#: Per policy class, its visit method per node class (``SandforgePolicy.visit``).
_DISPATCH: dict[type, dict[type, Any]] = {}


def _mangles(name: str) -> bool:
    """A private name (``__x``, not ``__x__``) that Python's compiler mangles inside a class."""
    return name[:2] == "__" and name[-2:] != "__" and "." not in name


class SandforgePolicy(rp.RestrictingNodeTransformer):
    """RestrictedPython's static rules, native operations where its guards would check nothing."""

    special_def: str | None = None

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        #: The class statements around the current node, innermost last (for private-name mangling).
        self.classes: list[str] = []
        #: The functions around the current node, innermost last: each one's own ``self`` (``_OwnWrites``
        #: makes its writes native) or None.
        self.owners: list[str | None] = [None]
        self.dispatch = _DISPATCH.setdefault(type(self), {})

    # The walk itself, at the cost of a method call per node: ``ast.NodeVisitor.visit`` builds the method's
    # name for every node, and ``ast.NodeTransformer.generic_visit`` goes through a generator per node
    # (``iter_fields``). Same visits, same order, same results; a new program's compile+run is mostly this walk.

    def visit(self, node: Any) -> Any:
        method = self.dispatch.get(type(node))
        if method is None:
            method = self.dispatch[type(node)] = getattr(type(self), "visit_" + type(node).__name__, None) or (
                type(self).generic_visit
            )
        return method(self, node)

    def node_contents_visit(self, node: Any) -> Any:
        visit = self.visit
        for field in node._fields:
            old = getattr(node, field, None)
            if type(old) is list:
                if not old:
                    continue
                new: list[Any] = []
                for value in old:
                    if isinstance(value, ast.AST):
                        value = visit(value)
                        if value is None:
                            continue
                        if not isinstance(value, ast.AST):
                            new.extend(value)
                            continue
                    new.append(value)
                old[:] = new
            elif isinstance(old, ast.AST):
                replaced = visit(old)
                if replaced is None:
                    delattr(node, field)
                else:
                    setattr(node, field, replaced)
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> Any:
        self.classes.append(node.name)
        try:
            return super().visit_ClassDef(node)
        finally:
            self.classes.pop()

    def _mangled(self, attr: str) -> str:
        """``self.__balance`` in a class body is ``self._Account__balance``, as Python's compiler mangles it;
        done here because the guard call that reads it names the attribute with a string."""
        owner = self.classes[-1].lstrip("_") if self.classes else ""
        if owner and _mangles(attr):
            return f"_{owner}{attr}"
        return attr

    def check_name(self, node: Any, name: str | None, allow_magic_methods: bool = False) -> None:
        if name and name[0] == "_" and name != "_" and name == self.special_def:
            return
        if name and self.classes and self.classes[-1].lstrip("_") and _mangles(name):
            return  # ``__count`` in a class: Python's compiler makes it ``_Class__count``, the program's own
        if (name and name[0] == "_" and len(name) > 1 and name[1] != "_" and name[-1] != "_"
                and name not in RESERVED_NAMES and not (name[:4] == "_tmp" and name[4:].isdigit())):  # fmt: skip
            return  # a program-local helper name (``_parse``, ``_CACHE``): never one the runtime uses
        super().check_name(node, name, allow_magic_methods)

    def check_import_names(self, node: ast.Import | ast.ImportFrom) -> Any:
        # no program-local ``_`` names here: ``import _strptime`` and ``from _strptime import x`` stay refused
        modules = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        for name in [*modules, *(n for alias in node.names for n in (alias.name, alias.asname) if n)]:
            if any(part.startswith("_") for part in name.split(".")):
                self.error(node, f'"{name}" is an invalid variable name because it starts with "_"')
        return super().check_import_names(node)

    def visit_FunctionDef(self, node: Any) -> Any:
        outer = self.special_def
        method = getattr(node, "sandforge_method", False) and node.name in SPECIAL_METHODS
        self.special_def = node.name if method else None
        try:
            self.check_name(node, node.name)
        finally:
            self.special_def = outer
        self.check_function_argument_names(node)
        owner = getattr(node, "sandforge_self", None)
        self.owners.append(owner)
        try:
            with self.print_info.new_print_scope():
                node = self.node_contents_visit(node)
                self.inject_print_collector(node)
        finally:
            self.owners.pop()
        if owner is not None and _OwnWrites(owner).rewrite(node):
            # once per call: how much is ``self`` the program's own object (its class's level, decided once
            # per class and run by ``guards.OwnedClasses``)? Its writes and private reads then are native.
            check = ast.parse(f"{OWN_FLAG} = {OWNED_TABLE}[_type_({owner})]").body[0]
            first = node.body[0]
            docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            node.body.insert(1 if docstring else 0, ast.fix_missing_locations(ast.copy_location(check, first)))
        return node

    # ``async def``, ``await``, ``async for``, ``async with`` (issue 38): RestrictedPython refuses them all,
    # but a coroutine is a function whose body the same rules check; awaiting, asynchronous iteration and
    # context managers call only the special methods a program may define (``__aenter__``...) or the
    # library's own. Coroutine and generator internals (``cr_frame``, ``ag_frame``...) stay refused.
    def visit_AsyncFunctionDef(self, node: Any) -> Any:
        return self.visit_FunctionDef(node)

    def visit_Await(self, node: Any) -> Any:
        return self.node_contents_visit(node)

    def visit_AsyncFor(self, node: Any) -> Any:
        return self.node_contents_visit(node)  # iteration: native, as for ``for``

    def visit_AsyncWith(self, node: Any) -> Any:
        return self.node_contents_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        attr = node.attr = self._mangled(node.attr)
        if attr in READ_ONLY_NAMES or is_private(attr):
            return self._decided_at_run_time(node)
        if attr.startswith("_") and not (attr in SUPER_METHODS and is_super_call(node.value)):
            self.error(node, f'"{attr}" is an invalid attribute name because it starts with "_".')
        if attr.endswith("__roles__"):
            self.error(node, f'"{attr}" is an invalid attribute name because it ends with "__roles__".')
        if attr in rp.INSPECT_ATTRIBUTES:
            self.error(node, f'"{attr}" is a restricted name, that is forbidden to access in RestrictedPython.')
        if attr in REFUSED_ATTRIBUTES:
            self.error(node, f'"{attr}" is withheld in the sandbox: {REFUSED_ATTRIBUTES[attr]}.')
        node = self.node_contents_visit(node)
        if isinstance(node.ctx, ast.Load):
            if attr not in GUARDED_READS:
                return node  # the name is checked above: a native read is the guarded read
            call = ast.Call(func=ast.Name("_getattr_", ast.Load()), args=[node.value, ast.Constant(attr)],
                            keywords=[])  # fmt: skip
            return ast.fix_missing_locations(ast.copy_location(call, node))
        guard = ast.Call(func=ast.Name("_write_", ast.Load()), args=[node.value], keywords=[])
        target = node.value
        if isinstance(target, ast.Name) and target.id != self.owners[-1]:
            # ``(x if _owned_[_type_(x)] else _write_(x)).a = v``: native for an instance of the program's
            # class (level 1 or 2: what ``write_guard`` returns as it is), the guard for anything else
            level = ast.Subscript(
                ast.Name(OWNED_TABLE, ast.Load()),
                ast.Call(ast.Name("_type_", ast.Load()), [ast.Name(target.id, ast.Load())], []),
                ast.Load(),
            )
            inline = ast.IfExp(test=level, body=ast.Name(target.id, ast.Load()), orelse=guard)
            node.value = ast.fix_missing_locations(ast.copy_location(inline, target))
            return node
        node.value = ast.fix_missing_locations(ast.copy_location(guard, target))
        return node

    def _decided_at_run_time(self, node: ast.Attribute) -> Any:
        """``x._name`` and ``x.__name__`` (issue 38): a read is a guard call (``_getattr_``: the object's class
        decides a ``_name``, and a read-only name yields only a string); a ``_name`` write or delete goes
        through ``_write_private_`` (the program's own objects only); a read-only name is never written.
        ``x.__class__.__name__`` reads the name of ``x``'s class without handing the class out."""
        attr, value = node.attr, node.value
        if not isinstance(node.ctx, ast.Load):
            if attr in READ_ONLY_NAMES:
                self.error(node, f'"{attr}" can be read but not set or deleted in the sandbox.')
                return node
            value = self.visit(value)
            guard = ast.Call(ast.Name("_write_private_", ast.Load()), [value, ast.Constant(attr)], [])
            name = self._other_name(value)
            fast = self._own_level_test(value, attr, ast.Name(name, ast.Load()) if name else None)
            node.value = ast.fix_missing_locations(ast.copy_location(fast(guard), value))
            return node
        if attr in READ_ONLY_NAMES and isinstance(value, ast.Attribute) and value.attr == "__class__":
            owner = ast.Call(ast.Name("_class_of_", ast.Load()), [self.visit(value.value)], [])
            value = ast.copy_location(owner, value)
        else:
            value = self.visit(value)
        call = ast.Call(func=ast.Name("_getattr_", ast.Load()), args=[value, ast.Constant(attr)], keywords=[])
        name = self._other_name(value)
        read = ast.Attribute(ast.Name(name, ast.Load()), attr, ast.Load()) if name else None
        return ast.fix_missing_locations(ast.copy_location(self._own_level_test(value, attr, read)(call), node))

    def _other_name(self, value: ast.expr) -> str | None:
        """A plain name other than the current method's own ``self`` (``_OwnWrites`` tests that one once)."""
        return value.id if isinstance(value, ast.Name) and value.id != self.owners[-1] else None

    def _own_level_test(self, value: ast.expr, attr: str, fast: ast.expr | None) -> Any:
        """``x._name`` through a name: ``(fast if _owned_[_type_(x)] > 1 else guard)``, the guard's own answer
        for an instance of a level-2 class (``guards.OwnedClasses``: ``private_allowed`` allows every ``_x``
        on it), the guard call for anything else; read-only names and ``LIBRARY_PRIVATE`` stay the guard's."""
        if fast is None or not is_private(attr) or attr in LIBRARY_PRIVATE or not isinstance(value, ast.Name):
            return lambda guard: guard
        level = ast.Subscript(
            ast.Name(OWNED_TABLE, ast.Load()),
            ast.Call(ast.Name("_type_", ast.Load()), [ast.Name(value.id, ast.Load())], []),
            ast.Load(),
        )
        test = ast.Compare(level, [ast.Gt()], [ast.Constant(1)])
        return lambda guard: ast.IfExp(test=test, body=fast, orelse=guard)

    # Shortcuts: RestrictedPython visits every node's fields generically; these nodes need no check.
    def visit_Constant(self, node: ast.Constant) -> Any:
        return node

    def visit_Load(self, node: ast.AST) -> Any:
        return node

    visit_Store = visit_Del = visit_Load

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id == "__name__" and isinstance(node.ctx, ast.Load):
            # the program's name, never "__main__": ``if __name__ == "__main__":`` is skipped, as on import
            return ast.copy_location(ast.Constant(PROGRAM_MODULE), node)
        if node.id in ("print", "printed"):
            return super().visit_Name(node)  # the print collector's rewriting
        if isinstance(node.ctx, ast.Load):
            self.used_names[node.id] = True
        self.check_name(node, node.id)
        return node

    def _literal(self, node: Any) -> Any:
        if all(type(element) is ast.Constant for element in node.elts):
            return node  # a data literal: nothing to check in it
        return self.node_contents_visit(node)

    visit_List = visit_Tuple = visit_Set = _literal

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        return self.node_contents_visit(node)  # item access has no policy here: native

    def guard_iter(self, node: Any) -> Any:
        return self.node_contents_visit(node)  # iteration and unpacking: native

    def visit_Assign(self, node: ast.Assign) -> Any:
        return self.node_contents_visit(node)

    def visit_With(self, node: ast.With) -> Any:
        return self.node_contents_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        if isinstance(node.target, ast.Attribute):
            self.error(node, "Augmented assignment of attributes is not allowed.")  # lowered before
        return self.node_contents_visit(node)  # names and items: Python's own in-place operation

    def visit_Call(self, node: ast.Call) -> Any:
        if isinstance(node.func, ast.Name) and node.func.id in ("exec", "eval"):
            self.error(node, f"{node.func.id.capitalize()} calls are not allowed.")
        return self.node_contents_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> Any:
        # only in class bodies (lowered elsewhere); a string in it stays a string: nothing the program
        # can reach evaluates annotations (typing.get_type_hints, ForwardRef, singledispatch are withheld)
        return self.node_contents_visit(node)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> Any:
        for name in node.names:
            self.check_name(node, name)
        return node

    # match statements: patterns compile to native reads; the names in them are checked statically
    def visit_Match(self, node: Any) -> Any:
        return self.node_contents_visit(node)

    def visit_match_case(self, node: Any) -> Any:
        return self.node_contents_visit(node)

    def _static_reference(self, node: ast.expr) -> None:
        """A pattern's class or value reference (``Color.RED``): a dotted name, read natively."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and (
                sub.attr.startswith("_") or sub.attr in rp.INSPECT_ATTRIBUTES or sub.attr in GUARDED_READS
            ):
                self.error(node, f'"{sub.attr}" is an invalid attribute name in a pattern.')
            elif isinstance(sub, ast.Name):
                self.check_name(node, sub.id)

    def visit_MatchValue(self, node: Any) -> Any:
        self._static_reference(node.value)
        return node

    def visit_MatchSingleton(self, node: Any) -> Any:
        return node

    def visit_MatchSequence(self, node: Any) -> Any:
        return self.node_contents_visit(node)

    def visit_MatchMapping(self, node: Any) -> Any:
        self.check_name(node, node.rest)
        for key in node.keys:
            self._static_reference(key)
        node.patterns = [self.visit(p) for p in node.patterns]
        return node

    def visit_MatchClass(self, node: Any) -> Any:
        self._static_reference(node.cls)
        for attr in node.kwd_attrs:  # read natively: what the guards read through a call is refused
            if attr.startswith("_") or attr in GUARDED_READS or attr in rp.INSPECT_ATTRIBUTES:
                self.error(node, f'"{attr}" is an invalid attribute name in a pattern.')
        node.patterns = [self.visit(p) for p in node.patterns]
        node.kwd_patterns = [self.visit(p) for p in node.kwd_patterns]
        return node

    def visit_MatchStar(self, node: Any) -> Any:
        self.check_name(node, node.name)
        return node

    def visit_MatchAs(self, node: Any) -> Any:
        self.check_name(node, node.name)
        return self.node_contents_visit(node)

    def visit_MatchOr(self, node: Any) -> Any:
        return self.node_contents_visit(node)
