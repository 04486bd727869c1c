r"""Route a prompt to its domain, so that the decoder can use that domain's tree.

Two classifiers with one interface (``classify(text) -> domain``):

- :class:`RuleRouter`: transparent keyword and regex rules for ``code``, ``math`` and
  ``reasoning`` (word problems); anything else is ``chat``. Each rule adds its weight to its
  domain; the highest total wins if it reaches ``threshold``. ``explain(text)`` lists the rules that
  fired.
- :class:`LearnedRouter`: scikit-learn's TF-IDF over words and character 3-grams with a
  class-balanced multinomial logistic regression.

A rule's pattern is an RE2 regular expression (google-re2), matched case-insensitively with ``^``
and ``$`` at line boundaries: Python's ``re`` syntax without backreferences or lookaround, and
``\w``, ``\d``, ``\s`` and ``\b`` are ASCII (``\pL``, ``\pN`` name Unicode letters and digits).
RE2 matches in time linear in the text whatever the pattern, so neither a prompt nor a pattern from
an export document can stall the caller; a pattern RE2 cannot compile is refused when the
:class:`Rule` is made. A :class:`RuleRouter` reads only the first :data:`ROUTED_CHARS`
characters of a text: a rule sees that prefix and nothing after it (``$`` matches where it ends).

:func:`prompt_text` is the text a router classifies: the user turns of a prompt, with the text
parts of multimodal content. :func:`router_accuracy` reports per-domain accuracy on held-out
prompts; :func:`holdout_split` makes a seeded train/test split that does not depend on the
library's RNG.

Routers know nothing of models, trees or engines.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import re2

from ..errors import SpecscopeError
from ..prompts.items import PromptItem

ROUTED_DOMAINS = ("code", "math", "reasoning", "chat")
FALLBACK = "chat"

ROUTED_CHARS = 32_768
"""How many characters of a text a :class:`RuleRouter` reads; the rest does not change the domain.
RE2 is linear, so this bounds a classification's time whatever the prompt (about 1 ms for the
built-in rules, see benchmarks/bench_router.py)."""

ALLOWED_PATTERNS = (
    "RE2 syntax (Python re syntax without backreferences such as \\1 or lookaround such as (?=, "
    "(?!, (?<=; repetition counts up to 1000)"
)


class RouterError(SpecscopeError, ValueError):
    """A routing rule or router that cannot classify: the message names the pattern or value,
    what was wrong and what is allowed."""


def _text_of(content: object) -> str:
    """A message's text: a string as is; of a list of content parts (the OpenAI chat format), the
    ``{"type": "text", "text": ...}`` parts joined by newlines; anything else has none."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    return ""


def prompt_text(item: PromptItem | Sequence[Mapping] | str) -> str:
    """The user turns of a prompt, joined by blank lines. A turn's content is a string, or a list
    of content parts whose text parts count (images, audio and other parts do not); content of any
    other kind adds no text."""
    if isinstance(item, str):
        return item
    messages = item.messages if isinstance(item, PromptItem) else item
    return "\n\n".join(
        _text_of(m.get("content", "")) for m in messages if m.get("role", "user") == "user"
    )


def _utf8(text: str) -> bytes:
    # RE2 reads UTF-8; a lone surrogate (JSON allows "\ud800") goes through as invalid UTF-8,
    # which RE2 reads as one character, instead of failing the request
    return text.encode("utf-8", "surrogatepass")


def _compile(pattern: str) -> re2._Regexp:
    """``pattern`` compiled case-insensitive and multi-line; RouterError naming it if RE2 cannot."""
    options = re2.Options()
    options.log_errors = False  # the RouterError says it
    options.case_sensitive = False
    options.never_capture = True  # only whether it matches counts
    try:
        re2.compile(pattern, options)  # alone first, so that an error quotes the pattern as given
        return re2.compile(f"(?m){pattern}", options)
    except re2.error as e:
        why = e.args[0].decode("utf-8", "replace") if e.args else "not a valid pattern"
        raise RouterError(
            f"routing pattern {pattern!r} cannot be compiled ({why}); allowed: {ALLOWED_PATTERNS}"
        ) from None


