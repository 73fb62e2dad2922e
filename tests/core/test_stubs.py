"""The type stub src/uma/_core.pyi keeps up with the compiled module: it declares every public
name of uma._core and every public method and property of its classes, with the same
parameters (names, kinds, defaults), and nothing the module lacks. Constructors are compared
with the __cinit__ signatures in _core.pyx, which the compiled classes do not expose."""

from __future__ import annotations

import ast
import inspect
import re
import types
from pathlib import Path

import pytest

from uma import _core

SRC = Path(__file__).resolve().parents[2] / "src" / "uma"
STUB = SRC / "_core.pyi"
PYX = SRC / "_core.pyx"

# Private names that other uma modules call: the stub must declare them too.
REQUIRED_PRIVATE = {"Model": {"_token_array"}}
# What Cython puts on every extension type; not part of the API.
CYTHON_MEMBERS = {"__new__", "__doc__", "__module__", "__pyx_vtable__", "__reduce__",
                  "__setstate__", "__reduce_cython__", "__setstate_cython__"}
NO_DEFAULT = object()
ANY_DEFAULT = object()  # `= ...` in the stub


# --- the runtime side --------------------------------------------------------------------------

def defined_in(module: types.ModuleType, value: object) -> bool:
    """Whether a module attribute is its own (not an imported module, class or function)."""
    if inspect.ismodule(value):
        return False
    if inspect.isclass(value) or callable(value):
        return getattr(value, "__module__", None) == module.__name__
    return True  # a constant


def runtime_names(module: types.ModuleType) -> dict[str, object]:
    return {name: value for name, value in vars(module).items()
            if not name.startswith("_") and defined_in(module, value)}


def is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def runtime_members(cls: type) -> dict[str, object]:
    """Public names and protocol methods (__len__, __enter__, ...) of a class."""
    return {name: value for name, value in vars(cls).items()
            if name not in CYTHON_MEMBERS and (not name.startswith("_") or is_dunder(name))}


Params = list[tuple[str, object, object]]  # (name, inspect kind, default)


def runtime_params(func: object, *, method: bool = True) -> Params:
    params = list(inspect.signature(func).parameters.values())[1 if method else 0:]
    return [(p.name, p.kind, NO_DEFAULT if p.default is p.empty else p.default)
            for p in params]


def cinit_params(pyx: str) -> dict[str, Params]:
    """Class name -> the parameters of its __cinit__ in the .pyx source (Cython syntax: C
    types before names, `not None` after them)."""
    out = {}
    chunks = re.split(r"^cdef class ", pyx, flags=re.M)[1:]
    for chunk in chunks:
        cls = re.match(r"\w+", chunk).group()
        found = re.search(r"^    def __cinit__\(self,?(.*?)\):", chunk, re.M | re.S)
        if found is None:
            continue
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params: Params = []
        for raw in found.group(1).split(","):
            text = " ".join(raw.split())
            if not text:
                continue
            if text.startswith("**"):
                params.append((text[2:], inspect.Parameter.VAR_KEYWORD, NO_DEFAULT))
            elif text.startswith("*"):
                kind = inspect.Parameter.KEYWORD_ONLY
                if text != "*":
                    params.append((text[1:], inspect.Parameter.VAR_POSITIONAL, NO_DEFAULT))
            else:
                decl, eq, default = text.partition("=")
                decl = re.sub(r"\s+not None$", "", decl.strip())
                name = re.findall(r"\w+", decl)[-1]
                params.append((name, kind,
                               ast.literal_eval(default.strip()) if eq else NO_DEFAULT))
        out[cls] = params
    return out


# --- the stub side ------------------------------------------------------------------------------

def stub_default(node: ast.expr | None) -> object:
    if node is None:
        return NO_DEFAULT
    if isinstance(node, ast.Constant) and node.value is Ellipsis:
        return ANY_DEFAULT
    return ast.literal_eval(node)


