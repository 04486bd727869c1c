"""How long the rule router takes on adversarial 1 MB prompts, against a normal 1 KB prompt.

    python benchmarks/bench_router.py [--repeats 7] [--before REV]

Times, in one process, :meth:`RuleRouter.classify` and the classification the gateway does for a
chat request (``request_text`` of the body, then ``Deployment.route``) on 1 MB prompts built to make
a backtracking regex engine slow (digits, ``a``, ``a_``, ``1/``, ``(``, newlines), on ``a``
followed by ``!`` under a router whose one rule is an export document's ``(a+)+$``, and on a normal
1 KB prompt; then each case's rules alone on the whole text (no prefix cap: RE2 alone). Then the
router as it was at ``--before`` (Python's re; loaded from ``git show REV:...``) and today's, side
by side on a 20 KB digits prompt (before: the review measured 2.6 s). Prints the median
milliseconds of ``--repeats`` runs per case (the "before" column of at most 3, since each takes
seconds).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

from specscope.serving.gateway import Backend, Deployment, request_text, routable_domains
from specscope.tune.router import Rule, RuleRouter

MB = 1 << 20
BEFORE = "7c02340df3ab315f46760e70a07205b3548b35c4"  # the last commit whose router used Python's re
NORMAL = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
    "May. Each clip costs $2. How many dollars did she earn in April and May together? Explain "
    "your reasoning step by step, say which numbers you used, and give the result as your final "
    "answer on its own line. "
) * 4


def adversarial_cases() -> dict[str, tuple[str, RuleRouter]]:
    """case -> (prompt text, router)."""
    built_in = RuleRouter()
    nested = RuleRouter((Rule("code", "(a+)+$", 2.0),), threshold=1.0)
    return {
        "normal 1 KB": (NORMAL[:1024], built_in),
        "digits": ("1" * MB, built_in),
        "a": ("a" * MB, built_in),
        "a_": ("a_" * (MB // 2), built_in),
        "1/": ("1/" * (MB // 2), built_in),
        "(": ("(" * MB, built_in),
        "newlines": ("\n" * MB, built_in),
        "(a+)+$ on a..a!": ("a" * MB + "!", nested),
    }


def median_ms(repeats: int, fn, *args) -> float:
    """The median milliseconds of ``fn(*args)`` over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def gateway_route(plan: Deployment, body: dict) -> str:
    """What the gateway does to pick a request's backend."""
    return plan.route(request_text(body))[0]


def match_each(rules: tuple[Rule, ...], text: str) -> list[bool]:
    return [rule.matches(text) for rule in rules]


def deployment(router: RuleRouter) -> Deployment:
    """A backend per domain the router produces (nothing is sent: only ``route`` is timed)."""
    domains = {d: Backend("http://127.0.0.1:9000", d) for d in routable_domains(router)}
    return Deployment("llama.cpp", domains, domains[router.fallback], router)


def before_router(rev: str) -> RuleRouter | None:
    """The RuleRouter of src/specscope/tune/router.py at ``rev``, or None without git."""
    try:
        source = subprocess.run(
            ["git", "show", f"{rev}:src/specscope/tune/router.py"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"before: git show {rev} failed ({e}); no 'before' column", file=sys.stderr)
        return None
    module = types.ModuleType("specscope.tune._router_before")
    module.__package__ = "specscope.tune"  # its relative imports resolve as they did
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:router.py", "exec"), module.__dict__)
    return module.RuleRouter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--before", default=BEFORE, help="git revision of the Python-re router")
    args = parser.parse_args()

    print(f"{'case':<18} {'chars':>9} {'classify ms':>12} {'gateway ms':>11} {'domain':>9}")
    for name, (text, router) in adversarial_cases().items():
        plan = deployment(router)
        body = {"model": "x", "messages": [{"role": "user", "content": text}]}
        domain = router.classify(text)
        assert gateway_route(plan, body) == domain
        classify = median_ms(args.repeats, router.classify, text)
        gateway = median_ms(args.repeats, gateway_route, plan, body)
        print(f"{name:<18} {len(text):>9,} {classify:>12.3f} {gateway:>11.3f} {domain:>9}")

    print("\nthe rules alone on the whole text (Rule.matches, no prefix cap)")
    for name, (text, router) in adversarial_cases().items():
        whole = median_ms(args.repeats, match_each, router.rules, text)
        print(f"{name:<18} {len(text):>9,} {whole:>12.3f}")

    before = before_router(args.before)
    if before is not None:
        text = "1" * 20_000
        print(f"\n20 KB digits: before ({args.before[:10]}, Python re) vs now (RE2)")
        for label, router in (("before", before), ("now", RuleRouter())):
            ms = median_ms(
                min(args.repeats, 3) if label == "before" else args.repeats, router.classify, text
            )
            print(f"{label:<18} {len(text):>9,} {ms:>12.3f} {'':>11} {router.classify(text):>9}")


if __name__ == "__main__":
    main()
