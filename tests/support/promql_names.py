"""Which metric and label names a PromQL expression uses, checked against declared series.

Shared by the tests that keep queries honest (the rules now, dashboards next): every
series a query selects must be declared, and every label it matches, groups by or joins
on must exist on what it applies to. No PromQL library is installed, so this is a small
parser of our own: a tokenizer, a precedence-climbing parser to a tiny AST, and a walk
that infers the label names each subexpression can carry.

The inference is deliberately generous where PromQL is subtle, so a valid query never
fails: one-to-one matching keeps the left side's labels (Prometheus may keep fewer), `or`
carries the labels of both sides, and a function keeps the labels of its first vector
argument unless listed otherwise. A label set containing `ANY` (e.g. `ALERTS`, whose
labels are the alerts') accepts every label.

Everything malformed raises `PromQLError`, never another exception (fuzzed with
hypothesis in tests/rules/test_rules_metrics_declared.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

ANY = "*"
"""In a label set: any label may be present (no label check applies)."""

Labels = frozenset[str]


class PromQLError(ValueError):
    """The expression is not PromQL this parser understands."""


# ----- tokens ---------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+(?![\w.])|\$\{\w+\}|\$\w+)
  | (?P<number>(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![\w.]))
  | (?P<ident>[a-zA-Z_][a-zA-Z0-9_:]*|:[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){}\[\],:@])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    """string, duration (also a Grafana `$variable`), number, ident, op, or end."""
    text: str
    pos: int


def tokenize(expr: str) -> list[Token]:
    """The tokens of `expr`, ending with an `end` token."""
    tokens: list[Token] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise PromQLError(f"unexpected character {expr[pos]!r} at {pos}")
        kind = m.lastgroup
        assert kind is not None
        if kind != "space":
            tokens.append(Token(kind, m.group(), pos))
        pos = m.end()
    tokens.append(Token("end", "", len(expr)))
    return tokens


def _unquote(text: str) -> str:
    if text[0] == "`":
        return text[1:-1]
    # Escapes only matter for metric names spelt as strings; keep the escaped character.
    return re.sub(r"\\(.)", r"\1", text[1:-1])


# ----- syntax tree ----------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


AGGREGATORS = _words(
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio"
)
FUNCTIONS = _words(
    """abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp
    clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month
    deg delta deriv double_exponential_smoothing end exp floor histogram_avg histogram_count
    histogram_fraction histogram_quantile histogram_stddev histogram_stdvar histogram_sum
    holt_winters hour idelta increase info irate label_join label_replace last_over_time ln log10
    log2 mad_over_time max_over_time min_over_time minute month pi predict_linear present_over_time
    quantile_over_time rad rate resets round scalar sgn sin sinh sort sort_by_label
    sort_by_label_desc sort_desc sqrt start stddev_over_time stdvar_over_time sum_over_time tan tanh
    time timestamp vector year"""
)
_SCALAR_FUNCTIONS = frozenset({"pi", "scalar", "time", "start", "end"})
"""Functions whose result is a scalar (no labels)."""
_DATE_FUNCTIONS = _words("day_of_month day_of_week day_of_year days_in_month hour minute month year")
"""Without an argument these return a one-element vector with no labels."""
_KEYWORDS = _words("and or unless by without on ignoring group_left group_right bool offset atan2")
_PRECEDENCE = {
    "or": 1,
    "and": 2,
    "unless": 2,
    "==": 3,
    "!=": 3,
    "<=": 3,
    "<": 3,
    ">=": 3,
    ">": 3,
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
    "atan2": 5,
    "^": 6,
}
_SELECTING_AGGREGATORS = frozenset({"topk", "bottomk", "limitk", "limit_ratio"})
"""Aggregators that return some of their input series, labels unchanged."""
_COMPARISONS = frozenset({"==", "!=", "<=", "<", ">=", ">"})
_SET_OPERATORS = frozenset({"and", "or", "unless"})


@dataclass(frozen=True, slots=True)
class Matcher:
    label: str
    op: str
    value: str


@dataclass(frozen=True, slots=True)
class Literal:
    """A number or a string."""

    value: str | None = None
    """A string's text (label arguments of label_replace, count_values); None for a number."""


@dataclass(frozen=True, slots=True)
class Selector:
    name: str | None
    """The metric name, from before the braces or a `__name__=` matcher; None when unnamed."""
    matchers: tuple[Matcher, ...] = ()


