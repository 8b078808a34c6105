"""The load test's code-edit set: real source code with an edit task whose answer re-emits most of it.

Each prompt holds one whole function, class or method of Python's standard library, read at run time from the
installed standard library of the Python that runs the load test (``sysconfig.get_paths()["stdlib"]``; nothing is
copied into this repository), and a task a user would ask of it in a chat: rename a parameter or a local variable,
add type hints, add docstrings, rewrite a for loop as a comprehension or a while loop, reformat (reindent, wrap long
lines, change the quotes). The answer is the passage again with a change: the traffic prompt lookup and n-gram
speculation exploit, on real code instead of composed templates (``grounded_prompts``).

Passages: the top-level ``def`` / ``class`` statements of 40-150 lines (decorators included) of every standard
library module that parses, and the methods of 40-150 lines of classes too long to be passages themselves
(dedented); test packages and ``test_*`` modules, ``site-packages``, spans with a line over 100 characters or a tab
are left out, and a passage is used once (the same text twice, e.g. a function copied between modules, counts once).
One prompt per passage, so no passage repeats across levels either. Deterministic: the files and spans are sorted
before a ``random.Random(seed)`` shuffles them and picks each one's task. The set depends on the Python version
(Python 3.11: about 1 360 prompts).
"""

from __future__ import annotations

import ast
import functools
import io
import os
import random
import re
import sysconfig
import tokenize
from dataclasses import dataclass
from pathlib import Path

MIN_LINES, MAX_LINES = 40, 150
MAX_LINE_CHARS = 100
TASK_KINDS = ("rename", "type-hints", "docstrings", "loop", "reformat")
RECOMMENDED_MAX_TOKENS = 256  # the answers re-emit 40-150 lines: 256 tokens cover the first 50-80 of them
SKIPPED_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"}

# Names a rename task may choose (one the passage does not already use), as a user would.
_NEW_NAMES = ("value", "item", "entry", "current", "element", "chunk", "record", "target", "payload", "pending",
              "cursor", "subject", "piece", "operand", "candidate", "holder", "slot", "fragment", "token_text",
              "data_in", "source_value", "work_item")


@dataclass(frozen=True)
class Span:
    """One passage: ``text`` is lines ``first_line``..``last_line`` (1-based) of ``path`` (relative to the standard
    library), with ``indent`` (a method's) removed from every line."""

    path: str
    first_line: int
    last_line: int
    indent: str
    kind: str  # function, class or method
    name: str  # the function's or class's name; Class.method for a method
    text: str


@dataclass(frozen=True)
class CodeEditPrompt:
    """One prompt: ``text`` contains ``span.text`` verbatim and a task of ``task_kind``."""

    task_kind: str  # one of TASK_KINDS
    variant: str  # which task of the kind (e.g. loop: comprehension or while)
    span: Span
    text: str

    @property
    def passage(self) -> str:
        return self.span.text


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[str]:
    """The standard library's ``.py`` files (relative paths, sorted), without test packages and test modules."""
    root = Path(root or stdlib_root())
    files = []
    for directory, dirs, names in os.walk(root):
        rel = Path(directory).relative_to(root)
        if any(part in SKIPPED_DIRS or part.startswith("config-") for part in rel.parts):
            dirs[:] = []
            continue
        dirs.sort()
        for name in names:
            if name.endswith(".py") and not name.startswith("test_") and not name.endswith("_test.py"):
                files.append((rel / name).as_posix())
    return sorted(files)


def _span(path: str, lines: list[str], node: ast.AST, kind: str, name: str) -> Span | None:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    last = node.end_lineno
    if not MIN_LINES <= last - first + 1 <= MAX_LINES:
        return None
    raw = lines[first - 1 : last]
    if any(len(line) > MAX_LINE_CHARS or "\t" in line for line in raw):
        return None
    indent = raw[0][: len(raw[0]) - len(raw[0].lstrip())]
    if any(line.strip() and not line.startswith(indent) for line in raw):
        return None  # a string's continuation line at a smaller indent: not cleanly dedentable
    text = "\n".join(line[len(indent):] if line.strip() else "" for line in raw)
    return Span(path, first, last, indent, kind, name, text)


