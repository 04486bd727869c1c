"""Issue 37, bounded options (review gateway-and-caches.md cases 141-154, findings 9, 11, 15, 16):
every depth, size, count and thread option of every command is range-checked before any work,
with a message naming the allowed range; a tree must fit the model's positions; a cost model
prices only the drafter it was timed for; exports refuse n-gram lengths and early exits that no
engine or target can take; run and decode agree on which trees an n-gram lookup can propose.
"""

from __future__ import annotations

import json
import time
import typing

import click
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from conftest import tiny_pair_args
from specscope.cli import app
from specscope.decode import check_drafter_fits
from specscope.drafters import DrafterConfig, DrafterError
from specscope.limits import MAX_NGRAM, MAX_THREADS, MAX_TREE_NODES
from specscope.run.config import PromptSpec, RunConfig, RunConfigError
from specscope.serving.export import ENGINES, ExportError, ExportOptions, export_policy
from specscope.trees import (
    DynamicTree,
    TreeConfig,
    TreeConfigError,
    TreeShape,
    bfs_shape,
    check_depth_fits,
)
from specscope.tune.acceptance import PolicyError
from specscope.tune.costs import CostModel, drafting_model
from specscope.tune.policy import PolicyFile

HUGE = str(10**30)

# --- every int option of every command has a bound ----------------------------------------------

# Int options without a click range, each with the reason it may go without one. Options checked
# by the library carry the library's own message (a config file's value is checked the same way);
# test_library_checked_options_refuse_huge_values proves each is bounded.
LIBRARY_CHECKED = {
    ("run", "top_k"): "TreeConfig: 1..4096 (a config file's [tree] too)",
    ("run", "branch"): "TreeConfig: 1..4096",
    ("run", "depth"): "TreeConfig: 1..4096, then the model's positions",
    ("run", "max_nodes"): "TreeConfig: 1..4096",
    **{
        (command, param): "DrafterConfig: 1..1024 (an exit layer then below the target's layers)"
        for command in ("run", "decode", "bench")
        for param in ("prompt_lookup_min", "prompt_lookup_max", "exit_layer")
    },
    **{
        (command, "ngram_size"): "DrafterConfig: 1..1024 (then at most the chain's depth)"
        for command in ("run", "decode")
    },
}
# cli/serve.py's llamacpp command belongs to the gateway's work on issue 37: listed here so that
# the walk below still fails for any new unbounded option.


def _is_int(annotation) -> bool:
    """int, int | None or list[int]: an option that takes integers."""
    args = [a for a in typing.get_args(annotation) if a is not type(None) and a is not Ellipsis]
    if typing.get_origin(annotation) in (list, tuple):
        return bool(args) and all(_is_int(a) for a in args)
    return annotation is int or (bool(args) and all(_is_int(a) for a in args))


def _int_options():
    """(command, parameter name, min, max) of every integer parameter of every command."""
    group = get_command(app)
    for name, command in sorted(group.commands.items()):
        for param in command.params:
            descriptor = getattr(param, "type_descriptor", None)
            if descriptor is not None:  # typer >= 0.29: its own parameter model
                if _is_int(descriptor.annotation):
                    yield name, param.name, param.min, param.max
            elif isinstance(param.type, click.types.IntParamType):
                kind = param.type
                bounded = isinstance(kind, click.IntRange)
                yield name, param.name, kind.min if bounded else None, kind.max if bounded else None


def test_every_int_option_of_every_command_is_bounded():
    seen, unbounded = set(), set()
    for command, name, low, high in _int_options():
        seen.add((command, name))
        if low is None or high is None:
            unbounded.add((command, name))
    assert {
        ("run", "depth"),
        ("decode", "threads"),
        ("llamacpp", "threads"),
    } <= seen  # the walk works
    allowed = set(LIBRARY_CHECKED)
    assert unbounded - allowed == set(), "an int option has no range: give it min= and max="
    # a library-checked entry that has a range now (or is gone) must leave the list
    assert set(LIBRARY_CHECKED) <= unbounded


