"""llama.cpp (llama-server): speculation as server flags, and a router-mode presets file.

llama-server takes no speculation setting per request: the ``speculative.n_max``/``n_min``/
``p_min`` request fields are compiled out (``#if 0`` in tools/server/server-schema.cpp) and unknown
request keys are ignored. A per-domain policy is therefore one server configuration per domain.
This module writes each domain's flags (``--spec-type draft-simple``, ``--spec-draft-model`` (-md),
``--spec-draft-n-max``, ``--spec-draft-n-min``, ``--spec-draft-p-min``; for an ngram domain
``--spec-type ngram-simple`` with ``--spec-ngram-simple-size-n``/``-size-m``) and the presets file
of llama-server's router mode (``llama-server --models-preset FILE``): one ``[domain]`` section per
domain over the same target GGUF, started on demand and chosen by the request's ``model`` field.
llama.cpp's ngram-simple is not the rule of specscope's ``ngram`` drafter (vLLM's); the export says
so. The ``llama-ngram-simple`` drafter measures llama.cpp's own rule, and exports exactly. llama.cpp
has no early-exit drafter: such a domain is refused.

Facts below were read from llama.cpp's own source as llama-cpp-python 0.3.36 vendors it (llama.cpp
b11312, commit 0c1e57098): common/arg.cpp (flag names, ranges), common/preset.cpp (the INI parser:
``[section]`` headers, ``key = value`` lines whose key is a flag name without its dashes, unknown
keys an error, ``[*]`` applies to every section), tools/server/server-models.cpp (the router adds
its own command-line flags on top of every preset, so speculation flags belong in the presets, not
on the router's command line). It writes text; it starts no server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ...cache import local_path
from ..export_plan import (
    MEASURED_NGRAM,
    DeploymentPlan,
    DomainPlan,
    ExportOptions,
    chain_length,
    check_drafter,
    need,
)
from ..export_rules import EngineVersion, ExportError, Field, Rule

LLAMA_CPP = "ggml-org/llama.cpp"
SPEC_TYPES = (
    "none",
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
)

B11312 = EngineVersion(
    engine="llama.cpp",
    version="b11312",
    about="commit 0c1e57098, 2026-10-01: the llama.cpp that llama-cpp-python 0.3.36 vendors",
    checked_against=(
        f"{LLAMA_CPP}:common/arg.cpp@0c1e57098bba43ac29e6e3b677cdceebdd22334f",
        f"{LLAMA_CPP}:common/preset.cpp@0c1e57098bba43ac29e6e3b677cdceebdd22334f",
        f"{LLAMA_CPP}:tools/server/server-models.cpp@0c1e57098bba43ac29e6e3b677cdceebdd22334f",
        f"{LLAMA_CPP}:tools/server/server-schema.cpp@0c1e57098bba43ac29e6e3b677cdceebdd22334f",
    ),
    fields=(
        Field("--model", str, required=True),
        Field("--spec-type", str, choices=SPEC_TYPES),
        Field("--spec-draft-model", str),
        Field("--spec-draft-n-max", int, low=0, high=2**31 - 1),
        Field("--spec-draft-n-min", int, low=0, high=2**31 - 1),
        Field("--spec-draft-p-min", float, low=0.0, high=1.0),
        # common/arg.cpp: "ngram size N must be between 1 and 1024 inclusive", same for M
        Field("--spec-ngram-simple-size-n", int, low=1, high=1024),
        Field("--spec-ngram-simple-size-m", int, low=1, high=1024),
        # the other model-free lookups a `specscope llamacpp` policy may hold
        # (llama-server --help of b11312 lists them; bounds as ngram-simple's)
        Field("--spec-ngram-map-k-size-n", int, low=1, high=1024),
        Field("--spec-ngram-map-k-size-m", int, low=1, high=1024),
        Field("--spec-ngram-map-k4v-size-n", int, low=1, high=1024),
        Field("--spec-ngram-map-k4v-size-m", int, low=1, high=1024),
        Field("--spec-ngram-mod-n-match", int, low=1, high=1024),
        Field("--spec-ngram-mod-n-min", int, low=0, high=1024),
        Field("--spec-ngram-mod-n-max", int, low=1, high=1024),
        Field("--poll", int, low=0, high=100),
        Field("--spec-draft-poll", int, low=0, high=1),
        # the rest of a setting timed in llama-server (every flag it timed is exported)
        Field("--threads", int, low=1, high=1024),
        Field("--threads-batch", int, low=1, high=1024),
        Field("--batch-size", int, low=1, high=2**31 - 1),
        Field("--ubatch-size", int, low=1, high=2**31 - 1),
        Field("--ctx-size", int, low=0, high=2**31 - 1),
        Field("--parallel", int, low=1, high=1024),
        Field("--n-gpu-layers", int, low=0, high=2**31 - 1),
        Field("--spec-draft-threads", int, low=1, high=1024),
        Field("--spec-draft-threads-batch", int, low=1, high=1024),
        Field("--spec-draft-ngl", int, low=0, high=2**31 - 1),
    ),
    # llama-server exits on an unknown flag; common/preset.cpp throws "option '...' not recognized
    # in preset" on an unknown key
    forbid_extra=True,
    rules=(
        Rule(
            "--spec-type draft-simple needs --spec-draft-model (-md)",
            lambda s: s.get("--spec-type") != "draft-simple" or "--spec-draft-model" in s,
        ),
        Rule(
            # common/ngram-map.cpp common_ngram_simple_draft: copy_max = min(M, tokens after
            # the match) and "if (copy_max < n_draft_min) return {}" with n_draft_min = N
            "--spec-ngram-simple-size-m >= --spec-ngram-simple-size-n (ngram-simple drops a "
            "draft shorter than N, so M < N never drafts)",
            lambda s: (
                s.get("--spec-ngram-simple-size-m", 48) >= s.get("--spec-ngram-simple-size-n", 12)
            ),
        ),
        Rule(
            "--spec-draft-n-min <= --spec-draft-n-max (a draft shorter than n_min is dropped)",
            lambda s: s.get("--spec-draft-n-min", 0) <= s.get("--spec-draft-n-max", 3),
        ),
        Rule(
            "no ';', '#' or line break in a value (the presets parser, common/preset.cpp, "
            "ends the value there: rename the file)",
            lambda s: not any(isinstance(v, str) and re.search(r"[;#\r\n]", v) for v in s.values()),
        ),
    ),
    notes=(
        "request fields speculative.n_max/n_min/p_min are compiled out of llama-server "
        "(#if 0 in tools/server/server-schema.cpp) and ignored: speculation is set per server "
        "(per preset), never per request",
        "ngram domains: --spec-type ngram-simple, N = prompt_lookup_min, M = K: llama.cpp's own "
        "rule, not the one specscope measured (see approximation)",
        "llama-ngram-simple domains: --spec-type ngram-simple, N = ngram_size, M = K: the rule "
        "specscope measured (specscope.drafters.llama_ngram), exact",
        "early-exit domains refused: llama.cpp has no early-exit drafter",
        "a policy of specscope llamacpp: each domain's flags and GGUF files "
        "exactly as llama-server was timed with them (the model-free lookups ngram-simple, "
        "ngram-map-k, ngram-map-k4v, ngram-mod and ngram-cache included; ngram-mod keeps its "
        "n-gram pool across the requests of one server)",
    ),
    drafters=("draft-model", "ngram", "llama-ngram-simple"),
)

# common/ngram-map.cpp common_ngram_simple_draft (commit 0c1e57098): the pattern is the last N
# tokens (the sampled one included); the search runs backwards from cur_len - N - 1 down to 1 and
# stops at the first hit (the latest occurrence; position 0 never matches); the draft is the
# min(M, tokens after it) tokens that follow, none if that is < N or if cur_len <= N + M + 1;
# common/speculative.cpp: its draft length is M (common_speculative_n_max), --spec-draft-n-max
# does not apply
NGRAM_APPROXIMATION = (
    "llama.cpp's ngram-simple is not vLLM's ngram rule: it matches one n-gram size N "
    "(--spec-ngram-simple-size-n, exported as prompt_lookup_min) rather than the longest of "
    "prompt_lookup_min..prompt_lookup_max, takes the latest earlier occurrence rather than the "
    "earliest, and drafts nothing while the context has at most N + M + 1 tokens or fewer than "
    "N tokens follow the match; " + MEASURED_NGRAM
)
# a lookup drafter's parameter exported as --spec-ngram-simple-size-n
NGRAM_N = {"ngram": "prompt_lookup_min", "llama-ngram-simple": "ngram_size"}
MISSING = {
    "early-exit": "llama.cpp has no early-exit drafter: its --spec-type values are draft "
    "models (draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark) and n-gram "
    "lookups; export this domain to transformers (assistant_early_exit), or tune it with the "
    "draft model or ngram",
}

VERSIONS = (B11312,)
EXPORTS = (
    "per domain: llama-server flags (`--spec-type draft-simple`, `--spec-draft-model`, "
    "`--spec-draft-n-max` K, `--spec-draft-n-min` 0, `--spec-draft-p-min` 0, `--poll` 0) "
    "and a router-mode presets file (`--models-preset`), one section per domain; from a "
    "`specscope llamacpp` policy, exactly the setting timed per domain (threads, "
    "polling, batch sizes, GGUF; model-free lookups `ngram-simple`, `ngram-map-k`, "
    "`ngram-map-k4v`, `ngram-mod` and `ngram-cache` with their sizes); ngram domains: `--spec-type ngram-simple`, "
    "`--spec-ngram-simple-size-n` prompt_lookup_min, `--spec-ngram-simple-size-m` K, "
    "**approximated** (llama.cpp's rule is not vLLM's); llama-ngram-simple domains: the same "
    "flags with `--spec-ngram-simple-size-n` ngram_size, exact (the rule measured)"
)
REFUSES = (
    "trees with branches (llama.cpp drafts a chain); per-request settings (compiled out "
    "of llama-server, so not exported); ngram domains whose K < prompt_lookup_min (never "
    "drafts); early-exit domains (llama.cpp has no early-exit drafter)"
)


# short names in a measured setting's flags -> the long names presets take (common/arg.cpp)
LONG_NAMES = {
    "-t": "--threads",
    "-tb": "--threads-batch",
    "-b": "--batch-size",
    "-ub": "--ubatch-size",
    "-c": "--ctx-size",
    "-np": "--parallel",
    "-ngl": "--n-gpu-layers",
    "-md": "--spec-draft-model",
    "-td": "--spec-draft-threads",
    "-tbd": "--spec-draft-threads-batch",
}


def _typed(name: str, text: str):
    """A flag's value as the field's type (an unknown flag stays text: validation names it)."""
    field = B11312.field_names.get(name)
    kind = field.kind if field is not None and field.kind in (int, float) else None
    try:
        return kind(text) if kind else text
    except ValueError:
        return text


def _measured_flags(domain: DomainPlan, entry: dict, options: ExportOptions) -> dict:
    """The exact flags of the setting llama-server was timed with for the domain (its policy
    file's ``llama_server`` entry), with the models; the tree must be the chain measured (a
    model-free lookup's entry: no tree)."""
    where = f"domain {domain.domain!r}"
    spec_type = entry.get("spec_type", "draft-simple" if entry.get("k") else "none")
    if spec_type not in ("none", "draft-simple"):  # a model-free lookup timed in llama-server
        if domain.shape is not None:
            raise ExportError(
                f"{where}: the policy's llama_server setting is llama.cpp's {spec_type} lookup, "
                "which drafts without a tree, but the policy gives this domain a tree; re-run "
                "specscope llamacpp"
            )
        return _measured(entry, 0)
    k = (
        0
        if domain.shape is None
        else chain_length(
            domain.shape, "llama.cpp", where, "tune chains only (specscope tune --max-rank 1)"
        )
    )
    if k and domain.drafter.kind != "draft-model":
        raise ExportError(
            f"{where}: the policy's llama_server setting was measured with the draft model, "
            f"but the policy gives this domain the {domain.drafter.label} drafter; re-run "
            "specscope llamacpp, or drop its llama_server entry"
        )
    if entry.get("k") != k:
        raise ExportError(
            f"{where}: the policy's chain has K = {k} but its llama_server setting "
            f"was measured with K = {entry.get('k')}; re-run specscope llamacpp"
        )
    return _measured(entry, k)


def _measured(entry: dict, k: int) -> dict:
    # the GGUF files measured (a quantisation the grid made may differ from --target's)
    flags: dict = {"--model": str(local_path(entry["target_gguf"]))}  # this machine's cache
    if k:
        flags["--spec-draft-model"] = str(local_path(entry["draft_gguf"]))
    args = entry["flags"]
    for name, value in zip(args[::2], args[1::2]):
        name = LONG_NAMES.get(name, name)
        flags[name] = _typed(name, value)
    return flags


def _flags(
    domain: DomainPlan, options: ExportOptions, poll: int | None, measured: dict | None = None
) -> dict:
    if measured is not None:
        return _measured_flags(domain, measured, options)
    flags: dict = {"--model": need(options.target, "--target", "llama.cpp", "the target GGUF file")}
    if domain.shape is None:
        return flags  # no --spec-type: llama-server decodes plainly (type defaults to none)
    k = chain_length(
        domain.shape,
        "llama.cpp",
        f"domain {domain.domain!r}",
        "tune chains only (specscope tune --max-rank 1)",
    )
    if not domain.drafter.has_distribution:  # a lookup: no draft model, nothing to poll for
        flags.update(
            {
                "--spec-type": "ngram-simple",
                "--spec-ngram-simple-size-n": domain.drafter.params[NGRAM_N[domain.drafter.kind]],
                "--spec-ngram-simple-size-m": k,
            }
        )
        return flags
    flags.update(
        {
            "--spec-type": "draft-simple",
            "--spec-draft-model": need(
                options.draft, "--draft", "llama.cpp", "the draft GGUF file"
            ),
            "--spec-draft-n-max": k,
            "--spec-draft-n-min": 0,
            # p_min 0: always draft n_max tokens, as the tuned chain assumes (llama.cpp
            # stops drafting when the draft's top probability falls below p_min)
            "--spec-draft-p-min": 0.0,
        }
    )
    if poll is not None:
        # two models on the same cores: with busy-waiting threads (llama.cpp's default) the idle
        # model's threads take the cores from the working one
        flags.update({"--poll": poll, "--spec-draft-poll": min(poll, 1)})
    return flags


def _value(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def server_args(flags: dict) -> list[str]:
    return [x for name, value in flags.items() for x in (name, _value(value))]


def presets_ini(sections: Mapping[str, Mapping[str, object]], header: Sequence[str] = ()) -> str:
    """llama-server's router-mode presets file (``--models-preset FILE``): ``header`` as comment
    lines, then one ``[name]`` section per preset whose keys are flag names without dashes
    (common/preset.cpp maps ``spec-draft-n-max`` to ``--spec-draft-n-max``, and reads short forms
    such as ``t`` or ``md`` too)."""
    lines = [*(f"; {line}" for line in header), ""]
    for name, flags in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{str(flag).lstrip('-')} = {_value(value)}" for flag, value in flags.items()]
        lines.append("")
    return "\n".join(lines)


def export(plan: DeploymentPlan, options: ExportOptions, version: EngineVersion) -> dict:
    domains, sections, approximated = {}, {}, []
    server = plan.llama_server or {}
    for domain in plan.domains:
        check_drafter(domain, version, VERSIONS, MISSING)
        measured = (
            server.get("domains", {}).get(domain.domain)
            if domain.source == "policy"
            else server.get("fallback")
        )
        flags = version.validate(
            _flags(domain, options, options.poll, measured), f"domain {domain.domain!r}"
        )
        sections[domain.domain] = flags
        if domain.drafter.kind == "ngram" and domain.shape is not None:
            approximated.append(domain.domain)  # vLLM's rule measured, llama.cpp's exported
        domains[domain.domain] = {
            **domain.summary,
            "approximated": domain.domain in approximated,
            "model": domain.domain,
            "flags": flags,
            "server_args": ["llama-server", *server_args(flags)],
        }
    header = (
        f"specscope export for llama-server router mode ({version.engine} {version.version})",
        f"policy: {' '.join((plan.policy_source or '-').splitlines())}",
        'start: llama-server --models-preset THIS_FILE; a request\'s "model" names its domain',
    )
    return {
        "deployment": "llama-server router mode: one preset per domain over the same target "
        "GGUF; the client (or specscope's router) sets each request's \"model\" "
        "to its domain; pass no speculation flags on the router's command line "
        "(they override every preset)",
        "approximation": (
            f"{', '.join(approximated)}: {NGRAM_APPROXIMATION}" if approximated else None
        ),
        "router_args": ["llama-server", "--models-preset", options.presets_file],
        "presets_ini": presets_ini(sections, header),
        "domains": domains,
    }