@dataclass(frozen=True, slots=True)
class Call:
    func: str
    args: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Aggregation:
    op: str
    args: tuple[Node, ...]
    grouping: tuple[str, ...] | None = None
    """Labels of `by`/`without`; None when there is no grouping clause."""
    without: bool = False


@dataclass(frozen=True, slots=True)
class Binary:
    op: str
    lhs: Node
    rhs: Node
    on: tuple[str, ...] | None = None
    """Labels of `on`/`ignoring`; None when neither is given."""
    ignoring: bool = False
    group: str | None = None
    """`group_left` or `group_right`, when given."""
    include: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Unary:
    expr: Node


Node = Literal | Selector | Call | Aggregation | Binary | Unary


class _Parser:
    def __init__(self, expr: str) -> None:
        self._tokens = tokenize(expr)
        self._i = 0

    def parse(self) -> Node:
        node = self._expr(1)
        if self._peek().kind != "end":
            self._fail("unexpected")
        return node

    # -- helpers
    def _peek(self, ahead: int = 0) -> Token:
        return self._tokens[min(self._i + ahead, len(self._tokens) - 1)]

    def _next(self) -> Token:
        token = self._peek()
        if token.kind != "end":
            self._i += 1
        return token

    def _at(self, text: str) -> bool:
        token = self._peek()
        return token.kind in ("op", "ident") and token.text == text

    def _expect(self, text: str) -> Token:
        if not self._at(text):
            self._fail(f"expected {text!r}, found")
        return self._next()

    def _fail(self, what: str) -> None:
        token = self._peek()
        raise PromQLError(f"{what} {token.text or 'end of expression'!r} at {token.pos}")

    # -- grammar
    def _expr(self, min_prec: int) -> Node:
        lhs = self._unary()
        while True:
            token = self._peek()
            op = token.text.lower() if token.kind == "ident" else token.text
            prec = _PRECEDENCE.get(op) if token.kind in ("op", "ident") else None
            if prec is None or prec < min_prec:
                return lhs
            self._next()
            if op in _COMPARISONS and self._at("bool"):
                self._next()
            on: tuple[str, ...] | None = None
            ignoring = False
            if self._at("on") or self._at("ignoring"):
                ignoring = self._next().text == "ignoring"
                on = self._label_list()
            group: str | None = None
            include: tuple[str, ...] = ()
            if self._at("group_left") or self._at("group_right"):
                group = self._next().text
                if self._at("("):
                    include = self._label_list()
            # `^` is right-associative; every other operator is left-associative.
            rhs = self._expr(prec if op == "^" else prec + 1)
            lhs = Binary(op, lhs, rhs, on, ignoring, group, include)

    def _unary(self) -> Node:
        if self._at("-") or self._at("+"):
            self._next()
            return Unary(self._expr(_PRECEDENCE["^"]))
        return self._postfix(self._primary())

    def _postfix(self, node: Node) -> Node:
        while True:
            if self._at("["):
                self._next()
                self._duration()
                if self._at(":"):
                    self._next()
                    if not self._at("]"):
                        self._duration()
                self._expect("]")
            elif self._at("offset"):
                self._next()
                if self._at("-"):
                    self._next()
                self._duration()
            elif self._at("@"):
                self._next()
                if self._at("start") or self._at("end"):
                    self._next()
                    self._expect("(")
                    self._expect(")")
                elif self._peek().kind == "number":
                    self._next()
                else:
                    self._fail("expected a timestamp, start() or end(), found")
            else:
                return node

    def _duration(self) -> None:
        if self._peek().kind not in ("duration", "number"):
            self._fail("expected a duration, found")
        self._next()

    def _primary(self) -> Node:
        token = self._peek()
        if token.kind in ("number", "string"):
            self._next()
            return Literal(_unquote(token.text) if token.kind == "string" else None)
        if token.kind == "op":
            if token.text == "(":
                self._next()
                node = self._expr(1)
                self._expect(")")
                return node
            if token.text == "{":
                return self._selector(None)
            self._fail("unexpected")
        if token.kind != "ident":
            self._fail("unexpected")
        name = token.text
        if name.lower() in ("inf", "nan"):
            self._next()
            return Literal()
        if name in AGGREGATORS and (self._peek(1).text in ("(", "by", "without")):
            return self._aggregation()
        if self._peek(1).text == "(":
            if name not in FUNCTIONS:
                self._fail("unknown function")
            self._next()
            return Call(name, self._arguments())
        if name in _KEYWORDS:
            self._fail("unexpected keyword")
        self._next()
        return self._selector(name)

    def _arguments(self) -> tuple[Node, ...]:
        self._expect("(")
        args: list[Node] = []
        while not self._at(")"):
            args.append(self._expr(1))
            if not self._at(","):
                break
            self._next()
        self._expect(")")
        return tuple(args)

    def _aggregation(self) -> Node:
        op = self._next().text
        grouping: tuple[str, ...] | None = None
        without = False
        if self._at("by") or self._at("without"):
            without = self._next().text == "without"
            grouping = self._label_list()
        args = self._arguments()
        if grouping is None and (self._at("by") or self._at("without")):
            without = self._next().text == "without"
            grouping = self._label_list()
        if not args:
            raise PromQLError(f"{op}() needs an argument")
        return Aggregation(op, args, grouping, without)

    def _label_list(self) -> tuple[str, ...]:
        self._expect("(")
        labels: list[str] = []
        while not self._at(")"):
            token = self._next()
            if token.kind == "ident" and ":" not in token.text:
                labels.append(token.text)
            elif token.kind == "string":
                labels.append(_unquote(token.text))
            else:
                raise PromQLError(f"expected a label name, found {token.text!r} at {token.pos}")
            if not self._at(","):
                break
            self._next()
        self._expect(")")
        return tuple(labels)

    def _selector(self, name: str | None) -> Node:
        matchers: list[Matcher] = []
        if self._at("{"):
            self._next()
            while not self._at("}"):
                token = self._next()
                if token.kind == "string" and self._peek().text in (",", "}"):
                    if name is not None:
                        raise PromQLError(f"a second metric name at {token.pos}")
                    name = _unquote(token.text)
                elif token.kind in ("ident", "string"):
                    label = token.text if token.kind == "ident" else _unquote(token.text)
                    op = self._next()
                    if op.text not in ("=", "!=", "=~", "!~"):
                        raise PromQLError(f"expected a matcher operator, found {op.text!r} at {op.pos}")
                    value = self._next()
                    if value.kind != "string":
                        raise PromQLError(f"expected a quoted value, found {value.text!r} at {value.pos}")
                    matchers.append(Matcher(label, op.text, _unquote(value.text)))
                else:
                    raise PromQLError(f"expected a label matcher, found {token.text!r} at {token.pos}")
                if not self._at(","):
                    break
                self._next()
            self._expect("}")
        for m in matchers:
            if m.label == "__name__" and m.op == "=":
                name = m.value
        if name is None and not matchers:
            raise PromQLError("a selector needs a metric name or a matcher")
        return Selector(name, tuple(m for m in matchers if m.label != "__name__"))


