#!/usr/bin/env bash
# check_layers.sh - the dependency rule of docs/map.md holds: a folder of src/ includes and calls
# only itself and the folders its rule line names (lower layers never call up), and the files of
# src/session/ call only files below them in the rule's session order; <pthread.h>, <dlfcn.h>
# and <windows.h> are included only in src/os/ (os/thread.h and os/dl.h wrap them); a folder's
# private headers (*_priv.h, *_internal.h) only inside it. Includes
# are read from the sources (an include must name its folder: "plan/plan.h"); calls from the
# object files of this build ($DDO_BUILD_DIR; nm from $LAYERS_NM, the toolchain's): every
# undefined symbol of a folder's objects is mapped to the object that defines it. Circles of
# files inside the other folders are printed as notes. A call against the rule that is not
# fixed yet is a named, counted exception below; the script prints each one, and fails on any
# other arrow against the rule and on an exception that is no longer needed.
# ctest-labels: unit
set -u
SRC=${DDO_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$SRC" || exit 1
exec python3 - "${DDO_BUILD_DIR:-}" "${LAYERS_NM:-nm}" <<'PY'
import glob, os, re, subprocess, sys

build, nm = sys.argv[1], sys.argv[2]

# Arrows against the rule that remain, each named with its reason: "from -> to".
EXCEPTIONS = {
}

def rule():
    text = open('docs/map.md').read()
    m = re.search(r'<!-- layers: begin -->(.*?)<!-- layers: end -->', text, re.S)
    if not m:
        sys.exit('FAIL: docs/map.md has no <!-- layers: begin --> ... <!-- layers: end --> block')
    allow, order = {}, []
    for line in m.group(1).splitlines():
        line = line.strip()
        if line.startswith('session files:'):
            order = line.split(':', 1)[1].replace('<', ' ').split()
        elif '->' in line:
            a, b = line.split('->')
            allow[a.strip()] = set(b.split())
    return allow, order

allow, order = rule()
folders = set(allow)
fails = []
exc_used = {}

def folder_of(path):  # src/plan/plan.c -> plan
    return path.split('/')[1] if path.count('/') >= 2 else None

def allowed(a, b):
    return a == b or b in allow.get(a, ())

def file_ok(a, b):  # session files: a may use b if b is below a in the order
    if folder_of(a) != 'session' or folder_of(b) != 'session' or a == b:
        return True
    na, nb = os.path.basename(a).split('.')[0], os.path.basename(b).split('.')[0]
    if na not in order or nb not in order:
        fails.append(f'{a} or {b} is not in the session order of docs/map.md')
        return True
    return order.index(nb) < order.index(na)

def against(a, b, what):
    """An arrow a -> b against the rule: an exception if listed, else a failure."""
    key = f'{a} -> {b}'
    if key in EXCEPTIONS:
        exc_used.setdefault(key, set()).add(what)
    else:
        fails.append(f'{key}: {what}')

for d in sorted(os.listdir('src')):
    if os.path.isdir('src/' + d) and d != 'cuda' and d not in folders:
        fails.append(f'src/{d}/ has no line in the rule of docs/map.md')
srcs = sorted(p for p in glob.glob('src/**/*.[ch]', recursive=True) if p.count('/') >= 2)
for p in glob.glob('src/*.[ch]'):
    fails.append(f'{p} is at the root of src/ (every file lives in a concept folder)')

# Includes.
inc = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
n_inc = 0
for p in srcs:
    fa = folder_of(p)
    for name in inc.findall(open(p, errors='replace').read()):
        n_inc += 1
        if name in ('ddo.h', 'ddo_host.h', 'ddo_compat.h'):  # the public headers (include/)
            continue
        target = 'src/' + name
        if not os.path.exists(target) or name.startswith('.') or folder_of(target) is None:
            fails.append(f'{p}: #include "{name}" does not name a folder of src/')
            continue
        fb = folder_of(target)
        if fb != fa and re.search(r'_(priv|internal)\.h$', name):
            against(fa, name, f'{p} includes {name}, a private header of {fb}/')
        if not allowed(fa, fb):
            against(fa, fb, f'{p} includes {name}')
        elif not file_ok(p, target) and not target.endswith('.h'):
            against(p, target, 'include')

# The platform's thread and loader headers only inside os/ (os/thread.h, os/dl.h wrap them).
sysinc = re.compile(r'^\s*#\s*include\s*<(pthread\.h|dlfcn\.h|windows\.h)>', re.M)
for p in srcs:
    if folder_of(p) != 'os':
        for name in sysinc.findall(open(p, errors='replace').read()):
            fails.append(f'{p} includes <{name}> (use os/thread.h, os/dl.h)')

# Calls.
objs = []
if build:
    base = os.path.join(build, 'CMakeFiles', 'ddo_objects.dir', 'src')
    objs = sorted(glob.glob(base + '/**/*.o', recursive=True) + glob.glob(base + '/**/*.obj', recursive=True))
defined, undef = {}, {}
for o in objs:
    rel = 'src/' + os.path.relpath(o, base)
    rel = re.sub(r'\.(o|obj)$', '', rel)  # src/plan/plan.c
    if not os.path.exists(rel):
        continue  # a stale object of a file that moved
    out = subprocess.run([nm, '-P', o], capture_output=True, text=True)
    if out.returncode != 0:
        fails.append(f'{nm} could not read {o}: {out.stderr.strip()}')
        continue
    undef[rel] = set()
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        if f[1] == 'U':
            undef[rel].add(f[0])
        elif f[1] in 'TDBRC':
            defined[f[0]] = rel
n_calls = 0
for a, syms in sorted(undef.items()):
    for s in sorted(syms):
        b = defined.get(s)
        if b is None or b == a:
            continue
        n_calls += 1
        fa, fb = folder_of(a), folder_of(b)
        if not allowed(fa, fb):
            against(fa, fb, f'{a} calls {s} ({b})')
        elif not file_ok(a, b):
            against(os.path.basename(a), os.path.basename(b), f'{s}')

# File circles inside the other folders: not against the rule (which orders only session/'s
# files), printed so that they stay visible and counted.
inner = {}
for a, syms in undef.items():
    for sym in syms:
        b = defined.get(sym)
        if b is not None and b != a and folder_of(a) == folder_of(b):
            inner.setdefault(a, set()).add(b)
index, low, stack, on, circles = {}, {}, [], set(), []
def strong(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(inner.get(v, ())):
        if w not in index:
            strong(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            circles.append(sorted(comp))
for v in sorted(inner):
    if v not in index:
        strong(v)
for c in sorted(circles):
    if folder_of(c[0]) != 'session':
        print(f'note: file circle inside {folder_of(c[0])}/ ({len(c)} files): ' +
              ', '.join(os.path.basename(x) for x in c))

for key, whats in sorted(exc_used.items()):
    print(f'exception: {key} ({EXCEPTIONS[key]}): {len(whats)} arrow(s)')
    for w in sorted(whats):
        print(f'    {w}')
for key in sorted(set(EXCEPTIONS) - set(exc_used)) if undef else []:
    fails.append(f'exception "{key}" is no longer needed: remove it from tests/check_layers.sh')
for f in fails:
    print('FAIL:', f)
if fails:
    sys.exit(1)
print(f'layers: {len(srcs)} files, {n_inc} includes, ' +
      (f'{n_calls} calls between files in {len(undef)} objects' if undef else 'calls NOT checked (no objects: set DDO_BUILD_DIR)') +
      f' follow docs/map.md; {len(exc_used)} named exception(s), '
      f'{sum(len(w) for w in exc_used.values())} arrow(s)')
if not undef:
    sys.exit(77)
PY
