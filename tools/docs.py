"""Writes the parts of docs/ that come from the code: the Ascend support table of docs/ascend.md, from
``ms_swiglu.backends.ascend_support``. ``python -m ms_swiglu.tools.docs`` rewrites them in place;
``--check`` exits 1 where a document differs from what it would write."""
import argparse
import os
import sys

from ms_swiglu.backends import ascend_support

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- support table:", "<!-- end of support table -->"


def ascend_doc(text):
    """docs/ascend.md's text with the support table between its markers written anew."""
    head, _, rest = text.partition(BEGIN)
    marker, _, rest = rest.partition("\n")
    _, _, tail = rest.partition(END)
    return "\n".join([head + BEGIN + marker, *ascend_support.table(), END + tail])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare only")
    args = p.parse_args(argv)
    path = os.path.join(ROOT, "docs", "ascend.md")
    with open(path) as f:
        text = f.read()
    new = ascend_doc(text)
    if args.check:
        return int(new != text)
    with open(path, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