def _out_of_range(result, option: str, value, low: int, high: int) -> bool:
    """Whether ``result`` is the command line's refusal of ``option`` ``value`` naming its range:
    click's ``is not in the range 1<=x<=4096``, or typer 0.29's ``Input should be less than or
    equal to 4096`` (the bound the value breaks)."""
    text = " ".join(result.output.replace("│", " ").split())
    return (
        result.exit_code == 2
        and f"Invalid value for '{option}'" in text
        and (
            f"{value} is not in the range {low}<=x<={high}" in text
            or (value > high and f"Input should be less than or equal to {high}" in text)
            or (value < low and f"Input should be greater than or equal to {low}" in text)
        )
    )


def _cli(*args):
    started = time.perf_counter()
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result, time.perf_counter() - started


@pytest.fixture
def no_weights(monkeypatch):
    """Fail the test if any model's weights load: every refusal here comes before that."""
    import specscope.models.load as load

    def refuse(*a, **k):
        raise AssertionError("weights were loaded before the option was checked")

    monkeypatch.setattr(load, "load_model", refuse)


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--smoke", "--policy", "chain", "--depth", HUGE], "tree depth must be in 1..4096"),
        (["run", "--smoke", "--top-k", HUGE], "tree top_k must be in 1..4096"),
        (["run", "--smoke", "--branch", HUGE], "tree branch must be in 1..4096"),
        (["run", "--smoke", "--max-nodes", HUGE], "tree max_nodes must be in 1..4096"),
        (
            ["run", "--smoke", "--drafter", "ngram", "--prompt-lookup-max", HUGE],
            f"prompt_lookup_max must be an integer in 1..1024, got {HUGE}",
        ),
        (
            ["decode", "hi", "--drafter", "ngram", "--prompt-lookup-min", HUGE],
            f"prompt_lookup_min must be an integer in 1..1024, got {HUGE}",
        ),
        (
            ["decode", "hi", "--drafter", "early-exit", "--exit-layer", HUGE],
            f"exit_layer must be an integer in 1..1024, got {HUGE}",
        ),
        (
            ["bench", "--methods", "plain", "--prompt-lookup-max", HUGE],
            f"prompt_lookup_max must be an integer in 1..1024, got {HUGE}",
        ),
        (
            ["bench", "--methods", "plain", "--exit-layer", HUGE],
            f"exit_layer must be an integer in 1..1024, got {HUGE}",
        ),
        (
            ["run", "--smoke", "--drafter", "llama-ngram-simple", "--ngram-size", HUGE],
            f"ngram_size must be an integer in 1..1024, got {HUGE}",
        ),
        (
            ["decode", "hi", "--drafter", "llama-ngram-simple", "--ngram-size", HUGE],
            f"ngram_size must be an integer in 1..1024, got {HUGE}",
        ),
    ],
)
def test_library_checked_options_refuse_huge_values(tiny_dirs, tmp_path, no_weights, args, message):
    result, seconds = _cli(
        *args, *tiny_pair_args(tiny_dirs), *(["--out", tmp_path / "r"] if args[0] == "run" else [])
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert seconds < 10


def test_every_library_checked_option_is_tried():
    tried = {("run", "top_k"), ("run", "branch"), ("run", "depth"), ("run", "max_nodes")}
    tried |= {
        (c, p)
        for c in ("run", "decode", "bench")
        for p in ("prompt_lookup_min", "prompt_lookup_max", "exit_layer")
    }
    tried |= {("run", "ngram_size"), ("decode", "ngram_size")}
    assert tried == set(LIBRARY_CHECKED)


# case 141 (finding 15): --threads 99999999999 was an OverflowError traceback in run, sweep, decode
@pytest.mark.parametrize(
    "args",
    [
        ["run", "--smoke"],
        ["decode", "hi"],
        ["sweep", "no-such.toml"],
        ["tune", "no-such-run"],
        ["bench"],
    ],
)
def test_huge_thread_counts_are_refused_naming_the_range(tiny_dirs, no_weights, args):
    result, seconds = _cli(*args, "--threads", "99999999999")
    assert _out_of_range(result, "--threads", 99999999999, 1, MAX_THREADS), result.output
    assert "Traceback" not in result.output and seconds < 10


@pytest.mark.parametrize(
    "args, option, allowed",
    [
        (["run", "--smoke"], "--max-new-tokens", "1<=x<=16777216"),
        (["run", "--smoke"], "--max-prompt-tokens", "1<=x<=16777216"),
        (["run", "--smoke"], "--per-domain", "1<=x<=1000000"),
        (["run", "--smoke"], "--batch-size", "1<=x<=65536"),
        (["run", "--smoke"], "--seed", "0<=x<=4294967295"),
        (["sweep", "x.toml"], "--batch-size", "1<=x<=65536"),
        (["sweep", "x.toml"], "--prompts-per-shard", "1<=x<=1000000"),
        (["sweep", "x.toml"], "--max-points", "1<=x<=1000000"),
        (["sweep", "x.toml"], "--max-retries", "0<=x<=100"),
        (["decode", "hi"], "--depth", "1<=x<=4096"),
        (["decode", "hi"], "--top-k", "1<=x<=4096"),
        (["decode", "hi"], "--branch", "1<=x<=4096"),
        (["decode", "hi"], "--max-nodes", "1<=x<=4096"),
        (["decode", "hi"], "--max-new-tokens", "1<=x<=16777216"),
        (["decode", "hi"], "--seed", "0<=x<=4294967295"),
        (["tune", "r"], "--max-nodes", "1<=x<=256"),
        (["tune", "r"], "--max-depth", "1<=x<=64"),
        (["tune", "r"], "--repeats", "1<=x<=1000"),
        (["tune", "r"], "--context-len", "1<=x<=16777216"),
        (["bench"], "--chain-depth", "1<=x<=4096"),
        (["bench"], "--per-domain", "1<=x<=1000000"),
        (["bench"], "--repeats", "1<=x<=1000"),
        (["analyze", "r"], "--boot", "0<=x<=100000"),
        (["analyze", "r"], "--seed", "0<=x<=4294967295"),
    ],
)
def test_huge_sizes_and_counts_are_refused_naming_the_range(args, option, allowed):
    low, high = (int(x) for x in allowed.split("<=x<="))
    result, seconds = _cli(*args, option, HUGE)
    assert _out_of_range(result, option, 10**30, low, high), result.output
    assert seconds < 10


# --- trees: bounded before anything is built, and they must fit the model -----------------------


def test_a_chain_is_a_parents_array_built_in_linear_time():
    started = time.perf_counter()
    shape = TreeShape.chain(MAX_TREE_NODES)
    assert time.perf_counter() - started < 1
    assert shape.parents[:3] == (-1, 0, 1) and shape.parents[-1] == MAX_TREE_NODES - 2
    assert "paths" not in shape.__dict__  # no path tuples built (quadratic in the depth)
    assert shape.max_depth == MAX_TREE_NODES and shape.is_chain
    with pytest.raises(TreeConfigError, match=r"^a tree has 1\.\.4096 nodes, got 4097$"):
        TreeShape.chain(MAX_TREE_NODES + 1)


def test_same_parent_and_rank_is_still_refused():
    with pytest.raises(TreeConfigError, match="two nodes have the same path"):
        TreeShape((-1, 0, 0), (0, 1, 1))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"policy": "chain", "depth": 100_000}, "tree depth must be in 1..4096, got 100000"),
        ({"top_k": 5000}, "tree top_k must be in 1..4096, got 5000"),
        ({"branch": 10**9}, "tree branch must be in 1..4096, got 1000000000"),
        ({"max_nodes": 4097}, "tree max_nodes must be in 1..4096, got 4097"),
        ({"depth": 0}, "tree depth must be >= 1, got 0"),
    ],
)
def test_tree_config_ranges(fields, message):
    with pytest.raises(TreeConfigError, match=f"^{message}$"):
        TreeConfig(**fields)


