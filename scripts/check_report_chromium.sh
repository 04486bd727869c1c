#!/usr/bin/env bash
# Render specscope's HTML report in headless Chromium: it must load offline, show its plots (every
# <img> decoded by the browser, with a natural width, and visible in a screenshot), and contain
# every table. Usage: scripts/check_report_chromium.sh [RUN_DIR] [OUT_DIR]
# Without RUN_DIR a small synthetic run is written first. Needs chromium (Debian: apt-get install
# -y chromium) and the [plot] extra; $PYTHON (default: python) runs specscope. Exits non-zero on
# any failed check.
set -euo pipefail
python="${PYTHON:-python}"

out="${2:-$(mktemp -d)}"
mkdir -p "$out"
run="${1:-}"
if [[ -z "$run" ]]; then
  run="$out/run"
  "$python" -c "from specscope.analysis.synthetic import write_synthetic_run as w; w('$run', prompts_per_domain=12, steps=(16, 64))"
fi

browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [[ -z "$browser" ]]; then
  echo "chromium not found: install it (apt-get install -y chromium)" >&2
  exit 3
fi

"$python" -m specscope.cli report "$run" --out "$out/report.html" --boot 200
# A copy of the page with a script that, once the page has loaded, records what the browser made of
# each image: the report itself has no script.
"$python" - "$out" <<'PY'
import sys
from pathlib import Path

out = Path(sys.argv[1])
probe = """<script>window.addEventListener("load", () => {
  const imgs = [...document.images];
  const pre = document.createElement("pre");
  pre.id = "img-check";
  pre.textContent = JSON.stringify(imgs.map(i => [i.complete, i.naturalWidth, i.naturalHeight]));
  document.body.appendChild(pre);
});</script>"""
page = (out / "report.html").read_text()
(out / "report-check.html").write_text(page.replace("</body>", probe + "</body>", 1))
PY
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --hide-scrollbars)
"$browser" "${flags[@]}" --window-size=1400,16000 --screenshot="$out/report.png" \
  "file://$(realpath "$out/report.html")" 2>/dev/null
"$browser" "${flags[@]}" --virtual-time-budget=10000 --dump-dom \
  "file://$(realpath "$out/report-check.html")" 2>/dev/null > "$out/dom.html"

"$python" - "$out" <<'PY'
import html
import json
import re
import sys
from pathlib import Path

out = Path(sys.argv[1])
dom = (out / "dom.html").read_text()
required = [f"r0-{k}" for k in ("findings", "table1", "table2", "table3", "table4", "table5",
                                "table6", "tau", "acceptance_vector", "echo", "greedy_table1")]
missing = [k for k in required if f'id="{k}"' not in dom]
images = dom.count('src="data:image/png;base64,')
assert not missing, f"tables missing from the rendered page: {missing}"
assert images >= 5, f"expected 5 embedded plots, found {images}"
check = re.search(r'<pre id="img-check">(.*?)</pre>', dom, re.S)
assert check, "the page did not finish loading in the browser (no image check recorded)"
decoded = json.loads(html.unescape(check.group(1)))
broken = [i for i, (complete, w, h) in enumerate(decoded) if not (complete and w > 0 and h > 0)]
assert len(decoded) == images and not broken, f"images the browser could not draw: {broken}"
assert "<script>alert" not in dom, "prompt text is not escaped"
png = (out / "report.png").read_bytes()
assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000, "screenshot missing or blank"
try:
    from matplotlib.image import imread
except ImportError:
    imread = None
if imread is not None:  # plots are the only large coloured areas of the page
    pixels = imread(out / "report.png")[..., :3]
    coloured = (pixels.max(axis=2) - pixels.min(axis=2) > 0.2).mean(axis=1) > 0.05
    assert pixels.std() > 0.05, "screenshot looks blank"
    assert coloured.sum() > 500, f"plots not visible in the screenshot ({coloured.sum()} rows)"
sizes = ", ".join(f"{w}x{h}" for _, w, h in decoded)
print(f"ok: {len(required)} tables and {images} plots rendered ({sizes}); "
      f"screenshot {out / 'report.png'}")
PY
