"""The schema layer of the files users hand in (specscope.schemas, specscope.input_files): every
wrong type, missing or unknown key is one line naming the file and the key, never a traceback."""

from __future__ import annotations

import copy
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specscope.input_files import INPUT_FILES, input_files_markdown
from specscope.schemas import parse

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value, prefix=()):
    """Every key path into ``value``'s tables and lists (where a wrong value can be put)."""
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _paths(inner, (*prefix, i))


def _put(document, path, value):
    target = document
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value


@st.composite
def broken_documents(draw, example):
    """``example`` with a random value put at a random place, a random key added, or a key
    dropped: the mutations a hand-edited or foreign file brings."""
    document = copy.deepcopy(example)
    paths = [p for p in _paths(document) if p]
    kind = draw(st.sampled_from(("replace", "add", "drop")))
    path = draw(st.sampled_from(paths))
    if kind == "replace":
        _put(document, path, draw(json_values))
    elif kind == "add":
        tables = [p for p in _paths(document) if isinstance(_at(document, p), dict)]
        table = _at(document, draw(st.sampled_from(tables)))
        table[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
    else:
        parent = _at(document, path[:-1])
        if isinstance(parent, dict):
            del parent[path[-1]]
    return document


def _at(document, path):
    for part in path:
        document = document[part]
    return document


@pytest.mark.parametrize("name", sorted(INPUT_FILES))
def test_each_example_is_valid(name):
    entry = INPUT_FILES[name]
    parse(entry.schema, entry.example, f"{name}.file", entry.error)


@pytest.mark.parametrize("name", sorted(INPUT_FILES))
def test_any_broken_file_is_one_line_naming_it_never_a_traceback(name):
    entry = INPUT_FILES[name]

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(broken_documents(entry.example))
    def check(document):
        try:
            parse(entry.schema, document, f"{name}.file", entry.error)
        except entry.error as e:
            message = str(e)
            assert message.startswith(f"{name}.file"), message
            assert "\n" not in message and len(message) < 600, message
            unknown = re.match(r".*: unknown key '(.*)'; allowed: (.*)$", message)
            if unknown:  # the key named is one the table does not allow
                key, allowed = unknown.group(1).rpartition(".")[2], unknown.group(2).split(", ")
                assert key not in allowed, message

    check()


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("run-config", {"seed": "42"}, "seed must be an integer, got '42'"),
        ("run-config", {"tree": {"depth": True}}, "tree.depth must be an integer, got True"),
        ("run-config", {"max_new_token": 3}, "unknown key 'max_new_token'; allowed: criteria, "),
        ("prompts-line", {"domain": ["code"]}, "domain must be a string or none, got ['code']"),
        ("deployment", {"fallback": None}, "fallback must be a table (an object), got None"),
        ("cost-model", {"plain_token_s": "0.02"}, "plain_token_s must be a number, got '0.02'"),
        (
            "sweep",
            {"execution": {"batch_size": 2.5}},
            "execution.batch_size must be an integer or none",
        ),
        ("policy-predictions", {"domains": ["cx"]}, "domains must be a table (an object)"),
    ],
)
def test_a_wrong_type_or_key_is_named_with_what_is_allowed(name, change, message):
    entry = INPUT_FILES[name]
    with pytest.raises(entry.error) as e:
        parse(entry.schema, {**entry.example, **change}, "the.file", entry.error)
    assert str(e.value) == f"the.file: {message}" or str(e.value).startswith(f"the.file: {message}")


def test_a_strict_schema_refuses_what_a_lax_one_would_convert():
    # booleans are not integers, numeric strings are not numbers, a float is not an integer
    entry = INPUT_FILES["run-config"]
    for change in ({"seed": 1.0}, {"max_new_tokens": "16"}, {"prompts": {"smoke": "true"}}):
        with pytest.raises(entry.error):
            parse(entry.schema, {**entry.example, **change}, "f", entry.error)


def test_the_reference_page_holds_each_schema():
    page = input_files_markdown()
    for name, entry in INPUT_FILES.items():
        assert f"{{#{name}}}" in page and json.dumps(entry.example) in page