def test_dynamic_tree_ranges():
    with pytest.raises(
        TreeConfigError, match=r"^dynamic tree top_k must be in 1\.\.4096, got 5000$"
    ):
        DynamicTree(top_k=5000)


def _bfs_by_paths(num_roots, branch, depth, max_nodes):
    """The breadth-first tree as path tuples (the construction bfs_shape replaced)."""
    paths, frontier = [], [(r,) for r in range(num_roots)]
    for _ in range(depth):
        for p in frontier:
            if len(paths) == max_nodes:
                return TreeShape.from_paths(paths)
            paths.append(p)
        frontier = [p + (r,) for p in frontier for r in range(branch)]
    return TreeShape.from_paths(paths)


@pytest.mark.parametrize(
    "roots, branch, depth, max_nodes",
    [(2, 2, 3, 8), (3, 5, 3, 8), (1, 1, 4, 10), (3, 2, 4, 100), (4, 3, 2, 7), (2, 3, 5, 1)],
)
def test_bfs_shape_is_the_breadth_first_tree_of_path_tuples(roots, branch, depth, max_nodes):
    assert bfs_shape(roots, branch, depth, max_nodes) == _bfs_by_paths(
        roots, branch, depth, max_nodes
    )


def test_the_widest_deepest_paper_tree_is_cut_without_building_the_rest():
    started = time.perf_counter()
    shape = TreeConfig("paper", top_k=4096, branch=4096, depth=4096, max_nodes=4096).shape()
    assert len(shape) == 4096 and shape.depth_counts() == (4096,)
    assert time.perf_counter() - started < 2


