"""The drafter options of the commands that speculate (``run``, ``decode``, ``bench``; declared in
:mod:`specscope.cli.options`): ``--drafter``, ``--prompt-lookup-min``/``--prompt-lookup-max`` and
``--ngram-size`` and ``--exit-layer``, turned into a validated :class:`~specscope.drafters.DrafterConfig` before any
model loads."""

from __future__ import annotations

from ..drafters import DrafterConfig


def drafter_config(
    kind: str | None,
    prompt_lookup_min: int | None,
    prompt_lookup_max: int | None,
    ngram_size: int | None,
    exit_layer: int | None,
    base: DrafterConfig | None = None,
) -> DrafterConfig | None:
    """The drafter the options ask for, or None when none is given. ``--drafter`` starts a drafter
    afresh; parameters alone change ``base``'s (a config's or a run's drafter). A parameter of
    another drafter is a :class:`~specscope.drafters.DrafterError` naming it."""
    given = {
        name: value
        for name, value in dict(
            prompt_lookup_min=prompt_lookup_min,
            prompt_lookup_max=prompt_lookup_max,
            ngram_size=ngram_size,
            exit_layer=exit_layer,
        ).items()
        if value is not None
    }
    if kind is None and not given:
        return None
    if kind is None:
        start = base or DrafterConfig()
        return DrafterConfig(**{**start.__dict__, **given})
    return DrafterConfig(kind, **given)
