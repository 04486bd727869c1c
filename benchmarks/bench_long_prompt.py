"""A prompt far longer than the truncation keeps: rendered as specscope does (the text cut before
tokenising, :func:`specscope.prompts.render.render_prompt`) against tokenising the whole text and
keeping its last tokens (as before), each in a child process of its own, side by side: seconds,
peak memory and whether the two give the same ids.

    python benchmarks/bench_long_prompt.py --megabytes 10 --max-tokens 512

Uses the byte-level tokenizer of the tests (one token per byte, the worst case for the whole
text); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, sys, time
from specscope.models.tiny import byte_tokenizer
from specscope.prompts.render import render_prompt
megabytes, max_tokens, how = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
words = "the quick brown fox jumps over 12345 lazy dogs; "
size = int(megabytes * 1e6)
text = (words * (size // len(words) + 1))[:size]
tok = byte_tokenizer()
start = time.perf_counter()
if how == "cut":
    ids = render_prompt(tok, [{"role": "user", "content": text}], "raw", max_tokens).ids
else:
    ids = tok(text, add_special_tokens=True)["input_ids"][-max_tokens:]
print(json.dumps({"s": time.perf_counter() - start, "ids": ids}))
"""


def measure(how: str, megabytes: float, max_tokens: int) -> dict:
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(megabytes), str(max_tokens), how], stdout=out
        )
        _, status, usage = os.wait4(child.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"the {how} child failed")
        out.seek(0)
        result = json.loads(out.read())
    return {**result, "peak_gb": usage.ru_maxrss / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=512)
    args = parser.parse_args()
    cut = measure("cut", args.megabytes, args.max_tokens)
    whole = measure("whole", args.megabytes, args.max_tokens)
    print(f"{args.megabytes:g} MB prompt, last {args.max_tokens} tokens")
    print(f"{'':14s}{'seconds':>10s}{'peak GB':>10s}")
    for name, r in (("cut first", cut), ("whole text", whole)):
        print(f"{name:14s}{r['s']:10.3f}{r['peak_gb']:10.2f}")
    print(
        f"whole / cut: {whole['s'] / cut['s']:.0f}x the time, "
        f"{whole['peak_gb'] / cut['peak_gb']:.1f}x the memory; "
        f"same ids: {cut['ids'] == whole['ids']}"
    )


if __name__ == "__main__":
    main()