def parse(expr: str) -> Node:
    """The syntax tree of `expr`."""
    try:
        return _Parser(expr).parse()
    except RecursionError as exc:  # absurdly deep nesting: still a refusal, not a crash
        raise PromQLError("expression nested too deeply") from exc


# ----- names and labels -----------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """What an expression uses."""

    metric_names: frozenset[str]
    label_names: frozenset[str]
    """Labels in matchers, `by`/`without`, `on`/`ignoring`, `group_left`/`group_right`."""


def _children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Call | Aggregation):
        return node.args
    if isinstance(node, Binary):
        return (node.lhs, node.rhs)
    if isinstance(node, Unary):
        return (node.expr,)
    return ()


def usage(expr: str) -> Usage:
    """The metric and label names `expr` uses (see `Usage`)."""
    names: set[str] = set()
    labels: set[str] = set()
    stack = [parse(expr)]
    while stack:
        node = stack.pop()
        if isinstance(node, Selector):
            if node.name is not None:
                names.add(node.name)
            labels.update(m.label for m in node.matchers)
        elif isinstance(node, Aggregation) and node.grouping:
            labels.update(node.grouping)
        elif isinstance(node, Binary):
            labels.update(node.on or ())
            labels.update(node.include)
        stack.extend(_children(node))
    return Usage(frozenset(names), frozenset(labels))


SeriesLabels = Mapping[str, Labels]
"""Series name -> the label names its series carry (`ANY` in the set: any label)."""