def _check_number(value: object, what: str, minimum: float = -math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RouterError(f"{what} must be a finite number, got {value!r}")
    if value < minimum:
        raise RouterError(f"{what} must be at least {minimum:g}, got {value!r}")


@dataclass(frozen=True)
class Rule:
    """``weight`` goes to ``domain`` when ``pattern`` matches (see the module docstring for the
    pattern syntax). Compiled once, when made; raises :class:`RouterError` for a pattern RE2
    cannot compile, an empty domain, or a weight that is negative or not finite."""

    domain: str
    pattern: str
    weight: float = 1.0
    regex: re2._Regexp = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.domain, str) or not self.domain:
            raise RouterError(
                f"routing rule {self.pattern!r}: domain must be a non-empty string, "
                f"got {self.domain!r}"
            )
        if not isinstance(self.pattern, str):
            raise RouterError(f"routing pattern must be a string, got {self.pattern!r}")
        _check_number(self.weight, f"routing rule {self.pattern!r}: weight", minimum=0)
        object.__setattr__(self, "regex", _compile(self.pattern))

    def matches(self, text: str) -> bool:
        return self.regex.search(_utf8(text)) is not None


RULES: tuple[Rule, ...] = (
    # code: fenced code, definitions, programming vocabulary
    Rule("code", r"```", 2.0),
    Rule("code", r"^[^\S\n]*(def|class|import|from \w+ import|#include|function|public|fn)\b", 2.0),
    Rule(
        "code",
        r"\b(python|javascript|java|c\+\+|rust|sql|function|implement|code|program|"
        r"algorithm|compile|regex|api|bug|debug)\b",
        1.5,
    ),
    Rule("code", r"(>>>|->|\breturn\b|==|\w\(\w*(, ?\w+)*\):)", 1.0),
    # math: notation and competition vocabulary
    Rule("math", r"(\$|\\frac|\\sqrt|\^\d|\w\^|≥|≤|√|∑|∫|π)", 1.5),
    Rule(
        "math",
        r"\b(polynomial|equation|inequalit|integer|real numbers?|prime|divisible|"
        r"sequence|root|roots|prove|minimum value|maximum value|interval|function f|"
        r"f\(x\)|solve for|coefficients?|digits?)\b",
        1.5,
    ),
    Rule(
        "math",
        r"\b(find|determine|compute|what is) (all|the (smallest|largest|value|sum|number))\b",
        1.0,
    ),
    Rule("math", r"\b[a-z] ?[+\-*/=<>] ?[a-z0-9]\b", 0.5),
    Rule("math", r"(\b[a-z]_\(?[a-z0-9]|\b\d+/\d+\b|\([a-z0-9+\-*/ ]+\) ?[*/^]|\.\.\.|→|∞)", 1.0),
    Rule(
        "math",
        r"\b(limit|geometric|arithmetic|progressions?|reciprocals?|positive|zeros?|"
        r"greatest|smallest value|expression|such that)\b",
        0.5,
    ),
    # reasoning: grade-school word problems (quantities, people, money, totals)
    Rule("reasoning", r"\bhow (many|much|long|far|old)\b", 1.5),
    Rule(
        "reasoning",
        r"\b(in total|total|each|per|every|twice|half|times as|left|remaining|"
        r"spent|costs?|earns?|buys?|sells?|pays?)\b",
        0.5,
    ),
    Rule(
        "reasoning",
        r"(\$\d|\d (dollars|cents|hours|minutes|days|weeks|students|people|apples|"
        r"miles|km|pages|boxes|cookies))",
        1.0,
    ),
    Rule("reasoning", r"\b(give|state) (the|your) (result|answer)|final answer\b", 1.5),
)
r"""The built-in rules. They are exported and documented, so they are written to take linear time
under Python's ``re`` too: no unbounded repetition starts again at each character of a long run
(``\w+\(`` did, on a long word). ``\w\(`` and ``\d (dollars`` match wherever ``\w+\(`` and
``\d+ (dollars`` do, and ``^[^\S\n]*`` wherever ``^\s*`` does."""