def stub_params(func: ast.FunctionDef) -> Params:
    a = func.args
    P = inspect.Parameter
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [(arg.arg, P.POSITIONAL_ONLY if i < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD,
               stub_default(d))
              for i, (arg, d) in enumerate(zip(positional, defaults, strict=True))]
    if a.vararg:
        params.append((a.vararg.arg, P.VAR_POSITIONAL, NO_DEFAULT))
    params += [(arg.arg, P.KEYWORD_ONLY, stub_default(d))
               for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg:
        params.append((a.kwarg.arg, P.VAR_KEYWORD, NO_DEFAULT))
    return params


def decorators(func: ast.FunctionDef) -> set[str]:
    return {ast.unparse(d) for d in func.decorator_list}


def stub_scope(body: list[ast.stmt]) -> dict[str, list[ast.stmt]]:
    """Names a stub module or class body declares (imports aside) -> their declarations
    (several for an @overload)."""
    out: dict[str, list[ast.stmt]] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        else:
            continue
        for name in names:
            out.setdefault(name, []).append(node)
    return out


# --- the comparison -----------------------------------------------------------------------------

def same_value(a: object, b: object) -> bool:
    return type(a) is type(b) and a == b


def compare_params(where: str, stubs: list[ast.stmt], expected: Params, *,
                   method: bool = True) -> list[str]:
    problems = []
    overloaded = len(stubs) > 1
    for node in stubs:
        if not isinstance(node, ast.FunctionDef):
            problems.append(f"{where}: the stub does not declare it as a function")
            continue
        got = stub_params(node)[1:] if method else stub_params(node)  # without self/cls
        if [(n, k) for n, k, _ in got] != [(n, k) for n, k, _ in expected]:
            problems.append(f"{where}: stub parameters {[(n, k.name) for n, k, _ in got]} != "
                            f"runtime {[(n, k.name) for n, k, _ in expected]}")
            continue
        for (name, _, stub_d), (_, _, real_d) in zip(got, expected, strict=True):
            if stub_d is NO_DEFAULT:
                if real_d is not NO_DEFAULT and not overloaded:
                    problems.append(f"{where}: {name} has default {real_d!r} in the module, "
                                    "none in the stub")
            elif real_d is NO_DEFAULT:
                problems.append(f"{where}: {name} has a default in the stub, none in the module")
            elif stub_d is not ANY_DEFAULT and not same_value(stub_d, real_d):
                problems.append(f"{where}: {name} defaults to {stub_d!r} in the stub, "
                                f"{real_d!r} in the module")
    return problems


def compare_class(name: str, cls: type, node: ast.ClassDef,
                  cinits: dict[str, Params] | None) -> list[str]:
    declared = stub_scope(node.body)
    real = runtime_members(cls)
    problems = [f"{name}.{m} is missing from the stub" for m in sorted(real.keys() - declared)]
    problems += [f"{name}.{m} is missing from the stub (other uma modules use it)"
                 for m in sorted(REQUIRED_PRIVATE.get(name, set()) - declared.keys())]
    for member, stubs in declared.items():
        where = f"{name}.{member}"
        if member == "__new__":  # the constructor: __cinit__ in the .pyx
            if cinits is not None:
                if name not in cinits:
                    problems.append(f"{where}: the .pyx has no __cinit__ for {name}")
                else:
                    problems += compare_params(where, stubs, cinits[name])
            continue
        if member not in vars(cls) or member in CYTHON_MEMBERS:
            problems.append(f"{where} is in the stub but not in the module")
            continue
        value = vars(cls)[member]
        if inspect.isdatadescriptor(value):
            if not all(isinstance(s, ast.FunctionDef) and "property" in decorators(s)
                       for s in stubs):
                problems.append(f"{where} is a property (or attribute) but not one in the stub")
        elif any(isinstance(s, ast.FunctionDef) and "property" in decorators(s) for s in stubs):
            problems.append(f"{where} is a property in the stub but a method in the module")
        else:
            problems += compare_params(where, stubs, runtime_params(value))
    if cinits is not None and name in cinits and "__new__" not in declared:
        problems.append(f"{name}.__new__ (its constructor) is missing from the stub")
    return problems


def drift(stub: ast.Module, module: types.ModuleType, pyx: str | None) -> list[str]:
    """Every difference between the stub and the module, as readable lines."""
    declared = stub_scope(stub.body)
    real = runtime_names(module)
    cinits = cinit_params(pyx) if pyx is not None else None
    problems = [f"{n} is missing from the stub" for n in sorted(real.keys() - declared)]
    for name, stubs in declared.items():
        if not hasattr(module, name):
            problems.append(f"{name} is in the stub but not in the module")
            continue
        value = getattr(module, name)
        if not name.startswith("_") and name not in real:
            problems.append(f"{name} is in the stub but the module only imports it")
        elif isinstance(stubs[0], ast.ClassDef):
            if not inspect.isclass(value):
                problems.append(f"{name} is a class in the stub but not in the module")
            else:
                problems += compare_class(name, value, stubs[0], cinits)
        elif isinstance(stubs[0], ast.FunctionDef):
            if not callable(value):
                problems.append(f"{name} is a function in the stub but not in the module")
            else:
                problems += compare_params(name, stubs, runtime_params(value, method=False),
                                           method=False)
    return problems


# --- tests --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stub() -> ast.Module:
    return ast.parse(STUB.read_text(), str(STUB))


@pytest.fixture(scope="module")
def pyx() -> str:
    return PYX.read_text()


def test_stub_matches_module(stub, pyx):
    assert drift(stub, _core, pyx) == []


def test_package_is_marked_typed():
    assert (SRC / "py.typed").is_file()


def test_every_class_constructor_is_checked(pyx):
    classes = {name for name, value in runtime_names(_core).items() if inspect.isclass(value)}
    assert classes and classes <= cinit_params(pyx).keys()


def without(tree: ast.Module, path: str) -> ast.Module:
    """A copy of the stub with one declaration (`name` or `Class.member`) removed."""
    tree = ast.parse(ast.unparse(tree))
    *outer, last = path.split(".")
    body = tree.body
    for name in outer:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == name).body
    body[:] = [n for n in body if getattr(n, "name", None) != last] or [ast.Pass()]
    return tree