def file_spans(path: str, source: str) -> list[Span]:
    """The passages of one module: top-level functions and classes of 40-150 lines, and the methods of 40-150 lines
    of longer classes. Empty for a module that does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    spans = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans.append(_span(path, lines, node, "function", node.name))
        elif isinstance(node, ast.ClassDef):
            if node.end_lineno - node.lineno + 1 <= MAX_LINES:
                spans.append(_span(path, lines, node, "class", node.name))
            else:
                spans.extend(_span(path, lines, sub, "method", f"{node.name}.{sub.name}") for sub in node.body
                             if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return [span for span in spans if span is not None]


@functools.lru_cache(maxsize=2)
def stdlib_spans(root: str | None = None) -> tuple[Span, ...]:
    """Every distinct passage of the standard library, sorted by file and line (a few seconds: parsed once)."""
    root_path = Path(root) if root else stdlib_root()
    spans, seen = [], set()
    for path in stdlib_files(root_path):
        try:
            with tokenize.open(root_path / path) as handle:
                source = handle.read()
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for span in file_spans(path, source):
            if span.text not in seen:
                seen.add(span.text)
                spans.append(span)
    return tuple(spans)


# ------------------------------------------------------------------------------------------------ tasks


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _parameters(function) -> list[str]:
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return [n for n in names if n not in ("self", "cls")]


def _own_nodes(function):
    """The nodes of ``function``'s own scope: nested functions, classes, lambdas and comprehensions left out."""
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
              ast.DictComp, ast.GeneratorExp)
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, scopes):
            stack.extend(ast.iter_child_nodes(node))


def _locals(function) -> list[str]:
    """The names ``function`` assigns in its own scope, in order of first assignment."""
    nodes = sorted(_own_nodes(function), key=lambda node: (getattr(node, "lineno", 0), getattr(node, "col_offset", 0)))
    declared = {n for node in nodes if isinstance(node, (ast.Global, ast.Nonlocal)) for n in node.names}
    names = []
    for node in nodes:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id not in declared:
            if node.id not in names:
                names.append(node.id)
    return names


def _usable_name(name: str, text: str) -> bool:
    return len(name) >= 1 and name != "_" and not name.startswith("__") and \
        len(re.findall(rf"(?<![\w.]){re.escape(name)}\b", text)) >= 2


def _new_name(rng: random.Random, old: str, used: set[str]) -> str:
    """A name a user might ask for in place of ``old``, not used in the passage: a descriptive word for a short name,
    camelCase for a snake_case one, else ``old`` with a prefix or suffix."""
    core = old.strip("_")
    if len(core) <= 2:
        options = list(_NEW_NAMES)
    elif "_" in core:
        head, *rest = core.split("_")
        options = [old[: len(old) - len(old.lstrip("_"))] + head + "".join(part.capitalize() for part in rest)]
    else:
        options = [f"{old}_value", f"new_{old}", f"{old}_obj", f"local_{old}", f"the_{old}"]
    fresh = [name for name in options if name not in used]
    return rng.choice(fresh) if fresh else f"renamed_{old}"


def _rename(rng: random.Random, span: Span, tree: ast.AST, what: str) -> tuple[str, str] | None:
    choices = []  # (kind of name, its name, where it lives)
    top = tree.body[0]
    owners = [top] if span.kind != "class" else [n for n in top.body if isinstance(n, (ast.FunctionDef,
                                                                                        ast.AsyncFunctionDef))]
    for function in owners:
        where = f"`{function.name}`" if span.kind != "class" else f"the method `{span.name}.{function.name}`"
        params = _parameters(function)
        choices += [("parameter", name, where) for name in params if _usable_name(name, span.text)]
        choices += [("local variable", name, where) for name in _locals(function)
                    if name not in params and _usable_name(name, span.text)]
    if not choices:
        return None
    kind, old, where = rng.choice(choices)
    new = _new_name(rng, old, _words(span.text))
    return kind, (f"Rename the {kind} `{old}` of {where} to `{new}` everywhere it is used, change nothing else, "
                  f"and return the whole {what}.")


def _type_hints(rng: random.Random, span: Span, tree: ast.AST, what: str) -> tuple[str, str] | None:
    functions = _functions(tree.body[0])
    bare = [f for f in functions if f.returns is None or any(
        a.annotation is None for a in (*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs)
        if a.arg not in ("self", "cls"))]
    if not bare:
        return None
    if span.kind == "class":
        return "all", (f"Add type hints to the parameters and return values of every method of `{span.name}` and "
                       f"return the whole class, otherwise unchanged.")
    return "one", (f"Add type hints to every parameter and the return value of `{span.name.split('.')[-1]}` "
                   f"(and of any function nested in it), and return the whole {what}.")


def _docstrings(rng: random.Random, span: Span, tree: ast.AST, what: str) -> tuple[str, str] | None:
    functions = _functions(tree.body[0])
    missing = [f for f in functions if ast.get_docstring(f) is None]
    if not missing:
        return "google", (f"Rewrite every docstring of this {what} in Google style (a summary line, then Args: and "
                          f"Returns: sections), change no code, and return the whole {what}.")
    if span.kind == "class":
        return "missing", (f"Add a docstring to each method of `{span.name}` that has none (keep the existing "
                           f"ones), change no code, and return the whole class.")
    return "missing", (f"Add a docstring to `{missing[0].name}` describing its parameters and what it returns, "
                       f"change no code, and return the whole {what}.")


