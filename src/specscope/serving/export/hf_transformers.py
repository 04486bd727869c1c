"""transformers: the values to set on the assistant model's ``generation_config`` for assisted
generation, with the snippet that sets them.

transformers reads the assisted-generation settings from the assistant's own generation config
(``AssistedCandidateGenerator.__init__`` deep-copies ``assistant_model.generation_config``);
``num_assistant_tokens``, ``num_assistant_tokens_schedule`` and ``assistant_confidence_threshold``
passed to ``generate()`` are ignored (transformers issue #40739), so the export sets them on the
assistant. Schedule ``constant`` keeps K fixed (``heuristic`` grows and shrinks it), and threshold 0
drafts all K tokens, as the tuned chain assumes. The assistant drafts a chain: trees are refused.
Nothing here loads a model.
"""

from __future__ import annotations

from .plan import DeploymentPlan, ExportOptions, chain_length, need
from .rules import EngineVersion, Field

TRANSFORMERS = "huggingface/transformers"

V5_23_0 = EngineVersion(
    engine="transformers",
    version="5.23.0",
    about="the release; specscope's tests run its assisted generation",
    checked_against=(
        f"{TRANSFORMERS}:src/transformers/generation/candidate_generator.py@v5.23.0",
        f"{TRANSFORMERS}:src/transformers/generation/configuration_utils.py@v5.23.0",
    ),
    fields=(
        Field("num_assistant_tokens", int, low=1, required=True),
        Field(
            "num_assistant_tokens_schedule",
            str,
            choices=("constant", "heuristic", "heuristic_transient"),
            required=True,
        ),
        Field("assistant_confidence_threshold", float, low=0.0, high=1.0, required=True),
    ),
    forbid_extra=False,  # GenerationConfig keeps unknown attributes (and ignores them)
    notes=(
        "set on assistant_model.generation_config, not passed to generate(): generate() "
        "keyword arguments are ignored for these (transformers #40739)",
    ),
)

VERSIONS = (V5_23_0,)
EXPORTS = (
    "per domain: `assistant_model.generation_config` values `num_assistant_tokens` K, "
    "`num_assistant_tokens_schedule` constant, `assistant_confidence_threshold` 0, and the "
    "snippet that sets them"
)
REFUSES = "trees with branches (the assistant drafts a chain)"


def snippet(settings: dict) -> str:
    """Python that applies ``settings`` to an assistant and generates with it."""
    if not settings:
        return "outputs = model.generate(**inputs)  # no assistant: plain decoding"
    lines = [f"assistant.generation_config.{k} = {v!r}" for k, v in settings.items()]
    return "\n".join([*lines, "outputs = model.generate(**inputs, assistant_model=assistant)"])


def export(plan: DeploymentPlan, options: ExportOptions, version: EngineVersion) -> dict:
    domains = {}
    for domain in plan.domains:
        entry = {"tree": domain.tree, "source": domain.source}
        if domain.shape is None:
            domains[domain.domain] = {
                **entry,
                "assistant_model": None,
                "assistant_generation_config": {},
                "snippet": snippet({}),
            }
            continue
        k = chain_length(
            domain.shape,
            "transformers",
            f"domain {domain.domain!r}",
            "tune chains only (specscope tune --max-rank 1)",
        )
        settings = version.validate(
            {
                "num_assistant_tokens": k,
                "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0,
            },
            f"domain {domain.domain!r}",
        )
        domains[domain.domain] = {
            **entry,
            "assistant_model": need(
                options.draft,
                "--draft",
                "transformers",
                "the assistant model (a local path or a hub id)",
            ),
            "assistant_generation_config": settings,
            "snippet": snippet(settings),
        }
    return {
        "deployment": "in the application: pick the domain of each prompt with the routing "
        "rule and apply that domain's assistant_generation_config before "
        "generate()",
        "domains": domains,
    }
