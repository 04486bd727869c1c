"""Routed per-domain speculation vs the best single llama-server setting, timed in llama-server.

    python benchmarks/bench_gateway.py --policy RUN/llamacpp/policy.json [--per-domain 10]
    python benchmarks/bench_gateway.py --route code=ngram-simple --route math=draft-simple:k=2

One llama-server in router mode serves one preset per setting (plain, K = 1..--max-k drafts of the
demo pair's 0.5B for its 1.5B target, and every routed setting; --poll 0 for both models);
specscope gateway routes each domain to the preset of its setting: a `specscope llamacpp` policy's
exact setting per domain (a model-free lookup included), a `specscope tune` policy's chain of the
draft model as draft-simple with K = its depth, or --route DOMAIN=SETTING (a setting as
`specscope llamacpp --candidate` writes it, or a bare K); unnamed domains decode plainly. Every
held-out prompt (--per-domain of each domain: with --run, the run's held-out prompts as
``specscope llamacpp`` picks them; otherwise from the offline sources, seed --seed) is sent,
interleaved prompt by prompt, through the gateway and to every preset directly, all greedy with
--n-predict tokens. Speed is llama-server's own: generated tokens over ``timings.predicted_ms``
(its C++ loop, no HTTP or Python time).

Prints per domain: the route taken, tok/s routed and of the best single setting (the one setting
fastest over all the traffic), their ratio with a prompt-resampled 95% interval, tokens per step
seen, and how many routed outputs equal the plain preset's. --out writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from specscope.models.demo import demo_gguf
from specscope.prompts.domains import select_prompts
from specscope.serving.gateway import Backend, Deployment, make_app
from specscope.serving.llamacpp.export import presets_ini
from specscope.serving.llamacpp.programs import build_llama_tools
from specscope.serving.llamacpp.server import ServerSetting
from specscope.tune.router import RuleRouter, prompt_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/, in a checkout
from lab.llama_router import GREEDY, LlamaRouter, preset_section  # noqa: E402

DOMAINS = ("code", "math", "reasoning", "chat")


def parse_routes(args, base: ServerSetting) -> dict[str, ServerSetting]:
    """domain -> the llama-server setting it is routed to (plain where none is named)."""
    routes = {d: base.with_k(0) for d in DOMAINS}
    if args.policy:
        from specscope.tune.policy import PolicyFile

        policy = PolicyFile.load(args.policy)
        server = policy.info.get("llama_server")
        for d in DOMAINS:
            if server:  # specscope llamacpp: each domain's timed setting, exactly
                entry = server["domains"].get(d, server["fallback"])
                timed = ServerSetting.from_dict(entry["server_setting"])
                routes[d] = replace(base, **{f: getattr(timed, f) for f in SPEC_FIELDS})
                continue
            drafter, tree = policy.drafter_for(d), policy.tree_for(d)
            if tree is not None and (drafter.kind != "draft-model" or not tree.is_chain):
                sys.exit(
                    f"{args.policy}: domain {d!r} speculates with a {drafter.kind} "
                    f"{'chain' if tree.is_chain else 'tree'}, which llama-server's draft-simple "
                    "does not run; tune for llama-server with specscope llamacpp"
                )
            routes[d] = base.with_k(0 if tree is None else tree.max_depth)
        return routes
    for item in args.route:
        domain, _, text = item.partition("=")
        if domain not in routes or not text:
            sys.exit(
                f"--route {item!r}: give DOMAIN=SETTING with DOMAIN one of {', '.join(DOMAINS)}"
            )
        routes[domain] = (
            base.with_k(int(text)) if text.isdigit() else ServerSetting.parse(text, base)
        )
    return routes


# what a setting speculates with (the rest, threads and polling, is the bench's own)
SPEC_FIELDS = ("k", "p_min", "spec_type", "ngram_size")


def serve_in_thread(asgi):
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


def ratio_interval(
    routed: np.ndarray, single: np.ndarray, n_boot: int = 1000, seed: int = 0
) -> tuple[float, float, float]:
    """tok/s ratio (tokens and seconds summed per arm) with a prompt-resampled 95% interval;
    rows: prompts, columns: (tokens, seconds)."""
    rng = np.random.default_rng(seed)
    point = (routed[:, 0].sum() / routed[:, 1].sum()) / (single[:, 0].sum() / single[:, 1].sum())
    idx = rng.integers(0, len(routed), size=(n_boot, len(routed)))
    boot = (routed[idx, 0].sum(1) / routed[idx, 1].sum(1)) / (
        single[idx, 0].sum(1) / single[idx, 1].sum(1)
    )
    low, high = np.quantile(boot, [0.025, 0.975])
    return float(point), float(low), float(high)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--policy", help="policy file (specscope llamacpp / tune): a setting per domain"
    )
    parser.add_argument(
        "--route", action="append", default=[], help="DOMAIN=SETTING or DOMAIN=K (repeat)"
    )
    parser.add_argument("--per-domain", type=int, default=10)
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--max-k", type=int, default=4, help="single settings: plain and K=1..this")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--run",
        type=Path,
        help="a measurement run: its held-out prompts (its sources, none of its "
        "prompts; what specscope llamacpp sends) instead of a seeded sample",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    base = ServerSetting(threads=args.threads, poll=0, draft_poll=0, ctx=2048)
    routes = parse_routes(args, base)
    # every setting once, by its spec name: plain, K = 1..max_k, and the routed ones
    settings = {s.spec_name: s for s in [base.with_k(k) for k in range(args.max_k + 1)]}
    settings |= {s.spec_name: s for s in routes.values()}

    import httpx

    tools = build_llama_tools()
    target, draft = demo_gguf("target"), demo_gguf("draft")
    if args.run:
        from specscope.records import load_run
        from specscope.serving.llamacpp.study import held_out_prompts

        items = held_out_prompts(load_run(args.run).manifest, args.per_domain)
    else:
        items = select_prompts(list(DOMAINS), args.per_domain, seed=args.seed)
    domain_of = RuleRouter().classify
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    (tmp / "presets.ini").write_text(
        presets_ini({n: preset_section(target, s, draft) for n, s in settings.items()})
    )
    rows = []
    with LlamaRouter(
        tools, tmp / "presets.ini", base, log=tmp / "llama-server.log", models_max=len(settings)
    ) as router:
        plan = Deployment(
            "llama.cpp",
            {d: Backend(router.url, s.spec_name) for d, s in routes.items()},
            Backend(router.url, "plain"),
        )
        server, thread, url = serve_in_thread(make_app(plan, tmp / "gateway.jsonl"))
        body = {"n_predict": args.n_predict, "return_tokens": True, "cache_prompt": False, **GREEDY}
        try:
            for i, item in enumerate(items):
                text = prompt_text(item)
                arms = {"routed": (url, {})} | {n: (router.url, {"model": n}) for n in settings}
                for arm, (base_url, extra) in arms.items():
                    answer = httpx.post(
                        base_url + "/completion",
                        timeout=1800,
                        json={"prompt": text, **body, **extra},
                    ).json()
                    t = answer["timings"]
                    rows.append(
                        {
                            "prompt_id": item.id,
                            "domain": item.domain,
                            "routed_as": domain_of(text),
                            "arm": arm,
                            "tokens": answer["tokens"],
                            "predicted_n": t["predicted_n"],
                            "predicted_ms": t["predicted_ms"],
                            "draft_n": t.get("draft_n", 0),
                            "draft_n_accepted": t.get("draft_n_accepted", 0),
                        }
                    )
                print(f"[{i + 1}/{len(items)}] {item.domain} {item.id}", file=sys.stderr)
        finally:
            server.should_exit = True
            thread.join(10)
    report(rows, {d: r.spec_name for d, r in routes.items()}, args)


def report(rows: list[dict], routes: dict[str, str], args) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows)
    frame["seconds"] = frame["predicted_ms"] / 1e3
    # llama-server's first token comes from the prompt pass: decoding speed counts the rest
    frame["decoded"] = frame["predicted_n"] - 1
    totals = frame.groupby("arm")[["decoded", "seconds"]].sum()
    singles = totals.drop(index="routed")
    best = (singles["decoded"] / singles["seconds"]).idxmax()
    plain = frame[frame["arm"] == "plain"].set_index("prompt_id")["tokens"]
    print(
        f"best single setting over all traffic: {best}; routes: "
        + ", ".join(f"{d}->{n}" for d, n in routes.items())
    )
    print(
        "| domain | route | tok/s routed | tok/s best single | ratio [95% CI] | tokens/step | "
        "outputs = plain |"
    )
    print("|---|---|---|---|---|---|---|")
    out = []
    for domain in DOMAINS:
        sub = frame[frame["domain"] == domain]
        if sub.empty:
            continue
        routed = sub[sub["arm"] == "routed"].set_index("prompt_id")
        single = sub[sub["arm"] == best].set_index("prompt_id").loc[routed.index]
        r = routed[["decoded", "seconds"]].to_numpy(float)
        s = single[["decoded", "seconds"]].to_numpy(float)
        ratio, low, high = ratio_interval(r, s)
        steps = (routed["predicted_n"] - 1 - routed["draft_n_accepted"]).sum()
        tps = (routed["predicted_n"] - 1).sum() / steps if steps else float("nan")
        equal = sum(routed.loc[p, "tokens"] == plain.loc[p] for p in routed.index)
        route = ", ".join(sorted(set(routed["routed_as"].map(routes.__getitem__))))
        line = {
            "domain": domain,
            "route": route,
            "routed_tok_s": r[:, 0].sum() / r[:, 1].sum(),
            "best_single": best,
            "best_tok_s": s[:, 0].sum() / s[:, 1].sum(),
            "ratio": ratio,
            "ratio_low": low,
            "ratio_high": high,
            "tokens_per_step": tps,
            "equal_plain": int(equal),
            "prompts": len(routed),
        }
        out.append(line)
        print(
            f"| {domain} | {route} | {line['routed_tok_s']:.1f} | {line['best_tok_s']:.1f} | "
            f"{ratio:.2f} [{low:.2f}, {high:.2f}] | {tps:.2f} | {equal}/{len(routed)} |"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "routes": routes,
                    "best_single": best,
                    "rows": out,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
