"""Which fields of the run schema the code reads, found in its syntax tree (for the dead-key test).

A field is read when the code loads an attribute chain that reaches it from a config section,
e.g. ``self.config.critic.model.path``. Which section a chain starts from is worked out per
function (nested functions included), per class for ``self.<attribute>``, and at module level:

1. **Names are expanded.** A local name assigned once (``cfg = self.config.critic``; ``a, b = x.c,
   x.d``; ``s = x.v if c else x``: both) and an attribute assigned once in its class
   (``self.settings = rollout_config.multi_turn``) stand for what they were assigned, so
   ``cfg.model.path`` is ``self.config.critic.model.path``.
2. **The root of the expanded chain holds a section by its annotation, or by its name and use.**
   A root annotated with a schema class - a parameter (``config: Optional[ActorConfig]``), a
   variable, an attribute, a name the function returns (its return annotation), a call of a
   function of the module (``_algo(config).gamma``, ``_algo`` returning ``AlgorithmConfig``) - holds
   the sections of that class and its subclasses. Any other root - a parameter, ``self.config`` -
   is a config only when its name says so (``config``, ``cfg``, ``*_config``, ``*_cfg``, or a
   section's own name such as ``model``), and then holds every section whose class has *all* the
   attributes the code uses on that root in its scope (duck typing, as a reader of the code would
   guess). Imported names are never configs.
3. **A loaded chain reads the leaf field it reaches** from each section its root may hold, through
   nested sections (``config.policy_loss.clip_cov_ratio``). An assignment (``cfg.data.seed = 1``)
   writes the field and reads nothing.

So a field counts as read only when the code reads *that* field of *that* kind of section: the
critic's ``model.tokenizer_path`` is not read by ``cfg.actor_rollout_ref.model.tokenizer_path`` nor by
a reward worker's ``worker_config.tokenizer_path``. Where duck typing cannot tell sections apart
(the same fields: ``actor.optim`` and ``critic.optim``) a read counts for each of them: the function
that reads one is the function the other goes through.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

CONFIG_NAME = re.compile(r"^(config|cfg|.+_config|.+_cfg)$")
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclasses.dataclass(frozen=True)
class Section:
    """A config section: its dotted path in the schema ("" for the root) and its class."""

    path: str
    cls: type

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name


def sections_of(cls: type, path: str = "") -> dict[str, Section]:
    """Every section of the schema class ``cls`` (itself included, as ``path``) by dotted path."""
    found = {path: Section(path, cls)}
    hints = typing.get_type_hints(cls)
    for fld in dataclasses.fields(cls):
        if isinstance(hints[fld.name], type) and dataclasses.is_dataclass(hints[fld.name]):
            found.update(sections_of(hints[fld.name], found[path].key(fld.name)))
    return found


def _chain(node: ast.AST | None) -> tuple[str, list[str]] | None:
    """``a.b.c`` -> ("a", ["b", "c"]); ``f(x).b`` -> ("f()", ["b"]); None for other expressions."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return f"{node.func.id}()", attrs[::-1]
    return (node.id, attrs[::-1]) if isinstance(node, ast.Name) else None


def _alternatives(value: ast.expr, module: _Module) -> list[tuple[str, list[str]]] | None:
    """The chains an assigned value may be (both branches of ``a if c else b``); None if not chains
    (a call only when it is of a function of the module with a return annotation)."""
    options = [_chain(value.body), _chain(value.orelse)] if isinstance(value, ast.IfExp) else [_chain(value)]
    if all(options) and all(not root.endswith("()") or module.returns.get(root) for root, _ in options):
        return options
    return None


