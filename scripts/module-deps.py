#!/usr/bin/env python3
"""The dependency graph between a crate's top-level modules, and its cycles.

A top-level module is a file `src/X.rs` or a folder `src/X/`. Module A depends
on B when code anywhere under A names `crate::B` (a `use`, a path in an
expression, a group `crate::{B, ..}`), or reaches B through `super::` from a
file or inline `mod` nested in A, or names an item the crate root re-exports
from B (`pub use B::Item;` in lib.rs, then `crate::Item`). Comments (doc
comments' intra-doc links included) and string literals are not code and are
skipped. Items the crate root defines itself (router's `Broker` seam) are
shown as `(root)` and left out of the cycle check: the root is what every
module builds on, not one of them.

Prints each crate's graph, one module a line. Where modules form a cycle it
lists every dependency among them with the line that first names it (the
places to cut), and exits 1 naming the shortest cycle: data is to flow one
way, socket -> session -> hub -> router and back, with node.rs wiring the pod.

Usage: scripts/module-deps.py [SRC_DIR ...]   (default: gateway/src router/src)
       -v: also print where each dependency is named
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIRS = ["gateway/src", "router/src"]
ROOT_NODE = "(root)"


def strip(text):
    """The text with comments and the insides of string and char literals
    blanked (newlines kept, so line numbers stay true)."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        return re.sub(r"[^\n]", " ", s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif c == "r" and (m := re.match(r'r(#*)"', text[i:])) and not _ident_before(text, i, "b"):
            hashes = m.group(1)
            end = text.find('"' + hashes, i + len(m.group(0)))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(blank(text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{1F600}'), or a lifetime ('a), which is code.
            m = re.match(r"'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'", text[i:])
            if m:
                out.append(blank(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _ident_before(text, i, allowed):
    """Whether text[i] continues an identifier (so `r"` there is not a raw
    string), other than through the prefix letters in `allowed` (`br"`)."""
    k = i - 1
    while k >= 0 and text[k] in allowed:
        k -= 1
    return k >= 0 and (text[k].isalnum() or text[k] == "_")


TOKEN = re.compile(r"\s*(::|[A-Za-z_][A-Za-z0-9_]*|\S)")


def tokens(code):
    """(token, line) pairs of stripped code."""
    line, pos = 1, 0
    for m in TOKEN.finditer(code):
        line += code.count("\n", pos, m.start(1))
        pos = m.start(1)
        yield m.group(1), line


def group_heads(toks, k):
    """The first segment of each item of the `{ .. }` group opening at toks[k]."""
    heads, depth, expect = [], 0, True
    while k < len(toks):
        t = toks[k][0]
        if t == "{":
            depth += 1
            expect = depth == 1
        elif t == "}":
            depth -= 1
            if depth == 0:
                break
        elif t == "," and depth == 1:
            expect = True
        elif expect and depth == 1 and re.match(r"[A-Za-z_]", t):
            heads.append(t)
            expect = False
        k += 1
    return heads


def paths(code, file_path):
    """(first segment after the crate root, line) for every path in `code`
    that leaves the top-level module it is written in. `file_path` is the
    file's module path, such as ["session", "writer"]."""
    toks = list(tokens(code))
    braces = []  # for each open `{`: the inline module it opens, or None
    for k, (t, line) in enumerate(toks):
        prev = toks[k - 1][0] if k else ""
        if t == "{":
            named = k >= 2 and toks[k - 2][0] == "mod"
            braces.append(toks[k - 1][0] if named else None)
            continue
        if t == "}":
            if braces:
                braces.pop()
            continue
        if prev in ("::", "$") or t not in ("crate", "super"):
            continue
        j = k
        if t == "crate":
            if j + 1 >= len(toks) or toks[j + 1][0] != "::":
                continue
            j += 2
        else:
            here = file_path + [b for b in braces if b is not None]
            ups = 0
            while j + 1 < len(toks) and toks[j][0] == "super" and toks[j + 1][0] == "::":
                ups, j = ups + 1, j + 2
            if len(here) - ups > 0:
                continue  # still inside this top-level module
        if j >= len(toks):
            continue
        if toks[j][0] == "{":
            for head in group_heads(toks, j):
                yield head, line
        elif re.match(r"[A-Za-z_]", toks[j][0]):
            yield toks[j][0], line


def reexports(lib):
    """What the crate root re-exports, by name: the top-level module it comes from."""
    names = {}
    code = strip(lib.read_text())
    for m in re.finditer(r"\bpub\s+use\s+(?:crate::|self::)?([A-Za-z_]\w*)\s*::\s*([^;]*);", code):
        module, rest = m.group(1), m.group(2)
        for name in re.findall(r"\b(?:as\s+)?([A-Za-z_]\w*)\b", rest):
            names[name] = module
        # `pub use m::{A, b::C as D}`: every identifier it brings in counts
        # (a few extra names that are never used on their own do no harm).
    return names


def graph(src):
    """{module: {dependency: [(file, line), ..]}} for the crate in src."""
    modules = {p.stem for p in src.glob("*.rs") if p.stem not in ("lib", "main")}
    modules |= {p.name for p in src.iterdir() if p.is_dir()}
    lib = src / "lib.rs"
    exported = reexports(lib) if lib.exists() else {}
    deps = {m: {} for m in sorted(modules)}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        if len(rel.parts) == 1 and rel.stem in ("lib", "main"):
            continue
        mod_path = list(rel.parts[:-1]) + ([] if rel.stem == "mod" else [rel.stem])
        top = mod_path[0]
        if top not in deps:
            continue
        for head, line in paths(strip(path.read_text()), mod_path):
            if head in modules:
                target = head
            elif head in exported and exported[head] in modules:
                target = exported[head]
            else:
                target = ROOT_NODE
            if target != top:
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                deps[top].setdefault(target, []).append((shown, line))
    return deps


def tangles(deps):
    """Each set of two or more modules that reach one another (a strongly
    connected component), sorted: every cycle lies within one of them."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in deps.get(v, {}):
            if w == ROOT_NODE:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for v in deps:
        if v not in index:
            visit(v)
    return found


def shortest_cycle(deps, scc):
    """The shortest cycle within scc, as modules with the first repeated last."""
    inside, best = set(scc), None
    for start in scc:
        prev, queue = {start: None}, [start]
        for v in queue:
            if start in deps[v] and v in prev:
                path, w = [start], v
                while w is not None:
                    path.append(w)
                    w = prev[w]
                path = path[::-1]
                if best is None or len(path) < len(best):
                    best = path
                break
            for w in sorted(deps[v]):
                if w in inside and w not in prev:
                    prev[w] = v
                    queue.append(w)
    return best


def main(argv):
    verbose = "-v" in argv
    dirs = [a for a in argv if a != "-v"] or DEFAULT_DIRS
    found = []
    for d in dirs:
        src = Path(d) if Path(d).is_absolute() else ROOT / d
        deps = graph(src)
        print(f"{d}:")
        width = max(map(len, deps), default=0)
        for m, out in deps.items():
            print(f"  {m:<{width}} -> {', '.join(sorted(out)) or '-'}")
            if verbose:
                for target, sites in sorted(out.items()):
                    where = ", ".join(f"{f}:{line}" for f, line in sorted(set(sites)))
                    print(f"  {'':<{width}}    {target}: {where}")
        for scc in tangles(deps):
            found.append(f"{d}: {' -> '.join(shortest_cycle(deps, scc))}")
            print(f"  CYCLE among {', '.join(scc)}; each dependency inside it, first named at:")
            for a in scc:
                for b in sorted(set(deps[a]) & set(scc)):
                    f, line = min(deps[a][b])
                    print(f"    {a} -> {b}: {f}:{line}")
    sys.stdout.flush()
    for cycle in found:
        print(f"module cycle: {cycle}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
