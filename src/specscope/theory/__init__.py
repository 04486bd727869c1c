"""Acceptance criteria and their exact KL certificates (docs/theory.md).

Let p be the target distribution at a context, x0 = argmax p (the first index among maxima) and q
the draft distribution; the draft proposes argmax q. Every criterion here accepts a token x iff
x lies in an upper level set of p, so its rejection region R(p) is a lower level set. The
certificate of a criterion is

    C(p) = min { KL(p || q) : some maximiser of q lies in R(p) },

so that KL(p || q) < C(p) implies that every maximiser of q, and so argmax q, is accepted,
whatever q is. Ties are resolved against acceptance everywhere: a drafter with several maximisers
counts as proposing the worst of them (this makes the minimum attained), strict greedy accepts
only the first maximiser of p, and top-m keeps exactly m tokens (the first m in a stable
descending sort of p). KL is KL(target || draft) in nats.

The minimum has a closed form by pooling: the best rejected token is the most likely one, y = x_(r)
(sorted position r); the minimiser q* sets y and the top tokens whose mass exceeds the pooled mean
to that common mean and leaves q* = p elsewhere. The tree certificate C_m (is x0 among the drafter's
top-m candidates?) pools x0 with the weakest of its m strongest rivals; C_m <= log(m + 1).

Everything is vectorised over a batch of contexts: p is [B, V] (or [V]); the work is O(V) per row
plus a top-k over the few sorted positions the pooling needs. Inputs may be numpy arrays or torch
tensors (any device); arithmetic is float64.

The ``certify`` section at the end turns recorded runs into the report of ``specscope certify``.
"""

from .certificates import accepted_mask, accepts, certificate, tree_covered, worst_case_drafter
from .columns import (
    CriteriaConfig,
    CriteriaError,
    certificate_columns,
    criteria_config_from_manifest,
    node_certificate_columns,
    step_criteria_columns,
)
from .criteria import (
    CRITERIA,
    Additive,
    Criterion,
    Entropy,
    Greedy,
    Multiplicative,
    TopM,
    TreeCoverage,
    kl_divergence,
    margin_bound,
    perspective,
)

__all__ = [
    "CRITERIA",
    "Additive",
    "CriteriaConfig",
    "CriteriaError",
    "Criterion",
    "Entropy",
    "Greedy",
    "Multiplicative",
    "TopM",
    "TreeCoverage",
    "accepted_mask",
    "accepts",
    "certificate",
    "certificate_columns",
    "criteria_config_from_manifest",
    "kl_divergence",
    "margin_bound",
    "node_certificate_columns",
    "perspective",
    "step_criteria_columns",
    "tree_covered",
    "worst_case_drafter",
]