def _annotated_names(annotation: ast.expr | None) -> set[str]:
    """The names in an annotation (``Optional[ActorConfig]``: Optional, ActorConfig; strings too)."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval")
    return {node.id for node in ast.walk(annotation) if isinstance(node, ast.Name)} if annotation else set()


class _Scope:
    """A function (its nested functions included) or a statement of a module or class body."""

    def __init__(self, body: list[ast.stmt], module: _Module, owner: _Class | None = None,
                 function: ast.FunctionDef | ast.AsyncFunctionDef | None = None) -> None:
        self.tree, self.owner = ast.Module(body=body, type_ignores=[]), owner
        self.nodes = list(ast.walk(self.tree))
        args = function.args if function else None
        self.annotations = {**module.returns,  # "f()" -> f's return annotation
                            **{arg.arg: arg.annotation for arg in
                               ([*args.posonlyargs, *args.args, *args.kwonlyargs] if args else [])}}
        self.aliases: dict[str, list[tuple[str, list[str]]]] = {}
        stores = Counter(node.id for node in self.nodes
                         if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store))
        returns = function.returns if function else None
        for node in self.nodes:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                self.annotations[node.target.id] = node.annotation
            elif returns and isinstance(node, ast.Return) and isinstance(node.value, ast.Name):
                if self.annotations.get(node.value.id) is None:
                    self.annotations[node.value.id] = returns
        for node in self.nodes:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target, value = node.targets[0], node.value
            pairs = [(target, value)]
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                pairs = list(zip(target.elts, value.elts))
            for name, expr in pairs:
                options = _alternatives(expr, module)
                if isinstance(name, ast.Name) and stores[name.id] == 1 and name.id not in self.annotations and options:
                    self.aliases[name.id] = options

    def expand(self, root: str, attrs: list[str], depth: int = 0) -> Iterator[tuple[_Scope, str, list[str]]]:
        """``(scope, root, attributes)`` of the chain with its aliases replaced by what they stand for."""
        if depth > 10:
            return
        if root in self.aliases:
            for inner, more in self.aliases[root]:
                yield from self.expand(inner, more + attrs, depth + 1)
        elif root == "self" and self.owner and attrs and attrs[0] in self.owner.aliases:
            scope, options = self.owner.aliases[attrs[0]]
            for inner, more in options:
                yield from scope.expand(inner, more + attrs[1:], depth + 1)
        else:
            yield self, root, attrs


class _Class:
    """A class: its scopes, its attributes assigned once (aliases) and its annotated attributes."""

    def __init__(self, node: ast.ClassDef, module: _Module) -> None:
        self.name, self.aliases, self.annotations = node.name, {}, {}
        self.scopes = [_Scope(item.body, module, self, item) if isinstance(item, FUNCTIONS)
                       else _Scope([item], module, self) for item in node.body]
        assigned = Counter(target.attr for scope in self.scopes for target in scope.nodes
                           if isinstance(target, ast.Attribute) and isinstance(target.ctx, ast.Store)
                           and _is_self(target.value))
        for scope in self.scopes:
            for stmt in scope.nodes:
                target = getattr(stmt, "target", None) if isinstance(stmt, ast.AnnAssign) else (
                    stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None)
                if isinstance(stmt, ast.AnnAssign) and isinstance(target, ast.Name):  # a class-body field
                    self.annotations[target.id] = stmt.annotation
                if not (isinstance(target, ast.Attribute) and _is_self(target.value)):
                    continue
                if isinstance(stmt, ast.AnnAssign):
                    self.annotations[target.attr] = stmt.annotation
                elif assigned[target.attr] == 1 and _alternatives(stmt.value, module):
                    self.aliases[target.attr] = (scope, _alternatives(stmt.value, module))


class _Module:
    """A module's scopes, and the return annotations of its functions (``"f()"`` -> annotation)."""

    def __init__(self, tree: ast.Module) -> None:
        self.returns = {f"{stmt.name}()": stmt.returns for stmt in tree.body if isinstance(stmt, FUNCTIONS)}
        self.imported = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
                         if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
        self.scopes = [_Scope([stmt for stmt in tree.body if not isinstance(stmt, (*FUNCTIONS, ast.ClassDef))], self)]
        for stmt in tree.body:
            if isinstance(stmt, FUNCTIONS):
                self.scopes.append(_Scope(stmt.body, self, None, stmt))
            elif isinstance(stmt, ast.ClassDef):
                self.scopes += _Class(stmt, self).scopes


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _outermost_attributes(nodes: list[ast.AST]) -> Iterator[ast.Attribute]:
    inner = {id(node.value) for node in nodes if isinstance(node, ast.Attribute)}
    yield from (node for node in nodes if isinstance(node, ast.Attribute) and id(node) not in inner)


def fields_read(paths: list[Path], schema: type) -> dict[str, set[str]]:
    """Dotted key of ``schema`` -> the places (``file:line``) that read it, in the Python files ``paths``."""
    sections = sections_of(schema)
    read: dict[str, set[str]] = defaultdict(set)
    for path in paths:
        module = _Module(ast.parse(path.read_text()))
        uses: dict[tuple, list[tuple[list[str], ast.Attribute]]] = defaultdict(list)  # root -> chains on it
        annotation: dict[tuple, ast.expr | None] = {}
        for scope in module.scopes:
            for node in _outermost_attributes(scope.nodes):
                for home, name, attrs in scope.expand(*_chain(node)) if _chain(node) else ():
                    if name == "self" and home.owner and len(attrs) > 1:
                        root = (home.owner.name, attrs[0])
                        annotation[root], attrs = home.owner.annotations.get(attrs[0]), attrs[1:]
                    elif name in module.imported or name == "self" or not attrs:
                        continue
                    else:
                        root = (id(home), name)
                        annotation[root] = home.annotations.get(name)
                    uses[root].append((attrs, node))
        for root, chains in uses.items():
            for section in _sections_held(root[1], annotation[root], chains, sections):
                for attrs, node in chains:
                    key = _leaf(section, attrs if isinstance(node.ctx, ast.Load) else attrs[:-1], sections)
                    if key:
                        read[key].add(f"{path.name}:{node.lineno}")
    return read


def _sections_held(name: str, annotation: ast.expr | None, chains: list, sections: dict[str, Section]) -> list[Section]:
    """The sections a root may hold: by its annotation, else by its name and the attributes used on it."""
    annotated = _annotated_names(annotation)
    held = [s for s in sections.values() if any(base.__name__ in annotated for base in s.cls.__mro__)]
    if held or not (CONFIG_NAME.match(name) or name in {path.rpartition(".")[2] for path in sections if path}):
        return held
    used = {attrs[0] for attrs, _ in chains}
    return [s for s in sections.values() if used <= {fld.name for fld in dataclasses.fields(s.cls)}]


def _leaf(section: Section, attrs: list[str], sections: dict[str, Section]) -> str | None:
    """The leaf key ``attrs`` reach from ``section`` (None when they stop at a section or leave the schema)."""
    for attr in attrs:
        if attr not in {fld.name for fld in dataclasses.fields(section.cls)}:
            return None
        if section.key(attr) not in sections:
            return section.key(attr)
        section = sections[section.key(attr)]
    return None
