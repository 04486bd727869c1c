"""transformers: per domain, the values to set on the drafting model's ``generation_config`` and the
``generate()`` arguments for assisted generation, with the snippet that applies them.

Draft model: transformers reads the assisted-generation settings from the assistant's own
generation config (``AssistedCandidateGenerator.__init__`` deep-copies
``assistant_model.generation_config``); ``num_assistant_tokens``, ``num_assistant_tokens_schedule``
and ``assistant_confidence_threshold`` passed to ``generate()`` are ignored (transformers issue
#40739), so the export sets them on the assistant. Schedule ``constant`` keeps K fixed
(``heuristic`` grows and shrinks it), and threshold 0 drafts all K tokens, as the tuned chain
assumes.

Early exit: ``generate(assistant_early_exit=E)`` makes ``EarlyExitCandidateGenerator``, an
assisted generator whose assistant is the model itself run through its first E layers; the same
three values therefore go on the model's own ``generation_config``.

ngram: ``generate(prompt_lookup_num_tokens=K, max_matching_ngram_size=prompt_lookup_max)``
(``PromptLookupCandidateGenerator``), the rule specscope measured except that transformers has no
minimum match length: where ``prompt_lookup_min > 1`` the export says it approximates.

Every drafter drafts a chain here: trees are refused. Nothing here loads a model.
"""

from __future__ import annotations

from .export_plan import (
    MEASURED_NGRAM,
    DeploymentPlan,
    DomainPlan,
    ExportOptions,
    chain_length,
    need,
)
from .export_rules import EngineVersion, Field

TRANSFORMERS = "huggingface/transformers"

# src/transformers/generation/configuration_utils.py@v5.23.0: GenerationConfig.__init__ pops
# prompt_lookup_num_tokens, max_matching_ngram_size and assistant_early_exit (None by default);
# utils.py _get_candidate_generator: assistant_early_exit -> EarlyExitCandidateGenerator(
# assistant_model=self), else prompt_lookup_num_tokens -> PromptLookupCandidateGenerator(
# num_output_tokens=prompt_lookup_num_tokens, max_matching_ngram_size=... or 2)
V5_23_0 = EngineVersion(
    engine="transformers",
    version="5.23.0",
    about="the release; specscope's tests run its assisted generation",
    checked_against=(
        f"{TRANSFORMERS}:src/transformers/generation/candidate_generator.py@v5.23.0",
        f"{TRANSFORMERS}:src/transformers/generation/configuration_utils.py@v5.23.0",
        f"{TRANSFORMERS}:src/transformers/generation/utils.py@v5.23.0",
    ),
    fields=(
        Field("num_assistant_tokens", int, low=1),
        Field(
            "num_assistant_tokens_schedule",
            str,
            choices=("constant", "heuristic", "heuristic_transient"),
        ),
        Field("assistant_confidence_threshold", float, low=0.0, high=1.0),
        # PromptLookupCandidateGenerator.__init__: "Invalid max_matching_ngram_size or
        # num_output_tokens" unless both > 0
        Field("prompt_lookup_num_tokens", int, low=1),
        Field("max_matching_ngram_size", int, low=1),
        Field("assistant_early_exit", int, low=1),
    ),
    forbid_extra=False,  # GenerationConfig keeps unknown attributes (and ignores them)
    notes=(
        "draft-model domains: set on assistant_model.generation_config, not passed to "
        "generate(): generate() keyword arguments are ignored for these (transformers #40739)",
        "early-exit domains: the model is its own assistant (EarlyExitCandidateGenerator), so "
        "the same values go on model.generation_config and assistant_early_exit to generate(); "
        "it computes the draft specscope measured (the hidden state after layer E, the final "
        "norm, the LM head)",
        "ngram domains: prompt lookup takes the longest match of max_matching_ngram_size tokens "
        "or fewer and its earliest occurrence with a continuation, as vLLM's rule does, and "
        "cuts the draft at the first EOS token",
    ),
    drafters=("draft-model", "ngram", "early-exit"),
)

