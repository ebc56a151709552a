"""A restricted evaluator for the code a model writes: arithmetic on numbers and lists, nothing else.

``evaluate(source)`` runs a snippet of Python statements and gives its result: the value of the last
statement (an expression, or what the last assignment bound). The code reaches nothing outside
itself: a tree walk over an allow-list of ``ast`` nodes, never ``eval``/``exec``. What it takes:

- numbers (int, float, True/False), list literals, names bound earlier in the snippet;
- ``+ - * / // % **`` and unary ``- + not`` on numbers, comparisons (chained), ``and``/``or``,
  ``a if c else b``, ``xs[i]`` with an int index;
- ``name = expr`` and ``name op= expr``; the pure functions in FUNCTIONS (positional arguments).

Everything else is refused before anything runs, each with a message naming what and why (imports,
attribute access, strings, calls of anything but FUNCTIONS, loops, definitions, ...). Sizes are
capped so that hostile code cannot spend memory or time: the source's length, the tree's size and
depth, an int's bits (checked before a power is computed, and after every operation), round's digits.
Python's own exceptions (ZeroDivisionError, OverflowError, TypeError, ValueError) come back as
``Failed("TypeName: message")``, as Python words them, so ``tests/test_codeact.py`` compares
with Python's ``exec``/``eval`` on the host.
"""

from __future__ import annotations

import ast
import operator

MAX_SOURCE_CHARS = 2000
MAX_NODES = 600
MAX_DEPTH = 40
MAX_INT_BITS = 1024     # about 308 decimal digits: a result, an operand, a list's element
MAX_ROUND_DIGITS = 100  # round(x, n) builds 10**|n|

BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge}
# What a refused node is called in the message (others by their class name).
NAMES = {ast.Attribute: "attribute access", ast.Import: "import", ast.ImportFrom: "import",
         ast.Lambda: "lambda", ast.FunctionDef: "def", ast.AsyncFunctionDef: "def", ast.ClassDef: "class",
         ast.For: "a for loop", ast.While: "a while loop", ast.ListComp: "a comprehension",
         ast.GeneratorExp: "a comprehension", ast.SetComp: "a comprehension", ast.DictComp: "a comprehension",
         ast.Dict: "a dict", ast.Set: "a set", ast.Tuple: "a tuple", ast.JoinedStr: "an f-string",
         ast.Starred: "*unpacking", ast.Slice: "a slice", ast.Global: "global", ast.Nonlocal: "nonlocal",
         ast.With: "with", ast.Try: "try", ast.Raise: "raise", ast.Delete: "del", ast.Assert: "assert",
         ast.If: "an if statement", ast.Return: "return", ast.NamedExpr: "the := operator",
         ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield"}


class Refused(Exception):
    """The snippet uses what the evaluator does not allow; nothing of it has run."""


class Failed(Exception):
    """The snippet ran into an error (the message is Python's "TypeName: message") or a size cap."""


def _round(x, *digits):
    if len(digits) == 1 and isinstance(digits[0], int) and abs(digits[0]) > MAX_ROUND_DIGITS:
        raise Failed(f"round keeps at most {MAX_ROUND_DIGITS} digits either side of the point")
    return round(x, *digits)


# Python's own builtins: on numbers and flat lists of numbers they are pure and cheap.
FUNCTIONS = {"abs": abs, "min": min, "max": max, "round": _round, "len": len, "sum": sum}


def evaluate(source: str):
    """The result of running ``source`` (see the module's docstring); Refused or Failed if it cannot."""
    statements = check(source)
    env: dict[str, object] = {}
    result = None
    for statement in statements:
        if isinstance(statement, ast.Expr):
            result = _value(statement.value, env)
        elif isinstance(statement, ast.Assign):
            result = env[statement.targets[0].id] = _value(statement.value, env)
        else:  # AugAssign
            name = statement.target.id
            if name not in env:
                raise Failed(f"NameError: name {name!r} is not defined")
            result = env[name] = _binary(statement.op, env[name], _value(statement.value, env))
    return result


def check(source: str) -> list[ast.stmt]:
    """The snippet's statements, once every node is one the evaluator allows; Refused naming the first
    that is not."""
    if not isinstance(source, str) or len(source) > MAX_SOURCE_CHARS:
        raise Refused(f"the code is longer than {MAX_SOURCE_CHARS} characters")
    try:
        tree = ast.parse(source, mode="exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: a NUL byte
        raise Refused(f"the code does not parse: {getattr(exc, 'msg', exc)}") from None
    except (RecursionError, MemoryError):
        raise Refused("the code nests too deeply to parse") from None
    if not tree.body:
        raise Refused("the code is empty")
    stack, count, called = [(tree, 0)], 0, set()
    while stack:  # a loop, not recursion: the depth is what it checks
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES or depth > MAX_DEPTH:
            raise Refused(f"the code is too big (at most {MAX_NODES} nodes, nested {MAX_DEPTH} deep)")
        _allowed(node)
        if isinstance(node, ast.Call):
            called.add(id(node.func))
        elif isinstance(node, ast.Name) and node.id in FUNCTIONS and id(node) not in called:
            raise Refused(f"{node.id} can only be called")  # never bound, passed or rebound
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return tree.body


def _allowed(node: ast.AST) -> None:
    if isinstance(node, (ast.Module, ast.Expr, ast.Load, ast.Store, ast.Name, ast.List, ast.BinOp, ast.UnaryOp,
                         ast.BoolOp, ast.And, ast.Or, ast.Compare, ast.IfExp)):
        return
    kind = type(node)
    if kind in BINARY or kind in UNARY or kind in COMPARE:
        return
    if isinstance(node, ast.operator):
        raise Refused(f"the operator {type(node).__name__} is not allowed (only + - * / // % **)")
    if isinstance(node, ast.cmpop):
        raise Refused(f"the comparison {type(node).__name__} is not allowed (only == != < <= > >=)")
    if isinstance(node, ast.unaryop):
        raise Refused("the operator ~ is not allowed (only unary - + not)")
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float, bool):
            raise Refused(f"only numbers are allowed as constants, not {type(node.value).__name__}")
        return
    if isinstance(node, ast.Assign):
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
            raise Refused("an assignment binds one plain name (name = expression)")
        return
    if isinstance(node, ast.AugAssign):
        if not isinstance(node.target, ast.Name):
            raise Refused("an assignment binds one plain name (name += expression)")
        return
    if isinstance(node, ast.Subscript):
        if isinstance(node.slice, ast.Slice):
            raise Refused("a slice is not allowed (only xs[i])")
        return
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            called = node.func.id if isinstance(node.func, ast.Name) else "an expression"
            raise Refused(f"calling {called} is not allowed (only {', '.join(FUNCTIONS)})")
        if node.keywords:
            raise Refused(f"{node.func.id} takes positional arguments only")
        return
    raise Refused(f"{NAMES.get(kind, kind.__name__)} is not allowed")


def _value(node: ast.expr, env: dict):
    """The value of an expression that ``check`` allowed."""
    if isinstance(node, ast.Constant):
        return _capped(node.value)
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise Failed(f"NameError: name {node.id!r} is not defined")
        return env[node.id]
    if isinstance(node, ast.List):
        values = [_value(e, env) for e in node.elts]
        _numbers(*values, what="a list holds")  # flat: shared nested lists could make an exponential repr
        return values
    if isinstance(node, ast.BinOp):
        return _binary(node.op, _value(node.left, env), _value(node.right, env))
    if isinstance(node, ast.UnaryOp):
        operand = _value(node.operand, env)
        if not isinstance(node.op, ast.Not):
            _numbers(operand)
        return UNARY[type(node.op)](operand)
    if isinstance(node, ast.BoolOp):
        value = _value(node.values[0], env)
        for operand in node.values[1:]:  # short-circuit, returning an operand, as Python does
            if bool(value) == isinstance(node.op, ast.Or):
                break
            value = _value(operand, env)
        return value
    if isinstance(node, ast.Compare):
        left = _value(node.left, env)
        for op, right_node in zip(node.ops, node.comparators):
            right = _value(right_node, env)
            if not _guard(COMPARE[type(op)], left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _value(node.body, env) if _value(node.test, env) else _value(node.orelse, env)
    if isinstance(node, ast.Subscript):
        return _guard(operator.getitem, _value(node.value, env), _value(node.slice, env))
    if isinstance(node, ast.Call):
        return _capped(_guard(FUNCTIONS[node.func.id], *(_value(a, env) for a in node.args)))
    raise Refused(f"{type(node).__name__} is not allowed")  # check() let nothing else through


def _binary(op: ast.operator, left, right):
    _numbers(left, right)
    if isinstance(op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and right > 0:
        # A power's size is known before computing it: |left|**right has about bits(left) * right bits.
        if (abs(left).bit_length() - 1) * right > MAX_INT_BITS:
            raise Failed(f"the result would exceed {MAX_INT_BITS} bits")
    return _capped(_guard(BINARY[type(op)], left, right))


def _numbers(*values, what: str = "arithmetic takes") -> None:
    for value in values:
        if type(value) not in (int, float, bool):  # a list: Python would concatenate or repeat it
            raise Failed(f"{what} numbers only, not a {type(value).__name__}")


def _guard(function, *args):
    """``function(*args)`` with Python's errors as Failed("TypeName: message")."""
    try:
        return function(*args)
    except (ArithmeticError, TypeError, ValueError, IndexError) as exc:
        raise Failed(f"{type(exc).__name__}: {exc}") from None


def _capped(value):
    if isinstance(value, int) and abs(value).bit_length() > MAX_INT_BITS:
        raise Failed(f"the result would exceed {MAX_INT_BITS} bits")
    if isinstance(value, complex):  # a negative number to a fractional power
        raise Failed("the result is not a real number")
    return value