@pytest.mark.parametrize(
    "depth, new, limit, message",
    [
        (4, 64, 1024, None),
        (959, 64, 1024, None),  # 1 + 64 + 959 = 1024: fits exactly
        (
            960,
            64,
            1024,
            "a tree of depth 960 with max_new_tokens 64 needs 1025 positions with a one-token "
            "prompt, but the models allow 1024: the depth must be in 1..959 for these models and "
            "max_new_tokens (or lower --max-new-tokens)",
        ),
        (
            2,
            1023,
            1024,
            "max_new_tokens 1023 leaves no room in the models' 1024 positions (one prompt token "
            "and one tree level need 2): max_new_tokens must be in 1..1022 for these models",
        ),
    ],
)
def test_check_depth_fits(depth, new, limit, message):
    if message is None:
        check_depth_fits(depth, new, limit)
    else:
        with pytest.raises(TreeConfigError) as e:
            check_depth_fits(depth, new, limit)
        assert str(e.value) == message


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"id": "p0", "domain": "chat", "prompt": "Why?"}) + "\n")
    return path


# case 147: --depth 2000 advised "lower --max-prompt-tokens to -984"
def test_run_names_the_deepest_tree_the_model_fits(tiny_dirs, prompt_file, tmp_path):
    result, _ = _cli(
        "run",
        "--out",
        tmp_path / "r",
        "-q",
        *tiny_pair_args(tiny_dirs),
        "--prompts",
        prompt_file,
        "--policy",
        "chain",
        "--depth",
        2000,
        "--max-new-tokens",
        3,
    )
    assert result.exit_code == 2, result.output
    assert (
        "error: a tree of depth 2000 with max_new_tokens 3 needs 2004 positions with a one-token "
        "prompt, but the models allow 1024: the depth must be in 1..1020 for these models and "
        "max_new_tokens (or lower --max-new-tokens)"
    ) in " ".join(result.output.split())
    assert "-9" not in result.output
    assert not (tmp_path / "r" / "manifest.json").exists()


def test_decode_names_the_deepest_tree_the_model_fits(tiny_dirs):
    result, _ = _cli("decode", "hi", *tiny_pair_args(tiny_dirs), "--depth", 2000)
    assert result.exit_code == 2, result.output
    assert "the depth must be in 1..959 for these models" in " ".join(result.output.split())


# case 146 (finding 9): --policy chain --depth 100000 built O(depth^2) path tuples, then OOM
@pytest.mark.parametrize("command", ["run", "decode", "bench"])
def test_a_chain_of_depth_100000_is_refused_at_once(tiny_dirs, tmp_path, no_weights, command):
    args = {
        "run": ["run", "--smoke", "--out", tmp_path / "r", "--policy", "chain", "--depth"],
        "decode": ["decode", "hi", "--policy", "chain", "--depth"],
        "bench": ["bench", "--chain-depth"],
    }[command]
    result, seconds = _cli(*args, 100_000, *tiny_pair_args(tiny_dirs))
    if command == "run":  # the tree's own check: a config file's depth gets it too
        assert result.exit_code == 2
        assert "error: tree: tree depth must be in 1..4096, got 100000" in result.output
    else:
        option = "--depth" if command == "decode" else "--chain-depth"
        assert _out_of_range(result, option, 100_000, 1, MAX_TREE_NODES), result.output
    assert seconds < 10


