"""Route a prompt to its domain, so that the decoder can use that domain's tree.

Two classifiers with one interface (``classify(text) -> domain``):

- :class:`RuleRouter`: transparent keyword and regex rules for ``code``, ``math`` and
  ``reasoning`` (word problems); anything else is ``chat``. Each rule adds its weight to its
  domain; the highest total wins if it reaches ``threshold``. ``explain(text)`` lists the rules that
  fired.
- :class:`LearnedRouter`: scikit-learn's TF-IDF over words and character 3-grams with a
  class-balanced multinomial logistic regression.

:func:`router_accuracy` reports per-domain accuracy on held-out prompts; :func:`holdout_split`
makes a seeded train/test split that does not depend on the library's RNG.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..prompts.items import PromptItem

ROUTED_DOMAINS = ("code", "math", "reasoning", "chat")
FALLBACK = "chat"


def prompt_text(item: PromptItem | Sequence[dict] | str) -> str:
    """The user turns of a prompt, joined."""
    if isinstance(item, str):
        return item
    messages = item.messages if isinstance(item, PromptItem) else item
    return "\n\n".join(
        str(m.get("content", "")) for m in messages if m.get("role", "user") == "user"
    )


@dataclass(frozen=True)
class Rule:
    domain: str
    pattern: str
    weight: float = 1.0

    def matches(self, text: str) -> bool:
        return re.search(self.pattern, text, flags=re.IGNORECASE | re.MULTILINE) is not None


RULES: tuple[Rule, ...] = (
    # code: fenced code, definitions, programming vocabulary
    Rule("code", r"```", 2.0),
    Rule("code", r"^\s*(def|class|import|from \w+ import|#include|function|public|fn)\b", 2.0),
    Rule(
        "code",
        r"\b(python|javascript|java|c\+\+|rust|sql|function|implement|code|program|"
        r"algorithm|compile|regex|api|bug|debug)\b",
        1.5,
    ),
    Rule("code", r"(>>>|->|\breturn\b|==|\w+\(\w*(, ?\w+)*\):)", 1.0),
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
        r"(\$\d|\d+ (dollars|cents|hours|minutes|days|weeks|students|people|apples|"
        r"miles|km|pages|boxes|cookies))",
        1.0,
    ),
    Rule("reasoning", r"\b(give|state) (the|your) (result|answer)|final answer\b", 1.5),
)


@dataclass(frozen=True)
class RuleRouter:
    """The domain whose rules add up to the most weight, if at least ``threshold``; else chat."""

    rules: tuple[Rule, ...] = RULES
    threshold: float = 1.5
    fallback: str = FALLBACK
    name: str = "rules"

    def scores(self, text: str) -> dict[str, float]:
        totals = {d: 0.0 for d in ROUTED_DOMAINS}
        for rule in self.rules:
            if rule.matches(text):
                totals[rule.domain] = totals.get(rule.domain, 0.0) + rule.weight
        return totals

    def explain(self, text: str) -> list[Rule]:
        return [rule for rule in self.rules if rule.matches(text)]

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
