"""Route a prompt to its domain, so that the decoder can use that domain's tree.

Two classifiers with one interface (``classify(text) -> domain``):

- :class:`RuleRouter`: transparent keyword and regex rules for ``code``, ``math`` and
  ``reasoning`` (word problems); anything else is ``chat``. Each rule adds its weight to its
  domain; the highest total wins if it reaches ``threshold``. ``explain(text)`` lists the rules that
  fired.
- :class:`LearnedRouter`: TF-IDF over words and character 3-grams with a multinomial logistic
  regression, trained by full-batch gradient descent in numpy (no scikit-learn needed).

:func:`router_accuracy` reports per-domain accuracy on held-out prompts; :func:`holdout_split`
makes a seeded train/test split that does not depend on the library's RNG.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .domains import PromptItem

ROUTED_DOMAINS = ("code", "math", "reasoning", "chat")
FALLBACK = "chat"


def prompt_text(item: PromptItem | Sequence[dict] | str) -> str:
    """The user turns of a prompt, joined."""
    if isinstance(item, str):
        return item
    messages = item.messages if isinstance(item, PromptItem) else item
    return "\n\n".join(str(m.get("content", "")) for m in messages if m.get("role", "user") == "user")


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
    Rule("code", r"\b(python|javascript|java|c\+\+|rust|sql|function|implement|code|program|"
                 r"algorithm|compile|regex|api|bug|debug)\b", 1.5),
    Rule("code", r"(>>>|->|\breturn\b|==|\w+\(\w*(, ?\w+)*\):)", 1.0),
    # math: notation and competition vocabulary
    Rule("math", r"(\$|\\frac|\\sqrt|\^\d|\w\^|≥|≤|√|∑|∫|π)", 1.5),
    Rule("math", r"\b(polynomial|equation|inequalit|integer|real numbers?|prime|divisible|"
                 r"sequence|root|roots|prove|minimum value|maximum value|interval|function f|"
                 r"f\(x\)|solve for|coefficients?|digits?)\b", 1.5),
    Rule("math", r"\b(find|determine|compute|what is) (all|the (smallest|largest|value|sum|number))\b", 1.0),
    Rule("math", r"\b[a-z] ?[+\-*/=<>] ?[a-z0-9]\b", 0.5),
    Rule("math", r"(\b[a-z]_\(?[a-z0-9]|\b\d+/\d+\b|\([a-z0-9+\-*/ ]+\) ?[*/^]|\.\.\.|→|∞)", 1.0),
    Rule("math", r"\b(limit|geometric|arithmetic|progressions?|reciprocals?|positive|zeros?|"
                 r"greatest|smallest value|expression|such that)\b", 0.5),
    # reasoning: grade-school word problems (quantities, people, money, totals)
    Rule("reasoning", r"\bhow (many|much|long|far|old)\b", 1.5),
    Rule("reasoning", r"\b(in total|total|each|per|every|twice|half|times as|left|remaining|"
                      r"spent|costs?|earns?|buys?|sells?|pays?)\b", 0.5),
    Rule("reasoning", r"(\$\d|\d+ (dollars|cents|hours|minutes|days|weeks|students|people|apples|"
                      r"miles|km|pages|boxes|cookies))", 1.0),
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


def _features(text: str) -> list[str]:
    text = text.lower()
    words = re.findall(r"[a-z]+|\d+|[^\sa-z\d]", text)
    grams = [text[i:i + 3] for i in range(max(len(text) - 2, 0))]
    return [f"w:{w}" for w in words] + [f"c:{g}" for g in grams]


@dataclass
class LearnedRouter:
    """TF-IDF features and a softmax regression, fitted with gradient descent (deterministic)."""

    l2: float = 1e-3
    steps: int = 200
    learning_rate: float = 20.0
    max_features: int = 4000
    name: str = "tfidf-logreg"
    vocab: dict[str, int] = field(default_factory=dict)
    idf: np.ndarray | None = None
    weights: np.ndarray | None = None
    classes: tuple[str, ...] = ()

    def _matrix(self, texts: Sequence[str]) -> np.ndarray:
        x = np.zeros((len(texts), len(self.vocab)))
        for i, text in enumerate(texts):
            for f, c in Counter(_features(text)).items():
                j = self.vocab.get(f)
                if j is not None:
                    x[i, j] = 1.0 + np.log(c)
        x *= self.idf
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        return np.hstack([x, np.ones((len(texts), 1))])  # bias column

    def fit(self, texts: Sequence[str], labels: Sequence[str]) -> LearnedRouter:
        if not texts or len(texts) != len(labels):
            raise ValueError("fit needs as many labels as texts, and at least one")
        df = Counter(f for t in texts for f in set(_features(t)))
        kept = sorted(df, key=lambda f: (-df[f], f))[: self.max_features]
        self.vocab = {f: j for j, f in enumerate(kept)}
        self.idf = np.log((1 + len(texts)) / (1 + np.array([df[f] for f in kept]))) + 1.0
        self.classes = tuple(sorted(set(labels)))
        x = self._matrix(texts)
        y = np.zeros((len(texts), len(self.classes)))
        y[np.arange(len(texts)), [self.classes.index(lab) for lab in labels]] = 1.0
        balance = (1.0 / y.sum(axis=0))[y.argmax(axis=1)]  # every class weighs the same
        balance /= balance.sum()
        w = np.zeros((x.shape[1], len(self.classes)))
        for _ in range(self.steps):
            logits = x @ w
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            w -= self.learning_rate * (x.T @ ((p - y) * balance[:, None]) + self.l2 * w)
        self.weights = w
        return self

    def classify(self, text: str) -> str:
        if self.weights is None:
            raise ValueError("the learned router is not fitted: call fit() first")
        return self.classes[int(np.argmax(self._matrix([text]) @ self.weights))]


# --- evaluation ----------------------------------------------------------------------------------


def holdout_split(items: Sequence[PromptItem], test_fraction: float = 0.5,
                  seed: int = 0) -> tuple[list[PromptItem], list[PromptItem]]:
    """Per domain, a seeded split into train and held-out test items (sha256 ranking)."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    train, test = [], []
    for domain in dict.fromkeys(it.domain for it in items):
        ranked = sorted((it for it in items if it.domain == domain),
                        key=lambda it: hashlib.sha256(f"split/{seed}/{it.id}".encode()).hexdigest())
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
    return RouterReport(getattr(router, "name", type(router).__name__),
                        {d: (c, n) for d, (c, n) in per.items()}, dict(confusion))