# --- case 154: run and decode agree on what an n-gram lookup can propose -------------------------

SHAPES = {
    "chain": TreeConfig("chain", depth=3),
    "static chain": TreeConfig("static", paths="[(0,), (0, 0)]"),
    "paper chain": TreeConfig("paper", top_k=1, branch=1, depth=3, max_nodes=3),
    "paper tree": TreeConfig("paper"),
    "static tree": TreeConfig("static", paths="[(0,), (1,)]"),
    "non-top chain": TreeConfig("static", paths="[(1,), (1, 0)]"),
}


@pytest.mark.parametrize("name", SHAPES)
def test_run_and_decode_refuse_the_same_trees_for_ngram(name):
    tree = SHAPES[name]
    ngram = DrafterConfig("ngram")
    try:
        check_drafter_fits(ngram, tree.shape())
        decode_ok = True
    except DrafterError as e:
        decode_ok = False
        assert str(e).startswith("the ngram drafter proposes one chain: use --policy chain")
    try:
        RunConfig(tree=tree, drafter=ngram)
        run_ok = True
    except RunConfigError as e:
        run_ok = False
        assert "the ngram drafter proposes one chain" in str(e)
    assert run_ok == decode_ok == (name in ("chain", "static chain", "paper chain"))


def test_decode_refuses_a_dynamic_tree_for_ngram():
    with pytest.raises(DrafterError, match="proposes one chain"):
        check_drafter_fits(DrafterConfig("ngram"), DynamicTree())


# --- run config bounds ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"max_new_tokens": 10**30}, f"max_new_tokens must be in 1..16777216, got {10**30}"),
        (
            {"max_prompt_tokens": 2**24 + 1},
            "max_prompt_tokens must be in 1..16777216, got 16777217",
        ),
        ({"seed": 2**32}, "seed must be in 0..4294967295, got 4294967296"),
        ({"seed": -1}, "seed must be >= 0, got -1"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
    ],
)
def test_run_config_ranges(fields, message):
    with pytest.raises(RunConfigError, match=f"^{message}$"):
        RunConfig(**fields)


def test_prompts_per_domain_range():
    with pytest.raises(RunConfigError, match=r"^per_domain must be in 1\.\.1000000 "):
        PromptSpec(domains=("code",), per_domain=10**7)


# --- case 150 (finding 11): a cost model prices only the drafter it was timed for --------------

TABLE = ((1, 0.01), (2, 0.012), (4, 0.015), (8, 0.02), (16, 0.03), (32, 0.05))
NGRAM = DrafterConfig("ngram", prompt_lookup_min=2, prompt_lookup_max=4)


def _costs(**fields) -> CostModel:
    base = dict(draft_s=TABLE, target_s=TABLE, plain_token_s=0.03)
    return CostModel(**{**base, **fields})


