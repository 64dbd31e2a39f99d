#!/usr/bin/env python3
"""Import circles between sibling modules in each crate's src/ tree (the house rule in
CONTRIBUTING.md: sibling files never name each other both ways). Exits 1 when it finds one.
A sibling module is a file `x.rs` or a directory `x/` (with everything under it) that share a parent
module. X -> Y when a file in X names `P::Y` (resolved from crate::/super::/self:: paths, in code,
`use` trees, and doc comments/intra-doc links; plain // comments ignored)."""
import os, re, sys, collections
MAXE = int(os.environ.get("MAXE", "4"))
root = sys.argv[1] if len(sys.argv) > 1 else "."
crates = sorted(d for d in os.listdir(os.path.join(root, "layers")) if os.path.isdir(os.path.join(root, "layers", d, "src")))
srcs = [("layers/"+c, os.path.join(root,"layers",c,"src")) for c in crates] + [("facade", os.path.join(root,"src"))]

def modpath(src, f):
    rel = os.path.relpath(f, src)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main", "mod"): rel = rel[:-1]
    return rel

def expand_use(tree):
    # tree: "a::b::{c, d::{e, f}, g as h}" -> list of paths
    tree = re.sub(r"\s+", "", tree)
    out = []
    def rec(prefix, s):
        # split top-level commas
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{": depth += 1
            if ch == "}": depth -= 1
            if ch == "," and depth == 0: parts.append(cur); cur = ""
            else: cur += ch
        if cur: parts.append(cur)
        for p in parts:
            if "{" in p:
                i = p.index("{")
                head = p[:i].rstrip(":")
                inner = p[i+1:p.rindex("}")]
                rec(prefix + ([head] if head else []), inner)
            else:
                out.append("::".join(prefix + [p]) if p else "::".join(prefix))
    rec([], tree)
    return out

path_re = re.compile(r"(?<![\w:])(?:crate|super|self)(?:::(?:\w+|\{))+")
def resolve(base, path):
    segs = path.split("::")
    if segs[0] == "crate": cur = []; segs = segs[1:]
    else:
        cur = list(base)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                if not cur: return None
                cur = cur[:-1]
            segs = segs[1:]
    return cur + [s for s in segs if s and s != "{"]

edges = collections.defaultdict(set)  # (crate, parent tuple, X, Y) -> evidence
for cname, src in srcs:
    if not os.path.isdir(src): continue
    for dp, _, files in os.walk(src):
        for fn in files:
            if not fn.endswith(".rs"): continue
            f = os.path.join(dp, fn)
            mp = modpath(src, f)
            text = open(f).read()
            # strip plain // comments (keep /// and //!), strip string literals roughly
            lines = text.split("\n")
            stack = []  # inline mods: (name, depth_at_open)
            depth = 0
            buf = []
            for ln, line in enumerate(lines, 1):
                s = line
                code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', s)
                m = re.match(r"\s*//(?![/!])", code)
                if m: continue
                code_nc = re.sub(r"(?<!:)//(?![/!]).*$", "", code) if not re.match(r"\s*//[/!]", code) else code
                is_doc = bool(re.match(r"\s*//[/!]", code))
                base = mp + [n for n, _ in stack]
                if not is_doc:
                    mm = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*\{", code_nc)
                    if mm: stack.append((mm.group(1), depth))
                # `use` trees (single line or multi-line)
                buf.append((ln, code_nc, is_doc, list(base)))
                if not is_doc:
                    depth += code_nc.count("{") - code_nc.count("}")
                    while stack and depth <= stack[-1][1]: stack.pop()
            # process uses: join non-doc code to find use statements with braces
            code_all = "\n".join(c if not d else "" for _, c, d, _ in buf)
            # map char offset -> line index
            offs = []; o = 0
            for ln, c, d, b in buf:
                offs.append(o); o += len(c if not d else "") + 1
            import bisect
            def base_at(pos):
                i = bisect.bisect_right(offs, pos) - 1
                return buf[i][3], buf[i][0]
            found = []
            for m in re.finditer(r"\buse\s+((?:crate|super|self)::[^;]*);", code_all):
                b, ln = base_at(m.start())
                for p in expand_use(m.group(1)):
                    found.append((b, p, ln))
            for m in re.finditer(r"(?<!in )" + path_re.pattern, code_all):
                b, ln = base_at(m.start())
                found.append((b, m.group(0), ln))
            for ln, c, d, b in buf:
                if d:
                    for m in path_re.finditer(c):
                        found.append((b, m.group(0), ln))
            for b, p, ln in found:
                r = resolve(b, p)
                if r is None: continue
                # for every ancestor P of the file's module with file in child X, check r under P::Y
                for k in range(len(mp)):
                    P = mp[:k]; X = mp[k]
                    if len(r) > k and r[:k] == P and r[k] != X:
                        Y = r[k]
                        edges[(cname, tuple(P), X, Y)].add(f"{os.path.relpath(f, root)}:{ln} `{p}`")
# only keep Y that are sibling modules (exist as file or dir)
def is_mod(src, P, Y):
    d = os.path.join(src, *P)
    return os.path.exists(os.path.join(d, Y + ".rs")) or os.path.isdir(os.path.join(d, Y))
srcmap = dict(srcs)
found_any = False
seen = set()
for (c, P, X, Y), ev in sorted(edges.items()):
    if not (is_mod(srcmap[c], P, X) and is_mod(srcmap[c], P, Y)): continue
    back = edges.get((c, P, Y, X))
    if back and (c, P, Y, X) not in seen:
        seen.add((c, P, X, Y))
        found_any = True
        where = "/".join([c, "src"] + list(P))
        print(f"CIRCLE {where}/{{{X},{Y}}}")
        for e in sorted(ev)[:MAXE]: print(f"   {X}->{Y}: {e}")
        for e in sorted(back)[:MAXE]: print(f"   {Y}->{X}: {e}")
if not found_any: print("no circles")
sys.exit(1 if found_any else 0)
