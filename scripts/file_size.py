#!/usr/bin/env python3
"""No source file over 600 lines: a file that long holds more than one noun.

Counts the lines of every `.rs` file under the given source folders, leaving
out a file-ending test module (`#[cfg(test)] mod tests { ... }` with only
blank lines after it): tests sit beside the code they prove and may be as
long as they need. Exempt whole: test-only modules (a file its parent
declares under `#[cfg(test)]`, as `auth/tests.rs`) and generated code (a file
that says `@generated` in its first lines). Prints each file over the limit
with its counted lines and exits 1; prints nothing else and exits 0.

Usage: scripts/file_size.py [SRC_DIR ...]   (default: every crate's src/)

Comments and strings are read as module-deps.py reads them (their braces do
not count), so a test module's end is found where the compiler finds it.

>>> code = "fn a() {}\\n" * 3
>>> counted_lines(code)
3
>>> tests = '#[cfg(test)]\\nmod tests {\\n    fn t() { let _ = "}"; }\\n}\\n'
>>> counted_lines(code + "\\n" + tests)
4
>>> counted_lines(code + "#[cfg(test)] mod tests {\\n}\\n")  # on one line
3
>>> counted_lines(code + tests + "fn after() {}\\n")  # not file-ending: counted
8
>>> counted_lines(code + "#[cfg(test)]\\nmod tests;\\n")  # its lines are elsewhere
5
>>> counted_lines(code + "#[cfg(any(test, fuzzing))]\\nmod tests {\\n}\\n")
6
>>> sorted(test_only_modules("#[cfg(test)]\\nmod tests;\\n#[cfg(any(test, fuzzing))]\\n"
...                          "pub mod fuzzing;\\n#[cfg(test)]\\n#[path = 'x.rs']\\nmod x;\\nmod y;\\n"))
['tests', 'x']
"""

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def default_dirs():
    """The `src/` of every crate of the workspace (a folder with a
    Cargo.toml at the top level): the gateway's and the router's, and the
    clients', the load tool's and the test rig's, read as often."""
    return sorted(
        str(toml.parent.relative_to(ROOT) / "src")
        for toml in ROOT.glob("*/Cargo.toml")
        if (toml.parent / "src").is_dir()
    )


LIMIT = 600
# `@generated` within this many first lines marks a generated file.
GENERATED_HEAD = 5

_spec = importlib.util.spec_from_file_location("module_deps", Path(__file__).parent / "module-deps.py")
_module_deps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module_deps)
strip = _module_deps.strip

# A module declared at the start of a line, with the attributes above it.
DECLARATION = re.compile(
    r"^((?:[ \t]*#\[[^\n]*?\][ \t]*\n?)*)[ \t]*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_]\w*)\s*([;{])",
    re.M,
)
CFG_TEST = re.compile(r"#\[cfg\(\s*test\s*\)\]")


def counted_lines(text):
    """The file's lines, less a file-ending `#[cfg(test)]` inline module."""
    lines = text.splitlines()
    code = strip(text)
    for m in DECLARATION.finditer(code):
        if m.group(3) != "{" or not CFG_TEST.search(m.group(1)):
            continue
        # Find the brace that closes the module.
        depth, i = 0, m.end(3) - 1
        while i < len(code):
            if code[i] == "{":
                depth += 1
            elif code[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        if depth == 0 and not code[i + 1 :].strip():
            return code.count("\n", 0, m.start())  # the lines before it
    return len(lines)


def test_only_modules(parent_text):
    """Names of the modules a parent declares under `#[cfg(test)]` alone."""
    return {
        m.group(2)
        for m in DECLARATION.finditer(strip(parent_text))
        if m.group(3) == ";" and CFG_TEST.search(m.group(1))
    }


def parent_of(path, src):
    """The file that declares the module in `path` (None for a crate root)."""
    rel = path.relative_to(src)
    if len(rel.parts) == 1:
        return None if rel.stem in ("lib", "main") else _root(src)
    folder = path.parent.parent if rel.stem == "mod" else path.parent
    if folder == src:
        return _root(src)
    for candidate in (folder / "mod.rs", folder.with_suffix(".rs")):
        if candidate.exists():
            return candidate
    return None


def _root(src):
    lib = src / "lib.rs"
    return lib if lib.exists() else src / "main.rs"


def module_name(path):
    return path.parent.name if path.name == "mod.rs" else path.stem


def exempt(path, src):
    head = "\n".join(path.read_text().splitlines()[:GENERATED_HEAD])
    if "@generated" in head:
        return True
    parent = parent_of(path, src)
    return parent is not None and parent.exists() and module_name(path) in test_only_modules(parent.read_text())


def oversized(src):
    """(file, counted lines) of each file under src over the limit."""
    found = []
    for path in sorted(src.rglob("*.rs")):
        if exempt(path, src):
            continue
        n = counted_lines(path.read_text())
        if n > LIMIT:
            found.append((path, n))
    return found


def main(argv):
    dirs = argv or default_dirs()
    found = []
    for d in dirs:
        src = Path(d) if Path(d).is_absolute() else ROOT / d
        found += oversized(src)
    for path, n in found:
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"{shown}: {n} lines (over {LIMIT}, tests aside): split it along its seams", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
