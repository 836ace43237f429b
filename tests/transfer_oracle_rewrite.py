"""The transfer oracle's rewrite of a program: each simple statement made a
guarded attempt (tests/transfer_oracle.py has the method).

Every simple statement (an expression, an assignment, ``return``…) runs
first under ``jax.transfer_guard("disallow")``; a guard error it raises is
noted (the traceback's innermost line of the program) and the statement runs
again with the guard at ``log``, its guard lines counted on fd 2. Compound
statements are not rewritten, their bodies are. The rewritten code calls the
oracle through a builtin named :data:`BUILTIN_NAME`.
"""

from __future__ import annotations

import ast
import copy
import importlib.abc
import importlib.machinery
import os

BUILTIN_NAME = "__jto__"


# ----------------------------------------------------------------------------
# The source transformation.

_WRAPPED = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Delete, ast.Raise, ast.Assert)
_TEMPLATE = """
_jto_r = False
try:
    with __jto__.attempt(PATH, 0):
        pass
except BaseException as _jto_e:
    if not __jto__.caught(_jto_e, PATH, 0):
        raise
    _jto_r = True
if _jto_r:
    with __jto__.rerun(PATH, 0):
        pass
"""
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_UNSAFE_NAMES = {"super", "locals", "vars", "dir", "eval", "exec", "__class__"}


def _walk_scope(node):
    """ast.walk, without entering nested functions, lambdas or classes."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        for child in ast.iter_child_nodes(n):
            if not isinstance(child, _SCOPES):
                todo.append(child)


def _suspends(node):
    return any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)) for n in _walk_scope(node))


def _lambda_safe(expr):
    for n in ast.walk(expr):
        if isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await, ast.NamedExpr)):
            return False
        if isinstance(n, ast.comprehension) and n.is_async:
            return False
        if isinstance(n, ast.Name) and n.id in _UNSAFE_NAMES:
            return False
    return True


def _locate(nodes, src):
    for root in nodes:
        for n in ast.walk(root):
            if "lineno" in n._attributes:
                n.lineno, n.col_offset = src.lineno, src.col_offset
                n.end_lineno, n.end_col_offset = src.end_lineno, src.end_col_offset


class _Transformer:
    def __init__(self, path):
        self.path = path

    def _const(self, src):
        return ast.copy_location(ast.Constant(self.path), src)

    def _call(self, method, src, arg):
        """__jto__.METHOD(PATH, LINE, arg); only the new nodes get src's location."""
        node = ast.Call(
            func=ast.Attribute(value=ast.Name(BUILTIN_NAME, ast.Load()), attr=method, ctx=ast.Load()),
            args=[ast.Constant(self.path), ast.Constant(src.lineno)],
            keywords=[],
        )
        _locate([node], src)
        node.args.append(arg)
        return node

    def body(self, stmts, in_class=False, docstring=False):
        out = []
        for i, s in enumerate(stmts):
            if (
                docstring
                and i == 0
                and isinstance(s, ast.Expr)
                and isinstance(s.value, ast.Constant)
                and isinstance(s.value.value, str)
            ):
                out.append(s)
            else:
                out.extend(self.stmt(s, in_class))
        return out

    def header(self, expr, line_src, in_class, method="expr"):
        if in_class or isinstance(expr, ast.Constant) or not _lambda_safe(expr):
            return expr
        args = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
        lam = ast.Lambda(args=args, body=ast.Constant(None))
        _locate([lam], expr)
        lam.body = expr
        return self._call(method, line_src, lam)

    def stmt(self, s, in_class):
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            s.body = self.body(s.body, docstring=True)
            return [s]
        if isinstance(s, ast.ClassDef):
            s.body = self.body(s.body, in_class=True, docstring=True)
            return [s]
        if isinstance(s, (ast.If, ast.While)):
            s.test = self.header(s.test, s, in_class)
            s.body = self.body(s.body, in_class)
            s.orelse = self.body(s.orelse, in_class)
            return [s]
        if isinstance(s, ast.For):
            s.iter = self.header(s.iter, s, in_class, "iterate")
            s.body = self.body(s.body, in_class)
            s.orelse = self.body(s.orelse, in_class)
            return [s]
        if isinstance(s, ast.AsyncFor):
            s.body = self.body(s.body, in_class)
            s.orelse = self.body(s.orelse, in_class)
            return [s]
        if isinstance(s, ast.With):
            for item in s.items:
                item.context_expr = self.header(item.context_expr, s, in_class)
            s.body = self.body(s.body, in_class)
            return [s]
        if isinstance(s, ast.AsyncWith):
            s.body = self.body(s.body, in_class)
            return [s]
        if isinstance(s, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            s.body = self.body(s.body, in_class)
            for h in s.handlers:
                h.body = self.body(h.body, in_class)
            s.orelse = self.body(s.orelse, in_class)
            s.finalbody = self.body(s.finalbody, in_class)
            return [s]
        if isinstance(s, getattr(ast, "Match", ())):
            for case in s.cases:
                case.body = self.body(case.body, in_class)
            return [s]
        if in_class or not isinstance(s, _WRAPPED):
            return [s]
        if isinstance(s, ast.AnnAssign) and s.value is None:
            return [s]
        if _suspends(s):
            return self.split_yield(s)
        return self.wrap(s)

    def split_yield(self, s):
        """``yield V`` / ``x = yield V``: V is computed (wrapped) before the yield,
        so that no guard level is held across the suspension."""
        value = s.value
        if (
            isinstance(s, (ast.Expr, ast.Assign))
            and isinstance(value, ast.Yield)
            and value.value is not None
            and not _suspends(value.value)
        ):
            stash = ast.Expr(
                ast.Call(
                    func=ast.Attribute(ast.Name(BUILTIN_NAME, ast.Load()), "stash", ast.Load()),
                    args=[value.value],
                    keywords=[],
                )
            )
            _locate([stash.value.func], s)
            ast.copy_location(stash, s)
            ast.copy_location(stash.value, value.value)
            unstash = ast.Call(
                func=ast.Attribute(ast.Name(BUILTIN_NAME, ast.Load()), "unstash", ast.Load()), args=[], keywords=[]
            )
            _locate([unstash], value.value)
            value.value = unstash
            return [*self.wrap(stash), s]
        return [s]

    def wrap(self, s):
        tmpl = ast.parse(_TEMPLATE).body
        _locate(tmpl, s)
        for n in ast.walk(ast.Module(body=tmpl, type_ignores=[])):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("attempt", "caught", "rerun"):
                n.args[-2] = self._const(s)
                n.args[-1] = ast.copy_location(ast.Constant(s.lineno), s)
        _, try_, if_ = tmpl
        try_.body[0].body = [s]
        if_.body[0].body = [copy.deepcopy(s)]
        return tmpl


def transform(source, path):
    """The program's source (str or bytes) -> its transformed code object."""
    tree = ast.parse(source, filename=path)
    tree.body = _Transformer(path).body(tree.body, docstring=True)
    ast.fix_missing_locations(tree)
    return compile(tree, path, "exec", dont_inherit=True)


class _Finder(importlib.abc.MetaPathFinder):
    """Transforms the modules imported from the --include paths too."""

    def __init__(self, oracle, roots):
        self.oracle = oracle
        self.roots = [os.path.abspath(r) for r in roots]

    def _included(self, path):
        return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in self.roots)

    def find_spec(self, name, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        origin = os.path.abspath(spec.origin)
        if not self._included(origin):
            return None
        self.oracle.files.add(origin)
        spec.loader = _Loader(name, origin)
        return spec


class _Loader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return transform(self.get_data(path), path)
