"""Parsing: .attn text → `attngen.lang.ast.File` (syntax only; `lower` does every semantic check).

Every failure, whatever lark raises, becomes a `SpecError` with a located `Diagnostic` whose help
says what was expected in words (`}`, "a name", "a statement keyword"), never lark's terminal names.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import io
import sys
from typing import Iterable

import lark
from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternStr

from attngen.lang import ast as A
from attngen.lang.diagnostics import Diagnostic, SpecError, normalize_newlines, split_lines
from attngen.ir.nodes import Span
from attngen.resources import cache_dir, cache_write, grammar_dir

STATEMENT_KEYWORDS = tuple(k.value for k in A.StmtKind)

# Parentheses leave no trace in the tree, but long operator chains (`!!!!x`, `s + 1 + 1 ...`) do;
# past this depth the recursive walks here and downstream would end in a RecursionError.
MAX_NESTING = 200
# Longest name or number token. Names that reach generated code are held to 64 characters by
# `lower`; this bound only keeps absurd tokens (a 1 MB literal, a 4,301-digit integer, which
# Python refuses to convert) out of every later stage, with a located error.
MAX_TOKEN_CHARS = 256


_PARSER_OPTIONS = dict(parser="lalr", lexer="contextual", propagate_positions=True, maybe_placeholders=True)


@functools.lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    """The LALR parser. Building its tables takes about 50 ms, a large part of a warm
    `attngen.compile` in a fresh process, so they are kept in the cache directory, keyed by the
    grammar's text, the options and the lark and Python versions; an entry that fails to load is
    a miss and is rebuilt."""
    text = (grammar_dir() / "attn.lark").read_text(encoding="utf-8")
    callbacks = {"COMMENT": _dispatch_comment, "NAME": _bounded, "NUMBER": _bounded}
    fields = [text, repr(sorted(_PARSER_OPTIONS.items())), lark.__version__, repr(sys.version_info[:2])]
    key = hashlib.sha256("\0".join(fields).encode()).hexdigest()[:32]
    path = cache_dir() / f"parser-{key}.lark"
    try:
        with open(path, "rb") as f:
            # Lark.load takes no options; its _load is what lark's own cache calls to restore the
            # callbacks, which are code and not saved. Should a lark release change it, this is
            # a miss every time: slower, never wrong.
            return lark.Lark.__new__(lark.Lark)._load(f, lexer_callbacks=callbacks)
    except Exception:
        pass
    parser = lark.Lark(text, **_PARSER_OPTIONS, lexer_callbacks=callbacks)
    buf = io.BytesIO()
    try:
        parser.save(buf)
    except Exception:
        return parser
    cache_write(path.name, buf.getvalue())
    return parser


class _TooLong(Exception):
    def __init__(self, tok: Token) -> None:
        self.tok = tok


def _bounded(tok: Token) -> Token:
    """`tok`, or _TooLong past MAX_TOKEN_CHARS. A lexer callback for NAME and NUMBER, and applied
    again to every token the tree builder keeps (the contextual lexer does not run NAME's callback
    in states where a keyword shares NAME's pattern)."""
    if len(tok) > MAX_TOKEN_CHARS:
        raise _TooLong(tok)
    return tok


def _too_long(tok: Token, text: str, path: str) -> SpecError:
    what = "number" if tok.type == "NUMBER" else "name"
    return SpecError(
        [Diagnostic(f"{what} of {len(tok)} characters is too long", _span_at(path, tok.line, tok.column, 1),
                    f"names and numbers are at most {MAX_TOKEN_CHARS} characters")],
        source=text, path=path,
    )


# The Lark object is cached and shared, so comments reach the current `parse` call through this
# stack rather than through a callback bound at construction.
_comment_sinks: list = []


def _dispatch_comment(tok: Token) -> Token:
    if _comment_sinks:
        _comment_sinks[-1](tok)
    return tok


def _describe_terminal(name: str) -> str:
    """A terminal in human words: `}` for RBRACE, "a name" for NAME."""
    special = {
        "NAME": "a name",
        "NUMBER": "a number",
        "$END": "end of input",
        "COMMENT": "a comment",
    }
    if name in special:
        return special[name]
    term = _parser().get_terminal(name) if name in _terminal_names() else None
    if term is not None and isinstance(term.pattern, PatternStr):
        return f"`{term.pattern.value}`"
    return name.lower()


@functools.lru_cache(maxsize=1)
def _terminal_names() -> frozenset[str]:
    return frozenset(t.name for t in _parser().terminals)


def _keyword(name: str) -> str | None:
    """The literal text of a keyword-like terminal (`dtype`, `kv`), or None for punctuation etc."""
    if name not in _terminal_names():
        return None
    term = _parser().get_terminal(name)
    if isinstance(term.pattern, PatternStr) and term.pattern.value.replace("_", "").isalpha():
        return term.pattern.value
    return None


def describe_expected(expected: Iterable[str]) -> tuple[str, list[str]]:
    """Human list of what the parser could take, and the keywords among it (for did-you-mean)."""
    names = set(expected)
    keywords = sorted(k for k in (_keyword(n) for n in names) if k is not None)
    stmt_kw = [k for k in keywords if k in STATEMENT_KEYWORDS]
    parts: list[str] = []
    if len(stmt_kw) >= 4:
        names = {n for n in names if _keyword(n) not in STATEMENT_KEYWORDS}
        # At the start of a statement the keywords are the point, so list them; after an
        # expression they are only one possibility among many.
        if names <= {"SEMICOLON", "RBRACE"}:
            parts.append("a statement (" + ", ".join(f"`{k}`" for k in stmt_kw) + ")")
        else:
            parts.append("a new statement")
    ops = {"OROR", "ANDAND", "EQEQ", "NEQ", "LT", "LE", "GT", "GE", "PLUS", "MINUS", "STAR", "SLASH", "PERCENT"}
    if len(names & ops) >= 6:
        parts.append("an operator")
        names -= ops
    rest = sorted(_describe_terminal(n) for n in names)
    # Words first, then punctuation, so that the list reads naturally.
    rest.sort(key=lambda s: (s.startswith("`") and not s[1:-1].replace("_", "").isalpha(), s))
    parts.extend(rest)
    return ", ".join(parts), keywords


def _span_at(path: str, line: int, col: int, width: int = 1) -> Span:
    return Span(path, line, col, line, col + max(1, width))


def _acceptable(e: UnexpectedInput, fallback: Iterable[str]) -> set[str]:
    """What the parser could really take here: LALR merges look-ahead sets of states, so the
    table's list can name tokens (like `)` outside any parenthesis) that would fail one step on."""
    ip = getattr(e, "interactive_parser", None)
    if ip is not None:
        try:
            return set(ip.accepts())
        except Exception:  # accepts() replays the parser; never let that mask the real error
            pass
    return set(fallback or ())


def _syntax_error(e: Exception, text: str, path: str) -> SpecError:
    if isinstance(e, UnexpectedToken):
        tok = e.token
        expected, keywords = describe_expected(_acceptable(e, e.expected))
        if tok.type == "$END":
            line, col = _end_position(text)
            msg = "unexpected end of input"
            if "RBRACE" in _acceptable(e, e.expected):
                msg += "; is a `}` missing?"
            span = _span_at(path, line, col)
        else:
            shown = str(tok)
            msg = f"unexpected `{shown}`" if tok.type != "NUMBER" else f"unexpected number `{shown}`"
            span = Span(path, tok.line, tok.column, tok.end_line or tok.line, tok.end_column or tok.column + 1)
        help_ = f"expected {expected}" if expected else None
        if tok.type == "NAME" and keywords:
            close = difflib.get_close_matches(str(tok), keywords, n=1, cutoff=0.6)
            if close:
                help_ = f"did you mean `{close[0]}`? expected {expected}"
        return SpecError([Diagnostic(msg, span, help_)], source=text, path=path)
    if isinstance(e, UnexpectedCharacters):
        ch = text[e.pos_in_stream] if 0 <= e.pos_in_stream < len(text) else "?"
        shown = ch if ch.isprintable() else repr(ch)
        expected, _ = describe_expected(_acceptable(e, getattr(e, "allowed", None)))
        help_ = f"expected {expected}" if expected else None
        if ch == '"' or ch == "'":
            help_ = "the .attn language has no strings; names are letters, digits and `_`"
        return SpecError(
            [Diagnostic(f"unexpected character `{shown}`", _span_at(path, e.line, e.column), help_)],
            source=text,
            path=path,
        )
    if isinstance(e, UnexpectedEOF):
        line, col = _end_position(text)
        expected, _ = describe_expected(e.expected)
        return SpecError(
            [Diagnostic("unexpected end of input", _span_at(path, line, col), f"expected {expected}" if expected else None)],
            source=text,
            path=path,
        )
    if isinstance(e, UnexpectedInput):
        line, col = getattr(e, "line", 1) or 1, getattr(e, "column", 1) or 1
        return SpecError([Diagnostic("syntax error", _span_at(path, line, col))], source=text, path=path)
    return SpecError([Diagnostic(f"syntax error ({type(e).__name__})", _span_at(path, 1, 1))], source=text, path=path)


def _end_position(text: str) -> tuple[int, int]:
    """Line and column just past the last character that is not whitespace (where EOF bites)."""
    stripped = text.rstrip()
    if not stripped:
        return 1, 1
    lines = split_lines(stripped)
    return len(lines), len(lines[-1]) + 1


# --------------------------------------------------------------------------------------------
# Tree → AST


class _Builder:
    def __init__(self, path: str) -> None:
        self.path = path

    def span(self, node: Tree | Token) -> Span:
        if isinstance(node, Token):
            return Span(self.path, node.line, node.column, node.end_line, node.end_column)
        m = node.meta
        return Span(self.path, m.line, m.column, m.end_line, m.end_column)

    def word(self, tok: Token) -> A.Word:
        return A.Word(str(_bounded(tok)), self.span(tok))

    def num(self, tok: Token, negative: bool = False) -> A.Num:
        return A.Num(str(_bounded(tok)), self.span(tok), negative)

    def signed(self, tree: Tree) -> A.Num:
        toks = tree.children
        if len(toks) == 2 and toks[0] is not None:
            n = toks[1]
            return A.Num(str(_bounded(n)), self.span(tree), True)
        return self.num(toks[-1])

    def file(self, tree: Tree, comments: tuple[A.Comment, ...]) -> A.File:
        return A.File(tuple(self.variant(v) for v in tree.children), comments, self.path)

    def variant(self, tree: Tree) -> A.VariantDecl:
        name_tok = tree.children[0]
        sp = self.span(tree)
        header = Span(self.path, sp.line, sp.col, name_tok.end_line, name_tok.end_column)
        close = Span(self.path, sp.end_line, sp.end_col - 1, sp.end_line, sp.end_col)
        stmts = tuple(self.stmt(c) for c in tree.children[1:])
        return A.VariantDecl(self.word(name_tok), stmts, sp, header, close)

    def stmt(self, t: Tree) -> A.Stmt:
        d, ch, sp = t.data, t.children, self.span(t)
        if d == "dtype_stmt":
            if len(ch) == 1:  # the one-type form keeps its AST (and everything that reads it) unchanged
                return A.WordStmt(A.StmtKind.DTYPE, self.word(ch[0]), sp)
            pairs = tuple((self.word(o.children[0]), self.word(o.children[1])) for o in ch[1:])
            return A.DTypeStmt(self.word(ch[0]), pairs, sp)
        if d == "quant_stmt":
            return self.quant(ch, sp)
        if d in ("dtype_stmt", "kind_stmt", "layout_stmt", "output_stmt", "sink_stmt"):
            return A.WordStmt(A.StmtKind(d[: -len("_stmt")]), self.word(ch[0]), sp)
        if d in ("head_dim_stmt", "heads_stmt"):
            second = self.num(ch[1]) if len(ch) > 1 and ch[1] is not None else None
            return A.PairStmt(A.StmtKind(d[: -len("_stmt")]), self.num(ch[0]), second, sp)
        if d == "scale_stmt":
            v = ch[0]
            return A.ScaleStmt(None if isinstance(v, Token) and v.type == "AUTO" else self.signed(v), sp)
        if d == "input_stmt":
            dims = tuple(self.num(x.children[0]) if x.children[0].type == "NUMBER" else self.word(x.children[0]) for x in ch[2:] if isinstance(x, Tree))
            is_sorted = isinstance(ch[-1], Token) and ch[-1].type == "SORTED"
            return A.InputStmt(self.word(ch[0]), self.word(ch[1]), dims, is_sorted, sp)
        if d in ("mask_stmt", "score_stmt"):
            return A.ExprStmt(A.StmtKind(d[: -len("_stmt")]), self.expr(ch[0], 0), sp)
        if d == "norm_stmt":
            opts = tuple(
                A.NormOption("scope" if o.data == "norm_scope" else "affine", self.word(o.children[0]), self.span(o))
                for o in ch[3:]
            )
            return A.NormStmt(self.word(ch[0]), self.word(ch[1]), self.signed(ch[2]), opts, sp)
        if d == "kv_cache_stmt":
            return A.KvCacheStmt(self.word(ch[0]), self.num(ch[1]), sp)
        if d in ("residual_stmt", "nan_check_stmt"):
            return A.FlagStmt(A.StmtKind(d[: -len("_stmt")]), sp)
        if d == "tile_stmt":
            if len(ch) == 1 and isinstance(ch[0], Token) and ch[0].type == "AUTO":
                return A.TileStmt((), sp)
            return A.TileStmt(
                tuple(A.TileField(self.word(f.children[0]), self.num(f.children[1]), self.span(f)) for f in ch), sp
            )
        raise AssertionError(f"grammar rule without a builder: {d}")

    def quant(self, ch: list, sp: Span) -> A.QuantStmt:
        src, per, smooth = ch[2], ch[3], ch[4]

        def arg(t: Tree | None) -> A.Num | None:
            return None if t is None else self.signed(t.children[0])

        return A.QuantStmt(self.word(ch[0]), self.word(ch[1]), self.word(src.children[0]), arg(src.children[1]),
                           None if per is None else self.word(per.children[0]), None if per is None else arg(per.children[1]),
                           None if smooth is None else self.word(smooth.children[0]), sp)

    def expr(self, t: Tree | Token, depth: int) -> A.AExpr:
        if depth > MAX_NESTING:
            raise _TooDeep(self.span(t))
        if isinstance(t, Token):  # `?atom` never leaves a bare token, but be safe
            return A.NameE(str(t), self.span(t))
        d, ch, sp = t.data, t.children, self.span(t)
        if d == "num":
            return A.NumE(str(_bounded(ch[0])), sp)
        if d == "true":
            return A.BoolE(True, sp)
        if d == "false":
            return A.BoolE(False, sp)
        if d == "name":
            return A.NameE(str(_bounded(ch[0])), sp)
        if d == "unop":
            return A.UnaryE(str(ch[0]), self.expr(ch[1], depth + 1), sp)
        if d == "binop":
            return A.BinaryE(str(ch[1]), self.expr(ch[0], depth + 1), self.expr(ch[2], depth + 1), sp, self.span(ch[1]))
        if d in ("call", "lookup"):
            args = () if ch[1] is None else tuple(self.expr(a, depth + 1) for a in ch[1].children)
            if d == "call":
                return A.CallE(self.word(ch[0]), args, sp)
            return A.LookupE(self.word(ch[0]), args, sp)
        raise AssertionError(f"expression rule without a builder: {d}")


class _TooDeep(Exception):
    def __init__(self, span: Span) -> None:
        self.span = span


def parse(text: str, path: str = "<string>") -> A.File:
    """Parse .attn source into an AST (with comments); raises SpecError on any syntax error."""
    comments: list[A.Comment] = []

    def keep_comment(tok: Token) -> Token:
        comments.append(A.Comment(str(tok).rstrip(), tok.line, tok.column))
        return tok

    # One line-break rule everywhere (diagnostics.split_lines): CRLF and a lone CR end a line like
    # LF, as in editors. lark counts LFs, so it sees the text with every break made an LF; columns
    # and every other character are unchanged.
    text = normalize_newlines(text)
    try:
        tree = _parse_with_comments(text, keep_comment)
    except _TooLong as e:
        raise _too_long(e.tok, text, path) from None
    except LarkError as e:
        raise _syntax_error(e, text, path) from None
    except RecursionError:
        raise SpecError(
            [Diagnostic("the input is nested too deeply to parse", Span(path, 1, 1, 1, 2))], source=text, path=path
        ) from None
    except Exception as e:  # a bug in lark or here must still reach the user as a diagnostic
        raise SpecError(
            [Diagnostic(f"internal parser error ({type(e).__name__}: {e})", Span(path, 1, 1, 1, 2))], source=text, path=path
        ) from None
    try:
        return _Builder(path).file(tree, tuple(comments))
    except _TooLong as e:
        raise _too_long(e.tok, text, path) from None
    except _TooDeep as e:
        raise SpecError(
            [Diagnostic(f"expression nested more than {MAX_NESTING} levels deep", e.span)], source=text, path=path
        ) from None
    except RecursionError:
        raise SpecError(
            [Diagnostic("the input is nested too deeply to parse", Span(path, 1, 1, 1, 2))], source=text, path=path
        ) from None


def _parse_with_comments(text: str, sink) -> Tree:
    _comment_sinks.append(sink)
    try:
        return _parser().parse(text)
    finally:
        _comment_sinks.pop()