def test_a_cost_model_records_its_drafter_and_model():
    model = _costs(drafter=DrafterConfig(), drafter_model="sha-d")
    data = model.to_dict()
    assert data["drafter"] == {"kind": "draft-model"} and data["drafter_model"] == "sha-d"
    assert CostModel.from_dict(json.loads(json.dumps(data))) == model
    lookup = _costs(draft_s=((1, 0.001),), model_free=True, drafter=NGRAM)
    assert lookup.to_dict()["drafter"] == {
        "kind": "ngram",
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    assert CostModel.from_dict(lookup.to_dict()) == lookup
    with pytest.raises(
        PolicyError, match="^cost model: model_free is false, but its drafter ngram"
    ):
        _costs(drafter=NGRAM)
    with pytest.raises(PolicyError, match="^cost model: drafter: unknown drafter 'medusa'"):
        CostModel.from_dict({**data, "drafter": {"kind": "medusa"}})


def test_a_cost_model_of_another_drafter_is_refused_naming_both():
    lookup = _costs(draft_s=((1, 0.001),), model_free=True, drafter=NGRAM)
    with pytest.raises(PolicyError) as e:
        lookup.check_drafter(DrafterConfig(), "sha-d")
    assert str(e.value) == (
        "the cost model was timed for drafter ngram(prompt_lookup_min=2, prompt_lookup_max=4), "
        "but the run measured draft-model: its costs would misprice that drafter; re-time it "
        "for this run: specscope tune RUN --save-costs FILE"
    )
    early = _costs(drafter=DrafterConfig("early-exit", exit_layer=1), drafter_model="sha-t")
    with pytest.raises(
        PolicyError,
        match=r"timed for drafter early-exit\(exit_layer=1\), but the run measured early-exit\(exit_layer=2\)",
    ):
        early.check_drafter(DrafterConfig("early-exit", exit_layer=2), "sha-t")
    own = _costs(drafter=DrafterConfig(), drafter_model="sha-d")
    with pytest.raises(
        PolicyError, match="drafting with sha-d, but the run's drafts came from sha-x"
    ):
        own.check_drafter(DrafterConfig(), "sha-x")
    assert own.check_drafter(DrafterConfig(), "sha-d") is None
    assert own.check_drafter(DrafterConfig(), None) is None  # model unknown: the kind matches


def test_old_cost_models_are_taken_only_where_the_kind_is_known():
    old_lookup = _costs(draft_s=((1, 0.001),), model_free=True)
    assert old_lookup.check_drafter(NGRAM, None) == (
        "warning: the cost model records no drafter; timed for a model-free drafter (n-gram "
        "lookup), it is taken as ngram(prompt_lookup_min=2, prompt_lookup_max=4)'s (re-time it "
        "for this run: specscope tune RUN --save-costs FILE to record it)"
    )
    with pytest.raises(PolicyError) as e:  # case 150: a lookup's costs for a draft model
        old_lookup.check_drafter(DrafterConfig(), "sha-d")
    assert str(e.value) == (
        "the cost model records no drafter (it was written before cost models did) and was "
        "timed for a model-free drafter (n-gram lookup); the run measured draft-model, which it "
        "would misprice: re-time it for this run: specscope tune RUN --save-costs FILE"
    )
    old_model = _costs()
    assert old_model.check_drafter(DrafterConfig(), "sha-d").startswith(
        "warning: the cost model records no drafter; timed for a model, it is taken as "
        "draft-model's"
    )
    for other in (NGRAM, DrafterConfig("early-exit", exit_layer=1)):  # exit layer unknown
        with pytest.raises(PolicyError, match=f"timed for a model; the run measured {other.kind}"):
            old_model.check_drafter(other, None)


def test_drafting_model_reads_the_pairs_provenance():
    models = {
        "draft": {"source": "/m/d", "fingerprint": "fd"},
        "target": {"source": "/m/t", "fingerprint": None},
    }
    assert drafting_model(models, DrafterConfig()) == "fd"
    assert drafting_model(models, DrafterConfig("early-exit", exit_layer=1)) == "/m/t"
    assert drafting_model(models, NGRAM) is None
    assert drafting_model({}, DrafterConfig()) is None


def _tiny_run(tiny_dirs, prompt_file, out):
    result, _ = _cli(
        "run",
        "--out",
        out,
        "-q",
        *tiny_pair_args(tiny_dirs),
        "--prompts",
        prompt_file,
        "--policy",
        "chain",
        "--depth",
        2,
        "--max-new-tokens",
        4,
    )
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_tune_refuses_a_lookups_cost_model_for_a_draft_model_run(tiny_dirs, prompt_file, tmp_path):
    _tiny_run(tiny_dirs, prompt_file, tmp_path / "r")
    costs = tmp_path / "costs-ng.json"
    costs.write_text(
        json.dumps(_costs(draft_s=((1, 0.001),), model_free=True, drafter=NGRAM).to_dict())
    )
    result, _ = _cli("tune", tmp_path / "r", "--costs", costs, "--min-count", 1)
    assert result.exit_code == 2, result.output
    assert (
        "error: the cost model was timed for drafter ngram(prompt_lookup_min=2, "
        "prompt_lookup_max=4), but the run measured draft-model"
    ) in " ".join(result.output.split())
    assert not (tmp_path / "r" / "policy.json").exists()
    # the same run's own costs, saved by tune, are taken back, and record the drafter
    saved = tmp_path / "costs-dm.json"
    result, _ = _cli(
        "tune",
        tmp_path / "r",
        "--save-costs",
        saved,
        "--min-count",
        1,
        "--repeats",
        1,
        "--context-len",
        16,
        *tiny_pair_args(tiny_dirs),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(saved.read_text())
    assert data["drafter"] == {"kind": "draft-model"} and data["drafter_model"]
    policy = json.loads((tmp_path / "r" / "policy.json").read_text())
    assert policy["source"]["target"]["layers"] == 2
    result, _ = _cli("tune", tmp_path / "r", "--costs", saved, "--min-count", 1)
    assert result.exit_code == 0, result.output


def test_tune_refuses_a_context_the_model_cannot_hold(tiny_dirs, prompt_file, tmp_path):
    _tiny_run(tiny_dirs, prompt_file, tmp_path / "r")
    result, _ = _cli(
        "tune", tmp_path / "r", "--context-len", 2000, "--repeats", 1, *tiny_pair_args(tiny_dirs)
    )
    assert result.exit_code == 2, result.output
    assert "context_len must be in 1..992 for these models (1024 positions" in result.output


# --- cases 152, 153 (finding 16): exports are bounded ------------------------------------------

CHAIN3 = TreeShape.chain(3)


def _policy_data(drafter: dict, **info) -> dict:
    return {"domains": {"code": {"tree": "[(0,), (0, 0), (0, 0, 0)]", "drafter": drafter}}, **info}


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp", "trtllm", "transformers"])
def test_export_refuses_a_huge_prompt_lookup_for_every_engine(tmp_path, engine):
    policy = tmp_path / "pol.json"
    policy.write_text(
        json.dumps(
            _policy_data({"kind": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 10**30})
        )
    )
    result, _ = _cli("export", policy, "--to", engine, "--draft", "d", "--target", "t.gguf")
    assert result.exit_code == 2, result.output
    assert (
        f"domains.code.drafter: prompt_lookup_max must be an integer in 1..{MAX_NGRAM}, "
        f"got {10**30}"
    ) in " ".join(result.output.split())


def test_export_refuses_a_huge_exit_layer(tmp_path):
    policy = tmp_path / "pol.json"
    policy.write_text(json.dumps(_policy_data({"kind": "early-exit", "exit_layer": 10**9})))
    result, _ = _cli("export", policy, "--to", "transformers")
    assert result.exit_code == 2, result.output
    assert "exit_layer must be an integer in 1..1024, got 1000000000" in result.output


def test_export_checks_the_exit_layer_against_the_recorded_target():
    early = DrafterConfig("early-exit", exit_layer=8)
    info = {"source": {"target": {"model": "/m/t", "layers": 8}}}
    policy = PolicyFile(trees={"code": CHAIN3}, drafters={"code": early}, info=info)
    with pytest.raises(ExportError) as e:
        export_policy(policy, "transformers", ExportOptions())
    assert str(e.value) == (
        "domain 'code': exit_layer must be in 1..7 (the target has 8 layers), got 8 "
        "(/m/t, as the policy records)"
    )
    fits = PolicyFile(
        trees={"code": CHAIN3},
        drafters={"code": DrafterConfig("early-exit", exit_layer=7)},
        info=info,
    )
    doc = export_policy(fits, "transformers", ExportOptions())
    assert not any("layer count" in n for n in doc["notes"])
    bad = PolicyFile(
        trees={"code": CHAIN3},
        drafters={"code": early},
        info={"source": {"target": {"layers": "8"}}},
    )
    with pytest.raises(
        ExportError, match=r"^the policy's source.target.layers must be an integer >= 2, got '8'$"
    ):
        export_policy(bad, "transformers", ExportOptions())


def test_export_says_when_the_exit_layer_is_unchecked():
    policy = PolicyFile(
        trees={"code": CHAIN3}, drafters={"code": DrafterConfig("early-exit", exit_layer=8)}
    )
    doc = export_policy(policy, "transformers", ExportOptions())
    assert (
        "the policy does not record its target's layer count (tune it again to record it, or "
        "give the target): early-exit layer(s) 8 (code) are not checked against the target; "
        "each must be below its layer count"
    ) in doc["notes"]
    for engine in ENGINES:  # a policy without early exits gets no such note
        plain = PolicyFile(trees={"code": CHAIN3})
        opts = ExportOptions(draft="d", target="t.gguf")
        assert not any("layer count" in n for n in export_policy(plain, engine, opts)["notes"])
