#!/usr/bin/env python3
"""The arrows between the parts of the tree, checked on every #include line.

usage: arrows_test.py ROOT TABLE.md     check the tree at ROOT against the table
       arrows_test.py --self-test TABLE.md
                                        check the checker: a tree made here, with arrows
                                        the table allows and ones it does not

TABLE.md (docs/ARCHITECTURE.md) holds the table under its "## Arrows" heading (a file with
no such heading: anywhere in it): one row per part, `| `part/` | may include |
never | why |`, paths in backticks. A row for a subdirectory overrides its parent's for
the files beneath it. Includes of headers outside the tree (no part of that name) are
not checked, nor are includes without a directory (the including file's own).
"""
import os
import re
import sys
import tempfile

SOURCE_EXTS = (".h", ".hpp", ".cc", ".cpp", ".inc", ".def")
# Top-level directories that are no part of the layering: tests include what they test,
# and the rest holds no C++ of the product.
EXEMPT = {"tests", "build", "deploy", "examples", "cmake", "docs"}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
CELL_PATH = re.compile(r"`([^`]+)`")


class TableError(Exception):
    pass


def read_table(path):
    """{part: (allowed prefixes, never prefixes)}, parts as 'compiler/driver/'."""
    rows = {}
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    # Only the Arrows section's table: the document has other tables.
    if "## Arrows" in lines:
        start = lines.index("## Arrows")
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    else:
        start, end = 0, len(lines)
    for n, line in enumerate(lines[start:end], start + 1):
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3:
            raise TableError(f"{path}:{n}: a row needs part, may include and never")
        part = CELL_PATH.findall(cells[0])
        if len(part) != 1 or not part[0].endswith("/"):
            raise TableError(f"{path}:{n}: the first cell names one part, as `dir/`")
        allowed = CELL_PATH.findall(cells[1])
        never = CELL_PATH.findall(cells[2])
        both = set(allowed) & set(never)
        if both:
            raise TableError(f"{path}:{n}: {part[0]} both may and may never include {sorted(both)}")
        if part[0] in rows:
            raise TableError(f"{path}:{n}: {part[0]} has two rows")
        rows[part[0]] = (allowed, never)
    if not rows:
        raise TableError(f"{path}: no rows (lines starting with \"| `\")")
    return rows


def top(path):
    return path.split("/", 1)[0]


def row_for(rows, rel):
    """The most specific row whose part holds `rel` (a path relative to the root)."""
    best = None
    for part in rows:
        if rel.startswith(part) and (best is None or len(part) > len(best)):
            best = part
    return best


def check(root, rows):
    """The problems found: a list of messages, empty when the tree keeps to the table."""
    problems = []
    parts = {top(p) for p in rows}
    for entry in sorted(os.listdir(root)):
        full = os.path.join(root, entry)
        if entry.startswith(".") or entry in EXEMPT or not os.path.isdir(full) or entry in parts:
            continue
        for dirpath, _, files in os.walk(full):
            if any(f.endswith(SOURCE_EXTS) for f in files):
                problems.append(f"{entry}/: holds C++ but has no row in the table (which parts may it include?)")
                break
    for part_top in sorted(parts):
        base = os.path.join(root, part_top)
        for dirpath, dirs, files in os.walk(base):
            dirs.sort()
            for name in sorted(files):
                if not name.endswith(SOURCE_EXTS):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
                part = row_for(rows, rel)
                if part is None:
                    continue
                allowed, never = rows[part]
                with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or "/" not in m.group(1):
                            continue
                        inc = m.group(1)
                        if top(inc) not in parts or any(inc.startswith(a) for a in allowed):
                            continue
                        kind = "must never include" if any(inc.startswith(x) for x in never) else "may not include"
                        problems.append(f"{rel}:{n}: #include \"{inc}\": {part} {kind} {top(inc)}/ "
                                        f"(it may include {', '.join(allowed)})")
    return problems


def self_test(table):
    rows = read_table(table)
    cases = {
        # file: (include, whether the table allows it)
        "compiler/ir/a.cc": ("compiler/support/strings.h", True),
        "compiler/ir/b.cc": ("worker/cpu/cpu_program.h", False),
        "compiler/passes/c.cc": ("local/local_runner.h", False),
        "compiler/driver/d.cc": ("local/local_runner.h", True),
        "transport/e.cc": ("compiler/support/strings.h", True),
        "transport/f.cc": ("compiler/ir/uop.h", False),
        "transport/g.cc": ("server/workers.h", False),
        "worker/h.cc": ("transport/exec_lane.h", True),
        "worker/i.cc": ("server/tls.h", False),
        "server/j.cc": ("worker/exec_lane.h", False),
        "client/k.cc": ("server/service.h", False),
        "client/l.cc": ("absl/status/status.h", True),
        "local/m.cc": ("worker/cpu/thread_pool.h", True),
    }
    failures = []
    with tempfile.TemporaryDirectory() as root:
        for rel, (inc, _) in cases.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(f"// made by arrows_test.py --self-test\n#include <vector>\n#include \"{inc}\"\n")
        found = check(root, rows)
        for rel, (inc, ok) in cases.items():
            hit = any(p.startswith(f"{rel}:3: ") for p in found)
            if hit == ok:
                failures.append(f"{rel} including {inc}: expected {'no problem' if ok else 'a problem'}, "
                                f"got {'one' if hit else 'none'}")
        # A part the table does not know is a problem of its own.
        os.makedirs(os.path.join(root, "newpart"))
        with open(os.path.join(root, "newpart", "n.cc"), "w") as f:
            f.write("int n;\n")
        if not any(p.startswith("newpart/: ") for p in check(root, rows)):
            failures.append("a directory with C++ and no row went unreported")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print(f"arrows self-test: {len(cases)} includes and an unknown part judged as the table says")
    return 1 if failures else 0


def main(argv):
    try:
        if len(argv) == 3 and argv[1] == "--self-test":
            return self_test(argv[2])
        if len(argv) != 3:
            print(__doc__, file=sys.stderr)
            return 2
        rows = read_table(argv[2])
        problems = check(argv[1], rows)
    except TableError as e:
        print(e, file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) against {argv[2]}")
        return 1
    print(f"arrows: every include keeps to {argv[2]} ({len(rows)} parts)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
