#!/usr/bin/env bash
# Render specscope's HTML report in headless Chromium: it must load offline, show its plots (every
# <img> decoded by the browser, with a natural width, and visible in a screenshot), and contain
# every table. Its first screen, at a fixed 1280x800 viewport, must hold the claims' forest plot and
# tokens per step by domain (decoded, inside the first 800 px) and no table; it is saved as
# OUT_DIR/first-screen.png (docs/img/report-first-screen.png is that of the synthetic run below,
# reduced to 256 colours). Usage: scripts/check_report_chromium.sh [RUN_DIR] [OUT_DIR]
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
  "$python" -c "from lab.synthetic import write_synthetic_run as w; w('$run', prompts_per_domain=12, steps=(16, 64))"
fi

browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [[ -z "$browser" ]]; then
  echo "chromium not found: install it (apt-get install -y chromium)" >&2
  exit 3
fi

"$python" -m specscope.cli report "$run" --out "$out/report.html" --boot 200
# A copy of the page with a script that, once the page has loaded, records what the browser made of
# each image (decoded, natural size, where it lies) and where each table lies, with the viewport:
# the report itself has no script.
"$python" - "$out" <<'PY'
import sys
from pathlib import Path

out = Path(sys.argv[1])
probe = """<script>window.addEventListener("load", () => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.top, r.bottom, r.width, r.height]; };
  const pre = document.createElement("pre");
  pre.id = "img-check";
  pre.textContent = JSON.stringify({
    viewport: [window.innerWidth, window.innerHeight],
    images: [...document.images].map(i => ({
      figure: i.closest("figure") ? i.closest("figure").id : "", alt: i.alt,
      complete: i.complete, width: i.naturalWidth, height: i.naturalHeight, box: box(i)})),
    tables: [...document.querySelectorAll("table")].map(t => ({id: t.id, box: box(t),
      visible: t.checkVisibility(), folded: t.closest("details:not([open])") !== null})),
  });
  document.body.appendChild(pre);
});</script>"""
page = (out / "report.html").read_text()
(out / "report-check.html").write_text(page.replace("</body>", probe + "</body>", 1))
PY
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --hide-scrollbars)
"$browser" "${flags[@]}" --window-size=1400,16000 --screenshot="$out/report.png" \
  "file://$(realpath "$out/report.html")" 2>/dev/null
"$browser" "${flags[@]}" --window-size=1280,800 --screenshot="$out/first-screen.png" \
  "file://$(realpath "$out/report.html")" 2>/dev/null
"$browser" "${flags[@]}" --window-size=1280,800 --virtual-time-budget=10000 --dump-dom \
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
assert images >= 7, f"expected at least 7 embedded plots, found {images}"
check = re.search(r'<pre id="img-check">(.*?)</pre>', dom, re.S)
assert check, "the page did not finish loading in the browser (no image check recorded)"
probe = json.loads(html.unescape(check.group(1)))
decoded = probe["images"]
broken = [i["figure"] for i in decoded if not (i["complete"] and i["width"] > 0 and i["height"] > 0)]
assert len(decoded) == images and not broken, f"images the browser could not draw: {broken}"
assert all(i["alt"] for i in decoded), "an image without alt text"
assert "<script>alert" not in dom, "prompt text is not escaped"

# The first screen is the screenshot's 1280x800. The page's layout depends on the width alone (the
# probe's window may be shorter: headless Chromium can keep room for its toolbar), so the plots must
# end within the first 800 px of a 1280 px wide page.
fold = 800
assert probe["viewport"][0] == 1280, f"viewport {probe['viewport']}, expected 1280 px wide"
by_figure = {i["figure"]: i for i in decoded}
for name in ("r0-plot-claims_forest", "r0-plot-tokens_per_step"):
    assert name in by_figure, f"the first screen's plot {name} is not on the page"
    top, bottom, width, height = by_figure[name]["box"]
    assert width > 0 and height > 0 and 0 <= top and bottom <= fold, (
        f"{name} is not inside the first {fold} px: top {top:.0f}, bottom {bottom:.0f}"
    )
seen = [t["id"] for t in probe["tables"] if t["visible"] and t["box"][0] < fold]
assert not seen, f"tables visible in the first screen: {seen}"
shown = [t["id"] or "(no id)" for t in probe["tables"] if t["visible"] or not t["folded"]]
assert not shown, f"tables shown unfolded (every table belongs in a closed <details>): {shown}"
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
    first = imread(out / "first-screen.png")[..., :3]
    assert first.shape[:2] == (fold, 1280), f"first screen is {first.shape[1]}x{first.shape[0]}"
    # verdicts are grey but for holds (green) and does not hold (red): the claims' lines colour a
    # dozen rows; the two plots' domains and verdicts about 110 (a synthetic run: most inconclusive)
    rows = ((first.max(axis=2) - first.min(axis=2) > 0.2).mean(axis=1) > 0.005).sum()
    assert rows > 80, f"plots not visible in the first screen ({rows} coloured rows)"
sizes = ", ".join(f"{i['width']}x{i['height']}" for i in decoded)
print(f"ok: {len(required)} tables and {images} plots rendered ({sizes}); first screen holds the "
      f"claims and tokens per step, no table; screenshots {out / 'report.png'}, "
      f"{out / 'first-screen.png'}")
PY