def with_source(tree: ast.Module, source: str, into: str | None = None) -> ast.Module:
    tree = ast.parse(ast.unparse(tree))
    body = tree.body if into is None else next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == into).body
    body.extend(ast.parse(source).body)
    return tree


def test_drift_is_noticed(stub, pyx):
    """The checker itself: each kind of drift is reported."""
    assert drift(without(stub, "live_handles"), _core, pyx)
    assert drift(without(stub, "Sampler"), _core, pyx)
    assert drift(without(stub, "Model.tokenize"), _core, pyx)
    assert drift(without(stub, "Context.n_ctx"), _core, pyx)
    assert drift(without(stub, "Batch.__len__"), _core, pyx)
    assert drift(without(stub, "Model._token_array"), _core, pyx)
    assert drift(without(stub, "Context.__new__"), _core, pyx)
    assert drift(with_source(stub, "def extra() -> None: ..."), _core, pyx)
    assert drift(with_source(stub, "EXTRA: int"), _core, pyx)
    assert drift(with_source(stub, "def extra(self) -> None: ...", "Batch"), _core, pyx)
    assert drift(with_source(stub, "@property\ndef clear(self) -> int: ...", "Batch"),
                 _core, pyx)
    text = STUB.read_text()
    for old, new in [("n_ctx: int = 4096", "n_ctx: int = 2048"),  # a default
                     ("*, logits_last", "logits_last"),  # keyword-only
                     ("def abort(self, on: bool", "def abort(self, off: bool"),  # a name
                     ("def seq_state(self, seq_id: int)", "def seq_state(self)")]:
        assert old in text
        assert drift(ast.parse(text.replace(old, new, 1)), _core, pyx), (old, new)

    grown = types.ModuleType(_core.__name__)
    vars(grown).update(vars(_core))

    def extra() -> None: ...

    extra.__module__ = _core.__name__
    grown.extra = extra
    grown.EXTRA = 1
    assert drift(stub, grown, pyx) == ["EXTRA is missing from the stub",
                                       "extra is missing from the stub"]
    grown_pyx = pyx.replace("n_expert_used=0):", "n_expert_used=0, new=0):", 1)
    assert grown_pyx != pyx and drift(stub, _core, grown_pyx)