@dataclass
class _Checker:
    series: Callable[[str], Labels | None]
    problems: list[str] = field(default_factory=list)

    def need(self, labels: tuple[str, ...] | frozenset[str], have: Labels | None, where: str) -> None:
        if have is None or ANY in have:
            return
        missing = sorted(set(labels) - have)
        if missing:
            self.problems.append(f"{where}: label(s) {', '.join(missing)} not on {_show(have)}")

    def labels(self, node: Node) -> Labels | None:
        """The labels `node`'s result can carry; None for a scalar or string."""
        if isinstance(node, Literal):
            return None
        if isinstance(node, Selector):
            return self._selector(node)
        if isinstance(node, Unary):
            return self.labels(node.expr)
        if isinstance(node, Aggregation):
            return self._aggregation(node)
        if isinstance(node, Call):
            return self._call(node)
        return self._binary(node)

    def _selector(self, node: Selector) -> Labels:
        if node.name is None:
            return frozenset({ANY})  # only matchers: any series may match
        have = self.series(node.name)
        if have is None:
            self.problems.append(f"{node.name}: not a declared series, recording rule or internal series")
            return frozenset({ANY})
        self.need(tuple(m.label for m in node.matchers), have, f"{node.name}{{...}} matchers")
        return have

    def _aggregation(self, node: Aggregation) -> Labels:
        arg_labels = [self.labels(arg) for arg in node.args]
        inner = arg_labels[-1] or frozenset()
        if node.grouping is not None:
            self.need(node.grouping, inner, f"{node.op} by/without")
        if node.op in _SELECTING_AGGREGATORS:
            return inner  # the grouping only chooses within groups; series keep their labels
        if node.grouping is None:
            out: Labels = frozenset()
        elif node.without:
            out = inner - set(node.grouping)
        else:
            out = frozenset(node.grouping)
        if node.op == "count_values":
            out |= {_string_value(node.args[0]) or ANY}  # its parameter names the new label
        return out

    def _call(self, node: Call) -> Labels | None:
        arg_labels = [self.labels(arg) for arg in node.args]
        if node.func in _SCALAR_FUNCTIONS:
            return None
        if node.func == "vector" or (node.func in _DATE_FUNCTIONS and not node.args):
            return frozenset()
        if node.func in ("absent", "absent_over_time"):
            arg = node.args[0] if node.args else None
            if isinstance(arg, Selector):
                return frozenset(m.label for m in arg.matchers if m.op == "=")
            return frozenset()
        vectors = [labels for labels in arg_labels if labels is not None]
        first = vectors[0] if vectors else frozenset()
        if node.func in ("label_replace", "label_join"):
            strings = [_string_value(arg) for arg in node.args[1:]]
            dst = strings[0] if strings else None
            sources = strings[2:3] if node.func == "label_replace" else strings[2:]
            self.need(tuple(s for s in sources if s), first, f"{node.func} source label")
            return first | {dst} if dst else first | {ANY}
        if node.func == "histogram_quantile" or node.func.startswith("histogram_"):
            return first - {"le"}
        return first

    def _binary(self, node: Binary) -> Labels | None:
        lhs, rhs = self.labels(node.lhs), self.labels(node.rhs)
        if lhs is None or rhs is None:
            return rhs if lhs is None else lhs  # scalar with vector: the vector's labels
        where = f"{node.op} on/ignoring"
        if node.on is not None:
            self.need(node.on, lhs, f"{where} (left side)")
            self.need(node.on, rhs, f"{where} (right side)")
        if node.op == "or":
            return lhs | rhs
        if node.group == "group_left":
            self.need(node.include, rhs, "group_left (right side)")
            return lhs | set(node.include)
        if node.group == "group_right":
            self.need(node.include, lhs, "group_right (left side)")
            return rhs | set(node.include)
        return lhs


def _string_value(node: Node) -> str | None:
    return node.value if isinstance(node, Literal) else None


def _show(labels: Labels) -> str:
    return "{" + ", ".join(sorted(labels)) + "}" if labels else "{} (no labels)"


def check(expr: str, series: SeriesLabels) -> list[str]:
    """Problems of `expr` against `series`: undeclared series and labels that cannot exist.

    Raises `PromQLError` when `expr` does not parse.
    """
    checker = _Checker(series.get)
    _labels(checker, parse(expr))
    return checker.problems


def output_labels(expr: str, series: SeriesLabels) -> Labels:
    """The labels `expr`'s result can carry (for a recording rule: what its series have)."""
    labels = _labels(_Checker(series.get), parse(expr))
    return labels if labels is not None else frozenset()


def _labels(checker: _Checker, tree: Node) -> Labels | None:
    try:
        return checker.labels(tree)
    except RecursionError as exc:  # a long flat chain (a + a + ...) parses, but walks deep
        raise PromQLError("expression nested too deeply") from exc