def _appends_only(loop: ast.For) -> bool:
    """A loop whose body only appends to (or adds to, or sets a key of) one collection, perhaps under one ``if``:
    a list, set or dict comprehension says the same."""
    body = loop.body
    if len(body) == 1 and isinstance(body[0], ast.If) and not body[0].orelse:
        body = body[0].body
    if loop.orelse or len(body) != 1:
        return False
    if isinstance(body[0], ast.Assign):
        return len(body[0].targets) == 1 and isinstance(body[0].targets[0], ast.Subscript)
    if not isinstance(body[0], ast.Expr):
        return False
    call = body[0].value
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and \
        call.func.attr in ("append", "add") and len(call.args) == 1 and not call.keywords


def _loop(rng: random.Random, span: Span, tree: ast.AST, what: str) -> tuple[str, str] | None:
    lines = span.text.splitlines()
    loops = [node for node in ast.walk(tree) if isinstance(node, ast.For)]
    if not loops:
        return None
    simple = [loop for loop in loops if _appends_only(loop)]
    if simple:
        loop = rng.choice(simple)
        head = lines[loop.lineno - 1].strip()
        return "comprehension", (f"Replace the loop that starts with `{head}` by a comprehension that builds the "
                                 f"same result, keep everything else as it is, and return the whole {what}.")
    loop = rng.choice(loops)
    head = lines[loop.lineno - 1].strip()
    return "while", (f"Rewrite the loop `{head}` as a `while` loop (an explicit iterator or index) with the same "
                     f"behaviour, keep everything else as it is, and return the whole {what}.")


def _reformat(rng: random.Random, span: Span, tree: ast.AST, what: str) -> tuple[str, str] | None:
    lines = span.text.splitlines()
    options = [("two-spaces", f"Reindent this {what} with 2 spaces per level instead of 4 (leave the contents of "
                              f"strings alone) and return the whole {what}.")]
    if sum(len(line) > 64 for line in lines) >= 3:
        options.append(("wrap", f"Reformat this {what} so that no line is longer than 64 characters, wrapping inside "
                                f"brackets rather than with backslashes, and return the whole {what}."))
    if _single_quoted_strings(span.text) >= 2:
        options.append(("double-quotes", f"Change every single-quoted string in this {what} to double quotes "
                                         f"(escaping where needed), change nothing else, and return the whole {what}."))
    return rng.choice(options)


def _single_quoted_strings(text: str) -> int:
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return 0
    return sum(token.type == tokenize.STRING and token.string.lstrip("rbuRBU").startswith("'") for token in tokens)


_TASKS = {"rename": _rename, "type-hints": _type_hints, "docstrings": _docstrings, "loop": _loop,
          "reformat": _reformat}


def _intro(span: Span) -> str:
    if span.kind == "method":
        cls = span.name.split(".")[0]
        return f"Here is a method of the class `{cls}` from Python's standard library (`{span.path}`)"
    return f"Here is a {span.kind} from Python's standard library (`{span.path}`)"


def make_prompt(rng: random.Random, span: Span, used: dict[str, int] | None = None) -> CodeEditPrompt | None:
    """One prompt for ``span``: of the task kinds that apply to it, the one ``used`` least so far (ties: a seeded
    draw), so that kinds that apply to few passages (loops) still come up often; then its task."""
    try:
        tree = ast.parse(span.text)
    except SyntaxError:
        return None
    what = "method" if span.kind == "method" else span.kind
    used = used if used is not None else {}
    order = {kind: rng.random() for kind in TASK_KINDS}
    for kind in sorted(TASK_KINDS, key=lambda k: (used.get(k, 0), order[k])):  # the first that applies
        made = _TASKS[kind](rng, span, tree, what)
        if made is not None:
            variant, task = made
            text = f"{_intro(span)}:\n\n```python\n{span.text}\n```\n\n{task}"
            used[kind] = used.get(kind, 0) + 1
            return CodeEditPrompt(kind, variant, span, text)
    return None


def code_edit_items(seed: int = 0, root: str | None = None) -> list[CodeEditPrompt]:
    """Every prompt for ``seed``: one per passage of the standard library, in a seeded shuffled order, each with a
    seeded task; distinct, and the same list for the same seed (on the same Python)."""
    return list(_items(seed, root))


@functools.lru_cache(maxsize=4)
def _items(seed: int, root: str | None) -> tuple[CodeEditPrompt, ...]:
    spans = list(stdlib_spans(root))
    rng = random.Random(seed)
    rng.shuffle(spans)
    items, seen, used = [], set(), {}
    for span in spans:
        item = make_prompt(rng, span, used)
        if item is not None and item.text not in seen:
            seen.add(item.text)
            items.append(item)
    return tuple(items)


def code_edit_prompts(seed: int = 0) -> list[str]:
    """The code-edit set as prompt texts (``--dataset code-edit``)."""
    return [item.text for item in code_edit_items(seed)]
