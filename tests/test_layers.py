"""The package layers of docs/architecture.md, read from the import statements of the source.

A *node* is a first-level package of ``pearl`` (``core``, ``engines``, ``runtime`` ...), ``envs``,
or one of two groups of ``pearl``'s own modules: ``base`` (``pearl/__init__.py``, ``config``,
``models``, ``procutil``, ``reaper``, ``access``: what every layer may use) and ``entry`` (``cli``,
``main``, ``run``, ``serve``, ``__main__``: the commands). An *edge* ``a -> b`` is an ``import`` /
``from ... import`` anywhere in a module of ``a`` (function bodies included) naming a module of
``b``. Imports under ``if TYPE_CHECKING:`` never run; they are checked apart (``TYPE_ONLY_UP``).

Rules: every edge points to a lower layer (``LAYERS``), hence no cycle; ``pearl/core`` imports
nothing of ours outside itself, not even for types. ``python tests/test_layers.py`` prints the
graph (edges, cycles, type-only edges).

Wiring: no module of ``pearl`` hands an object a collaborator after constructing it
(``wiring_assignments``: the precise rule in its docstring; the exceptions in ``WIRING_ALLOWED``).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE_MODULES = frozenset({"__init__", "config", "models", "procutil", "reaper", "access", "tasks"})
ENTRY_MODULES = frozenset({"cli", "main", "run", "serve", "__main__"})

#: lower number = lower layer; an import may only name a node of a strictly lower layer
LAYERS: Mapping[str, int] = {
    "base": 0,
    "core": 1,
    "engines": 2,
    "train": 3,
    "envs": 3,
    "runtime": 4,
    "sim": 5,
    "admin": 5,
    "obs": 6,
    "entry": 7,
    "reliability": 8,  # fuzzes the CLI's parsers, so it sits above the commands
}

#: upward imports that only type-check (``if TYPE_CHECKING:``), each with its reason
TYPE_ONLY_UP: Mapping[tuple[str, str], str] = {
    ("engines", "runtime"): "the emulated engine is typed against runtime.clock.Clock, the clock it is handed",
}


@dataclass(frozen=True, slots=True)
class Edge:
    src: str
    dst: str
    where: str  # path:line of the import statement
    type_only: bool


def node_of(parts: tuple[str, ...], root: Path) -> str | None:
    """The node of module ``parts`` (``("pearl", "runtime", "node", "agent")``); None outside ours."""
    if parts[0] == "envs":
        return "envs"
    if parts[0] != "pearl":
        return None
    if len(parts) == 1:
        return "base"
    if (root / "pearl" / parts[1]).is_dir():
        return parts[1]
    if parts[1] in ENTRY_MODULES:
        return "entry"
    return "base"  # a module in BASE_MODULES, or a name of pearl/__init__.py (``from pearl import __version__``)


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            out.update(id(x) for stmt in n.body for x in ast.walk(stmt))
    return out


def _imported(n: ast.stmt) -> list[str]:
    if isinstance(n, ast.Import):
        return [a.name for a in n.names]
    if isinstance(n, ast.ImportFrom) and n.module is not None and n.level == 0:
        return [f"pearl.{a.name}" for a in n.names] if n.module == "pearl" else [n.module]
    return []


def source_files(root: Path) -> Iterator[Path]:
    for top in ("pearl", "envs"):
        for p in sorted((root / top).rglob("*.py")):
            if "projects" not in p.relative_to(root).parts:  # envs/repofix/projects: task repositories
                yield p


def edges(root: Path) -> list[Edge]:
    out: list[Edge] = []
    for path in source_files(root):
        src = node_of(path.relative_to(root).with_suffix("").parts, root)
        assert src is not None
        tree = ast.parse(path.read_text(), filename=str(path))
        type_only = _type_checking_nodes(tree)
        for n in ast.walk(tree):
            if not isinstance(n, ast.Import | ast.ImportFrom):
                continue
            for module in _imported(n):
                dst = node_of(tuple(module.split(".")), root)
                if dst is not None and dst != src:
                    out.append(Edge(src, dst, f"{path.relative_to(root)}:{n.lineno}", id(n) in type_only))
    return out


def cycles(es: list[Edge]) -> list[list[str]]:
    """Every strongly connected component of more than one node (Tarjan), as a sorted node list."""
    graph: dict[str, set[str]] = defaultdict(set)
    for e in es:
        graph[e.src].add(e.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(graph) | {d for ds in graph.values() for d in ds}):
        if v not in index:
            visit(v)
    return sorted(out)


def _fmt(es: list[Edge]) -> str:
    return "\n".join(f"  {e.src} -> {e.dst}  ({e.where})" for e in es)


@pytest.fixture(scope="module")
def repo_edges() -> list[Edge]:
    return edges(ROOT)


def test_core_imports_nothing_outside_core(repo_edges: list[Edge]) -> None:
    bad = [e for e in repo_edges if e.src == "core"]
    assert not bad, f"pearl/core must import only pearl.core:\n{_fmt(bad)}"


def test_no_package_cycle(repo_edges: list[Edge]) -> None:
    run_time = [e for e in repo_edges if not e.type_only]
    found = cycles(run_time)
    detail = _fmt([e for e in run_time if any(e.src in c and e.dst in c for c in found)])
    assert found == [], f"package cycles {found}:\n{detail}"


def test_every_node_has_a_layer(repo_edges: list[Edge]) -> None:
    nodes = {e.src for e in repo_edges} | {e.dst for e in repo_edges}
    assert nodes <= set(LAYERS), f"place {sorted(nodes - set(LAYERS))} in LAYERS and docs/architecture.md"


def test_imports_point_down_the_layers(repo_edges: list[Edge]) -> None:
    up = [e for e in repo_edges if not e.type_only and LAYERS[e.dst] >= LAYERS[e.src]]
    assert not up, f"imports that do not point to a lower layer:\n{_fmt(up)}"


def test_type_only_imports_upward_are_the_listed_ones(repo_edges: list[Edge]) -> None:
    up = [e for e in repo_edges if e.type_only and LAYERS[e.dst] >= LAYERS[e.src]]
    unlisted = [e for e in up if (e.src, e.dst) not in TYPE_ONLY_UP]
    assert not unlisted, f"type-only imports upward, not in TYPE_ONLY_UP:\n{_fmt(unlisted)}"
    assert {(e.src, e.dst) for e in up} == set(TYPE_ONLY_UP), "TYPE_ONLY_UP lists an edge the code no longer has"


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_the_scan_finds_a_cycle_through_a_function_body_and_skips_type_checking(tmp_path: Path) -> None:
    _write(tmp_path, "pearl/__init__.py", "")
    _write(tmp_path, "pearl/config.py", "")
    _write(tmp_path, "pearl/core/__init__.py", "")
    _write(tmp_path, "pearl/core/a.py", "from pearl.config import X\n")
    _write(tmp_path, "pearl/runtime/__init__.py", "")
    _write(tmp_path, "pearl/runtime/r.py", "import pearl.train.t\n")
    _write(tmp_path, "pearl/train/__init__.py", "")
    _write(tmp_path, "pearl/train/t.py", "def f():\n    from pearl.runtime.r import g\n")
    _write(tmp_path, "pearl/engines/__init__.py", "")
    _write(tmp_path, "pearl/engines/e.py",
           "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pearl.runtime.r import C\n")
    _write(tmp_path, "envs/x.py", "from pearl import __version__\n")
    es = edges(tmp_path)
    assert sorted((e.src, e.dst, e.where, e.type_only) for e in es) == [
        ("core", "base", "pearl/core/a.py:1", False),
        ("engines", "runtime", "pearl/engines/e.py:3", True),
        ("envs", "base", "envs/x.py:1", False),
        ("runtime", "train", "pearl/runtime/r.py:1", False),
        ("train", "runtime", "pearl/train/t.py:2", False),
    ]
    assert cycles([e for e in es if not e.type_only]) == [["runtime", "train"]]


# ---------------------------------------------------------------------- wiring through constructors
#: Post-construction assignments that stay, each with its reason (path, target as written).
WIRING_ALLOWED: Mapping[tuple[str, str], str] = {
    ("pearl/models.py", "dst.config.dtype"): "a Hugging Face model's config (torch weights, not a collaborator)",
    ("pearl/models.py", "model.config.dtype"): "a Hugging Face model's config (torch weights, not a collaborator)",
    ("pearl/models.py", "dst.lm_head.weight"): "tied Hugging Face weights (a tensor, not a collaborator)",
    ("pearl/engines/vllm_worker_ext.py", "bindings.nixlAgent"): "paces the NIXL agent that vLLM's own KV connector "
    "constructs inside the worker process: no constructor of ours to pass it to",
}


@dataclass(frozen=True, slots=True)
class Wiring:
    where: str  # path:line
    target: str
    rule: str


def _chain(t: ast.Attribute) -> tuple[str | None, int]:
    """The root name of ``a.b.c`` (None when it is no plain name) and its attribute hops (2)."""
    hops, node = 0, t
    while isinstance(node, ast.Attribute):
        hops, node = hops + 1, node.value
    return (node.id if isinstance(node, ast.Name) else None), hops


def _scopes(tree: ast.Module) -> Iterator[tuple[ast.AST, ast.AST | None]]:
    """Every node with its innermost enclosing function (None at module and class level)."""
    def walk(node: ast.AST, fn: ast.AST | None) -> Iterator[tuple[ast.AST, ast.AST | None]]:
        for child in ast.iter_child_nodes(node):
            yield child, fn
            inner = child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else fn
            yield from walk(child, inner)
    yield from walk(tree, None)


def _component_classes(root: Path) -> set[str]:
    """Public classes of ``pearl`` with behaviour: not a dataclass, NamedTuple, pydantic model, enum,
    Protocol or exception (records: filling their fields is a data update), nor a module's private
    ``_Name`` (that module's own state, e.g. the sglang fake's ``_Req``)."""
    records = {"NamedTuple", "BaseModel", "TypedDict", "Enum", "StrEnum", "IntEnum", "Protocol", "Exception"}
    out = set()
    for path in (root / "pearl").rglob("*.py"):
        for c in ast.walk(ast.parse(path.read_text())):
            if not isinstance(c, ast.ClassDef):
                continue
            bases = {ast.unparse(b).split(".")[-1].split("[")[0] for b in c.bases}
            if (c.name.startswith("_") or any("dataclass" in ast.unparse(d) for d in c.decorator_list) or bases & records
                    or any(b.endswith(("Error", "Exception")) for b in bases)):
                continue
            out.add(c.name)
    return out


def wiring_assignments(root: Path) -> list[Wiring]:
    """Assignments that hand an object a collaborator, or change one, after it was constructed.

    A target ``x.attr`` (``=``, ``+=``, annotated) is one when ``x`` is not the bare ``self`` /
    ``cls`` (an object's own fields are its business) and any of:

    * ``function``: the value is a function: a ``lambda``, the name of a ``def`` of the module, or
      ``y.m`` for a method ``m`` of a class of the module (a bound method: a callback);
    * ``reach``: the target reaches through another object: ``a.b.c`` (``a`` not ``self``) or
      ``self.a.b.c``, three hops (``self.stats.turns`` is the object's own record; ``ctrl.elastic.policy``
      changes a collaborator's collaborator);
    * ``after-construction``: ``x`` was bound in the same function to a call of a public component
      class of ``pearl`` (``c = Controller(...); c.train_steps = 3``): the constructor takes it;
    * ``constructor-argument``: inside an ``__init__``, ``x`` is one of its parameters (a constructor
      that wires what it was given: ``engine.iteration_log = self._iterations``).

    Records (dataclasses, NamedTuples, pydantic models, exceptions) are data: filling their fields
    is none of the above unless it reaches through another object.
    """
    components = _component_classes(root)
    out: list[Wiring] = []
    for path in sorted((root / "pearl").rglob("*.py")):
        rel = str(path.relative_to(root))
        tree = ast.parse(path.read_text())
        defs = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        methods = {m.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                   for m in c.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)}
        built: dict[int, set[str]] = defaultdict(set)  # function -> names bound to a component's constructor
        for n, fn in _scopes(tree):
            if (fn is not None and isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                    and isinstance(n.value.func, ast.Name) and n.value.func.id in components):
                built[id(fn)].update(t.id for t in n.targets if isinstance(t, ast.Name))
        for n, fn in _scopes(tree):
            if isinstance(n, ast.Assign):
                targets, value = n.targets, n.value
            elif isinstance(n, ast.AnnAssign | ast.AugAssign) and n.value is not None:
                targets, value = [n.target], n.value
            else:
                continue
            pairs: list[tuple[ast.expr, ast.expr]] = []
            for t in targets:
                if isinstance(t, ast.Tuple) and isinstance(value, ast.Tuple) and len(t.elts) == len(value.elts):
                    pairs += zip(t.elts, value.elts, strict=True)
                else:
                    pairs += [(x, value) for x in (t.elts if isinstance(t, ast.Tuple) else [t])]
            for t, value in pairs:
                if not isinstance(t, ast.Attribute):
                    continue
                root_name, hops = _chain(t)
                if hops == 1 and root_name in ("self", "cls"):
                    continue
                rule = ""
                if (isinstance(value, ast.Lambda) or (isinstance(value, ast.Name) and value.id in defs)
                        or (isinstance(value, ast.Attribute) and value.attr in methods)):
                    rule = "function"
                elif hops >= 3 or (hops == 2 and root_name != "self"):
                    rule = "reach"
                elif hops == 1 and fn is not None and root_name in built[id(fn)]:
                    rule = "after-construction"
                elif (hops == 1 and isinstance(fn, ast.FunctionDef) and fn.name == "__init__"
                      and root_name in {a.arg for a in fn.args.args[1:] + fn.args.kwonlyargs}):
                    rule = "constructor-argument"
                if rule and (rel, ast.unparse(t)) not in WIRING_ALLOWED:
                    out.append(Wiring(f"{rel}:{n.lineno}", ast.unparse(t), rule))
    return sorted(out, key=lambda w: w.where)


def test_collaborators_are_wired_through_constructors() -> None:
    found = wiring_assignments(ROOT)
    detail = "\n".join(f"  {w.where}: {w.target} = ...  ({w.rule})" for w in found)
    assert not found, f"pass these through the constructor instead of assigning them afterwards:\n{detail}"


def test_wiring_allow_list_names_assignments_the_code_has() -> None:
    for (rel, target), reason in WIRING_ALLOWED.items():
        assert reason and f"{target} = " in (ROOT / rel).read_text(), f"WIRING_ALLOWED: {rel} {target} is gone"


def test_the_wiring_scan_finds_each_kind(tmp_path: Path) -> None:
    _write(tmp_path, "pearl/a.py", """
from dataclasses import dataclass
@dataclass
class Rec:
    n: int = 0
class Engine:
    def __init__(self, sink=None):
        self.sink = sink
    def hook(self): ...
class Owner:
    def __init__(self, engine, rec):
        engine.sink = []                # constructor-argument
        rec.n = 1                       # constructor-argument (a parameter, even a record)
        self.engine = engine
        self.stats = Rec()
    def wire(self, other):
        other.cb = self.wire            # function (bound method)
        other.cb = lambda: 1            # function
        self.engine.sink.x = 1          # reach
        other.engine.sink = []          # reach
        self.stats.n += 1               # own record: fine
        e = Engine()
        e.sink = []                     # after-construction
        r = Rec()
        r.n = 2                         # a record: fine
        other.n = 3                     # a plain field: fine
        e.a, e.b = self.wire, 1         # function, after-construction (a tuple target)
""")
    found = [(w.where.split(":")[1], w.rule) for w in wiring_assignments(tmp_path)]
    assert found == [("12", "constructor-argument"), ("13", "constructor-argument"), ("17", "function"),
                     ("18", "function"), ("19", "reach"), ("20", "reach"), ("23", "after-construction"),
                     ("27", "function"), ("27", "after-construction")]


# ------------------------------------------------------------------ identity and capabilities as fields
#: names that hold a request's identity (a wire id, a conversation, a request id)
ID_LIKE = ("rid", "conv", "request_id")
#: the string methods that cut a string at a separator
CUTS = frozenset({"split", "rsplit", "partition", "rpartition"})


def _says(expr: ast.expr, words: tuple[str, ...]) -> bool:
    return any(w in ast.unparse(expr).lower() for w in words)


def _cuts_an_id(n: ast.AST) -> bool:
    return (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in CUTS and bool(n.args)
            and isinstance(n.args[0], ast.Constant) and n.args[0].value in ("#", "/")
            and (n.args[0].value == "#" or _says(n.func.value, ID_LIKE)))


def _looks_into_an_id(n: ast.AST) -> bool:
    return (isinstance(n, ast.Compare) and isinstance(n.left, ast.Constant) and n.left.value in ("#", "/")
            and any(isinstance(op, ast.In | ast.NotIn) for op in n.ops) and _says(n.comparators[0], ID_LIKE))


def request_id_parsing(tree: ast.Module) -> list[int]:
    """Lines that read identity back out of a request id: a cut at ``#`` (the attempt suffix) of
    anything, a cut at ``/`` of an id-like name (``rid``, ``conv``), ``"#" in <id-like>``."""
    return sorted(n.lineno for n in ast.walk(tree) if _cuts_an_id(n) or _looks_into_an_id(n))


def capability_probing(tree: ast.Module) -> list[int]:
    """Lines that ask an engine what it can do by probing it: ``getattr(<engine>, "name", ...)`` or
    ``hasattr(<engine>, "name")`` with a literal name (the answer is ``engine.capabilities``)."""
    return sorted(n.lineno for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
                  and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and _says(n.args[0], ("engine",)))


def _scan(root: Path, find: object, skip: tuple[str, ...] = ()) -> list[str]:
    hits = []
    for path in source_files(root):
        rel = path.relative_to(root)
        if rel.parts[0] != "pearl" or str(rel).startswith(skip):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        hits += [f"{rel}:{line}" for line in find(tree)]  # type: ignore[operator]
    return hits


def test_nothing_parses_a_request_id() -> None:
    bad = _scan(ROOT, request_id_parsing)
    assert not bad, ("a request's identity is GenerateRequest.conversation / turn / attempt; read the fields, "
                     "never the wire id:\n  " + "\n  ".join(bad))


def test_the_runtime_asks_an_engine_its_capabilities() -> None:
    bad = _scan(ROOT, capability_probing, skip=("pearl/engines/",))
    assert not bad, ("ask engine.capabilities (pearl.engines.base.EngineCapabilities), never probe an engine "
                     "for a method or attribute:\n  " + "\n  ".join(bad))


def test_the_identity_and_capability_scans_find_what_they_forbid() -> None:
    src = """
def f(req, r, engine, ctrl, provider, m):
    conv = req.rid.split("#", 1)[0]           # 3
    traj, _, turn = conv.rpartition("/")      # 4
    if "#" in r.rid:                          # 5
        pass
    busy = {rid.split("/", 1)[0] for rid in r}  # 7
    a = provider.rsplit("/", 1)[-1]           # fine: not an id
    b = m.split("/", 1)[-1]                   # fine: not an id
    c = getattr(engine, "pd_prefill", None)   # 10
    d = getattr(ctrl.engine, "replayed_parts", 0)  # 11
    e = hasattr(engine, "broadcast_weights")  # 12
    g = getattr(engine, name)                 # fine: a dispatch, not a probe
    h = getattr(session, "aclose", None)      # fine: not an engine
"""
    tree = ast.parse(src)
    assert request_id_parsing(tree) == [3, 4, 5, 7]
    assert capability_probing(tree) == [10, 11, 12]


def main() -> None:
    es = edges(ROOT)
    run_time = sorted({(e.src, e.dst) for e in es if not e.type_only})
    print(f"run-time edges between nodes: {len(run_time)}")
    for src in sorted({s for s, _ in run_time}):
        print(f"  {src} -> {', '.join(d for s, d in run_time if s == src)}")
    print(f"cycles: {cycles([e for e in es if not e.type_only])}")
    print("type-only edges:", ", ".join(sorted({f"{e.src} -> {e.dst} ({e.where})" for e in es if e.type_only})))


if __name__ == "__main__":
    main()
