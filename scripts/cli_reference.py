"""Write the command line's reference pages from the command line itself.

    python scripts/cli_reference.py          # write docs/reference/cli.md, options.md, input-files.md
    python scripts/cli_reference.py --check  # exit 1 if either differs from what it would write

The pages are made by :mod:`specscope.cli.reference`; tests/test_cli_options.py checks that the
committed pages are current.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specscope.cli.reference import commands_markdown, options_markdown
from specscope.input_files import input_files_markdown

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference"
PAGES = {
    "cli.md": commands_markdown,
    "options.md": options_markdown,
    "input-files.md": input_files_markdown,
}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, make in PAGES.items():
        path, text = REFERENCE / name, make()
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.write_text(text)
        print(f"wrote {path}")
    for path in stale:
        print(f"{path} is not current: run python scripts/cli_reference.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