@dataclass(frozen=True)
class RuleRouter:
    """The domain whose rules add up to the most weight, if at least ``threshold``; else chat.
    Reads the first :data:`ROUTED_CHARS` characters of a text."""

    rules: tuple[Rule, ...] = RULES
    threshold: float = 1.5
    fallback: str = FALLBACK
    name: str = "rules"

    def __post_init__(self) -> None:
        if not all(isinstance(rule, Rule) for rule in self.rules):
            raise RouterError("a router's rules must be Rule objects (domain, pattern, weight)")
        _check_number(self.threshold, "routing threshold")
        if not isinstance(self.fallback, str) or not self.fallback:
            raise RouterError(
                f"routing fallback must be a non-empty domain name, got {self.fallback!r}"
            )

    def explain(self, text: str) -> list[Rule]:
        """The rules that match the first :data:`ROUTED_CHARS` characters of ``text``."""
        data = _utf8(text[:ROUTED_CHARS])
        return [rule for rule in self.rules if rule.regex.search(data) is not None]

    def scores(self, text: str) -> dict[str, float]:
        totals = {d: 0.0 for d in ROUTED_DOMAINS}
        for rule in self.explain(text):
            totals[rule.domain] = totals.get(rule.domain, 0.0) + rule.weight
        return totals

    def classify(self, text: str) -> str:
        totals = self.scores(text)
        domain, score = max(totals.items(), key=lambda kv: kv[1])
        return domain if score >= self.threshold else self.fallback


# --- a small learned router ------------------------------------------------------------------------


@dataclass
class LearnedRouter:
    """TF-IDF word and character-trigram features and a class-balanced logistic regression
    (scikit-learn), fitted on labelled prompts; deterministic (lbfgs, no random state)."""

    c: float = 10.0  # inverse L2 strength of the regression
    max_features: int = 4000  # per feature kind
    name: str = "tfidf-logreg"
    model: object = None

    def fit(self, texts: Sequence[str], labels: Sequence[str]) -> LearnedRouter:
        # scikit-learn takes about a second to import; only a learned router needs it
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline, make_union

        if not texts or len(texts) != len(labels):
            raise ValueError("fit needs as many labels as texts, and at least one")
        if len(set(labels)) < 2:
            raise ValueError(f"fit needs prompts of at least two domains, got only {labels[0]!r}")
        features = make_union(
            TfidfVectorizer(
                token_pattern=r"[a-z]+|\d+|[^\sa-z\d]",
                sublinear_tf=True,
                max_features=self.max_features,
            ),
            TfidfVectorizer(
                analyzer="char",
                ngram_range=(3, 3),
                sublinear_tf=True,
                max_features=self.max_features,
            ),
        )
        self.model = make_pipeline(
            features, LogisticRegression(C=self.c, class_weight="balanced", max_iter=2000)
        )
        self.model.fit(list(texts), list(labels))
        return self

    def classify(self, text: str) -> str:
        if self.model is None:
            raise ValueError("the learned router is not fitted: call fit() first")
        return str(self.model.predict([text])[0])


# --- evaluation ----------------------------------------------------------------------------------


def holdout_split(
    items: Sequence[PromptItem], test_fraction: float = 0.5, seed: int = 0
) -> tuple[list[PromptItem], list[PromptItem]]:
    """Per domain, a seeded split into train and held-out test items (sha256 ranking)."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    train, test = [], []
    for domain in dict.fromkeys(it.domain for it in items):
        ranked = sorted(
            (it for it in items if it.domain == domain),
            key=lambda it: hashlib.sha256(f"split/{seed}/{it.id}".encode()).hexdigest(),
        )
        n_test = max(1, round(len(ranked) * test_fraction)) if len(ranked) > 1 else 0
        test += ranked[:n_test]
        train += ranked[n_test:]
    return train, test


@dataclass(frozen=True)
class RouterReport:
    router: str
    per_domain: dict[str, tuple[int, int]]  # domain -> (correct, total)
    confusion: dict[tuple[str, str], int]  # (true, predicted) -> count

    @property
    def accuracy(self) -> float:
        correct = sum(c for c, _ in self.per_domain.values())
        total = sum(n for _, n in self.per_domain.values())
        return correct / total if total else float("nan")

    def domain_accuracy(self, domain: str) -> float:
        correct, total = self.per_domain[domain]
        return correct / total if total else float("nan")


def router_accuracy(router, items: Sequence[PromptItem]) -> RouterReport:
    """Accuracy per true domain, and the confusion counts, of ``router`` on ``items``."""
    per: dict[str, list[int]] = {}
    confusion: Counter = Counter()
    for it in items:
        predicted = router.classify(prompt_text(it))
        cell = per.setdefault(it.domain, [0, 0])
        cell[0] += predicted == it.domain
        cell[1] += 1
        confusion[it.domain, predicted] += 1
    return RouterReport(
        getattr(router, "name", type(router).__name__),
        {d: (c, n) for d, (c, n) in per.items()},
        dict(confusion),
    )