VERSIONS = (V5_23_0,)
EXPORTS = (
    "per domain: `assistant_model.generation_config` values `num_assistant_tokens` K, "
    "`num_assistant_tokens_schedule` constant, `assistant_confidence_threshold` 0, and the "
    "snippet that sets them; early-exit domains: the same values on the model's own "
    "`generation_config` and `generate(assistant_early_exit=E)`; ngram domains: "
    "`generate(prompt_lookup_num_tokens=K, max_matching_ngram_size=prompt_lookup_max)` "
    "(**approximated** when prompt_lookup_min > 1: no minimum match length)"
)
REFUSES = "trees with branches (every drafter here drafts a chain)"

# candidate_generator.py PromptLookupCandidateGenerator.get_candidates: ngram_size runs from
# min(max_matching_ngram_size, input_length - 1) down to 1, and the first (leftmost) match with a
# continuation wins
NGRAM_APPROXIMATION = (
    "transformers' prompt lookup has no minimum match length: it tries max_matching_ngram_size "
    "down to 1 token, so where vLLM's rule drafts nothing (no match of prompt_lookup_min "
    "tokens) it drafts from a shorter match; " + MEASURED_NGRAM
)


def snippet(settings: dict, kwargs: dict, drafter: str | None = None) -> str:
    """Python that applies ``settings`` to the drafting model (``assistant``; ``model`` for an
    early exit; None: no model drafts) and generates with ``kwargs``."""
    if not settings and not kwargs:
        return "outputs = model.generate(**inputs)  # no assistant: plain decoding"
    lines = [f"{drafter}.generation_config.{k} = {v!r}" for k, v in settings.items()]
    arguments = ["**inputs"]
    if drafter == "assistant":
        arguments.append("assistant_model=assistant")
    arguments += [f"{k}={v!r}" for k, v in kwargs.items()]
    return "\n".join([*lines, f"outputs = model.generate({', '.join(arguments)})"])


def _assisted(k: int) -> dict:
    return {
        "num_assistant_tokens": k,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }


def _domain(domain: DomainPlan, k: int, options: ExportOptions, version: EngineVersion) -> dict:
    """The assistant, its generation_config values, generate()'s arguments, the snippet."""
    kind, where = domain.drafter.kind, f"domain {domain.domain!r}"
    if kind == "ngram":
        kwargs = {
            "prompt_lookup_num_tokens": k,
            "max_matching_ngram_size": domain.drafter.params["prompt_lookup_max"],
        }
        version.validate(kwargs, where)
        return {
            "assistant_model": None,
            "assistant_generation_config": {},
            "generate_kwargs": kwargs,
            "snippet": snippet({}, kwargs),
        }
    settings = version.validate(_assisted(k), where)
    if kind == "early-exit":
        kwargs = version.validate({"assistant_early_exit": domain.drafter.exit_layer}, where)
        return {
            "assistant_model": None,  # the model itself
            "assistant_generation_config": settings,
            "generate_kwargs": kwargs,
            "snippet": snippet(settings, kwargs, drafter="model"),
        }
    return {
        "assistant_model": need(
            options.draft,
            "--draft",
            "transformers",
            "the assistant model (a local path or a hub id)",
        ),
        "assistant_generation_config": settings,
        "generate_kwargs": {},
        "snippet": snippet(settings, {}, drafter="assistant"),
    }


def export(plan: DeploymentPlan, options: ExportOptions, version: EngineVersion) -> dict:
    domains, approximated = {}, []
    for domain in plan.domains:
        entry = domain.summary
        if domain.shape is None:
            domains[domain.domain] = {
                **entry,
                "assistant_model": None,
                "assistant_generation_config": {},
                "generate_kwargs": {},
                "snippet": snippet({}, {}),
            }
            continue
        k = chain_length(
            domain.shape,
            "transformers",
            f"domain {domain.domain!r}",
            "tune chains only (specscope tune --max-rank 1)",
        )
        inexact = domain.drafter.kind == "ngram" and domain.drafter.params["prompt_lookup_min"] > 1
        if inexact:
            approximated.append(domain.domain)
        domains[domain.domain] = {
            **entry,
            "approximated": inexact,
            **_domain(domain, k, options, version),
        }
    return {
        "deployment": "in the application: pick the domain of each prompt with the routing "
        "rule and apply that domain's generation_config values and generate() arguments",
        "approximation": (
            f"{', '.join(approximated)}: {NGRAM_APPROXIMATION}" if approximated else None
        ),
        "domains": domains,
    }
