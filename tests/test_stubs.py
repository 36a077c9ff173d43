"""The type stubs of the compiled modules (gpupipe/_C.pyi, gpupipe/_C_cuda.pyi) and the modules
agree: the same names (every binding, test hooks included), for every function the same parameters
in the same order with the same defaults, the same class bases and enum members, and attributes of
the annotated type. A binding added, renamed or changed without its stub fails here."""

from __future__ import annotations

import ast
import enum
import importlib
from pathlib import Path

import pytest

import gpupipe

PACKAGE = Path(gpupipe.__file__).parent


def _split_top_level(text: str) -> list:
    """Splits ``a: x[int, str], b: str = 'p, q'`` at the commas outside brackets and quotes."""
    parts, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0 and not quote:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def binding_signature(fn) -> list:
    """[(name, default or None)] from pybind11's first docstring line ``name(a: T, b: T = d) -> R``."""
    line = fn.__doc__.strip().splitlines()[0]
    inner = line[line.index("(") + 1 : line.rindex(") ->")]
    params = []
    for part in _split_top_level(inner):
        name, _, default = part.partition("=")
        params.append((name.split(":")[0].strip(), ast.literal_eval(default.strip()) if default else None))
    return params


def stub_names(path: Path) -> dict:
    """{name: [(param, default or None)] for functions, ("class", base, {member: value}) for
    classes, ("attr", type name) for module attributes}."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            args = node.args.args
            defaults = [None] * (len(args) - len(node.args.defaults)) + [ast.literal_eval(d) for d in node.args.defaults]
            out[node.name] = [(a.arg, d) for a, d in zip(args, defaults)]
        elif isinstance(node, ast.ClassDef):
            members = {t.targets[0].id: ast.literal_eval(t.value) for t in node.body if isinstance(t, ast.Assign)}
            out[node.name] = ("class", ast.unparse(node.bases[0]).split(".")[-1], members)
        elif isinstance(node, ast.AnnAssign):
            out[node.target.id] = ("attr", ast.unparse(node.annotation).split("[")[0])
    return out


def module_names(mod) -> dict:
    """The same description of a built module: every name but the dunders (test hooks included)."""
    out = {}
    for name in dir(mod):
        if name.startswith("__"):
            continue
        value = getattr(mod, name)
        if isinstance(value, type):
            members = {m.name: m.value for m in value} if issubclass(value, enum.Enum) else {}
            out[name] = ("class", value.__mro__[1].__name__, members)
        elif callable(value):
            out[name] = binding_signature(value)
        else:
            out[name] = ("attr", type(value).__name__)
    return out


def _module(name: str):
    try:
        return importlib.import_module(f"gpupipe.{name}")
    except ImportError as e:
        pytest.skip(f"gpupipe.{name} is not built here ({e})")


# Bindings a build may leave out: nvImageCodec's C-API engine, built only where its 0.9 header is.
OPTIONAL = {"_C_cuda": {"NvimgcodecDecoder", "NVIMGCODEC_HEADER_VERSION"}}


@pytest.mark.parametrize("name", ["_C", "_C_cuda"])
def test_stub_and_module_agree(name):
    mod = _module(name)
    stub, built = stub_names(PACKAGE / f"{name}.pyi"), module_names(mod)
    stub.pop("pybind11_object", None)  # the stub's stand-in for pybind11's base class
    assert sorted(set(built) - set(stub)) == [], f"bindings missing from gpupipe/{name}.pyi"
    missing = set(stub) - set(built) - OPTIONAL.get(name, set())
    assert sorted(missing) == [], f"gpupipe/{name}.pyi names what the module lacks"
    for key in built:
        assert stub[key] == built[key], f"{name}.{key}: stub {stub[key]} != binding {built[key]}"


def test_signature_parser_sees_nested_brackets():
    class Fake:
        __doc__ = "f(a: collections.abc.Sequence[typing.SupportsInt | int], b: str = 'x, y', c: bool = True) -> None"

    assert binding_signature(Fake) == [("a", None), ("b", "x, y"), ("c", True)]


def test_package_is_typed():
    assert (PACKAGE / "py.typed").exists()
