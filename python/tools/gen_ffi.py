#!/usr/bin/env python3
"""Writes python/ddo/_ffi.py: the ctypes declarations of the public headers (include/ddo.h,
ddo_host.h, ddo_compat.h) -- every public struct as a ctypes.Structure, every function
pointer type as a CFUNCTYPE, and every DDO_API function as (restype, argtypes) -- so that the
binding never mirrors a C declaration by hand (python/ddo/_lib.py loads the library with them).

    python/tools/gen_ffi.py           rewrite python/ddo/_ffi.py
    python/tools/gen_ffi.py --check   exit 1 when the file differs from what the headers give

The mapping: a pointer to an opaque handle (ddo_config, ddo_plan, ...) or to void is c_void_p;
a pointer to one is PP (void **: the out-parameter of a create); char * and const char * are
c_char_p; const char ** and const char *const * are PCHARP (char ** for argv too), any other
char ** is PP (text the caller frees with ddo_free, kept as a raw pointer); a pointer to a public
struct is POINTER(Struct); enums are c_int; a struct whose first field is `size_t size` derives
from Extensible (the ABI rule of docs/abi.md: the size set on construction). A type it cannot
map stops it with the declaration named. Every struct it mirrors must be known to
ddo_struct_size (src/base/abi.c): python/ddo/_lib.py compares each mirror's size with the library's
at load, and tests/check_py_ffi.sh checks the list.
"""

import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _generated  # noqa: E402  (python/tools/_generated.py, beside this script)

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADERS = [ROOT / "include" / n for n in ("ddo.h", "ddo_host.h", "ddo_compat.h")]
OUT = ROOT / "python" / "ddo" / "_ffi.py"

SCALARS = {
    "bool": "c_bool", "char": "c_char", "int": "c_int", "unsigned": "c_uint",
    "size_t": "c_size_t", "uint64_t": "c_uint64", "int64_t": "c_int64", "uint32_t": "c_uint32",
    "int32_t": "c_int32", "uint16_t": "c_uint16", "int16_t": "c_int16", "uint8_t": "c_uint8",
    "int8_t": "c_int8", "float": "c_float", "double": "c_double", "void": "None",
}


def _strip(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"^\s*#.*$", "", text, flags=re.M)


def camel(cname, suffix=""):
    base = cname[4:] if cname.startswith("ddo_") else cname
    return "".join(p.capitalize() for p in base.split("_")) + suffix


class Header:
    def __init__(self, raw):
        self.defines = {n: int(v, 0) for n, v in re.findall(
            r"^#define\s+(DDO_\w+)\s+\(?(-?(?:0x[0-9a-fA-F]+|\d+))[uU]?\)?\s*$", raw, flags=re.M)}
        text = _strip(raw)
        self.text = text
        self.enums = set(re.findall(r"typedef\s+enum\s+\w+\s*\{.*?\}\s*(\w+)\s*;", text, re.S))
        self.opaque = set(re.findall(r"typedef\s+struct\s+\w+\s+(\w+)\s*;", text))
        self.structs = [(m.group(3), m.group(2)) for m in re.finditer(
            r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", text, re.S)]
        self.struct_names = {n for n, _ in self.structs}
        self.fn_types = [(m.group(2), m.group(1), m.group(3)) for m in re.finditer(
            r"typedef\s+([\w\s\*]+?)\s*\(\s*\*\s*(\w+)\s*\)\s*\(([^)]*)\)\s*;", text)]
        self.fn_type_names = {n for n, _, _ in self.fn_types}
        self.functions = [(m.group(2), m.group(1), m.group(3)) for m in re.finditer(
            r"DDO_API\s+([\w\s\*]+?)\s*\b(ddo_\w+)\s*\((.*?)\)\s*;", text, re.S)]

    def ctype(self, decl, name="", ret=False):
        """The ctypes expression of a C type (decl without its name)."""
        decl = " ".join(decl.replace("*", " * ").split())
        stars = decl.count("*")
        words = [w for w in decl.replace("*", " ").split() if w not in ("const", "struct")]
        if len(words) != 1:
            raise SystemExit(f"gen_ffi: cannot map the type {decl!r}")
        base = words[0]
        if base in self.enums:
            base_t = "c_int"
        elif base in SCALARS:
            base_t = SCALARS[base]
        elif base in self.struct_names:
            base_t = camel(base)
        elif base in self.fn_type_names:
            base_t = camel(base)
        elif base in self.opaque:
            base_t = "HANDLE"
        else:
            raise SystemExit(f"gen_ffi: unknown type {base!r} in {decl!r}")
        if stars == 0:
            if base_t == "HANDLE" or (base_t == "None" and not ret):
                raise SystemExit(f"gen_ffi: {decl!r} by value")
            return base_t
        if stars == 1:
            if base == "char":
                return "c_char_p"
            if base_t in ("None", "HANDLE"):
                return "P"
            return f"POINTER({base_t})"
        if stars == 2:
            if base == "char":
                return "PCHARP" if decl.startswith("const char") or name == "argv" else "PP"
            if base_t in ("None", "HANDLE"):
                return "PP"
        raise SystemExit(f"gen_ffi: cannot map the type {decl!r}")

    def split_decl(self, part):
        """(type, name, array length or None) of one declaration "const char *name[N]"."""
        part = part.strip()
        m = re.fullmatch(r"(.*?)\b(\w+)\s*(?:\[\s*(\w+)\s*\])?", part, re.S)
        if m is None or not m.group(1).strip():
            return part, "", None
        return m.group(1).strip(), m.group(2), m.group(3)

    def array_len(self, n):
        return int(n) if n.isdigit() else self.defines[n]


def _params(text):
    """Top-level comma split of a parameter list."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur.strip():
        out.append(cur)
    return [p.strip() for p in out if p.strip() and p.strip() != "void"]


FN_PTR = re.compile(r"^(.*?)\(\s*\*\s*(\w+)\s*\)\s*\((.*)\)$", re.S)


def _cfunctype(h, ret, params):
    args = []
    for p in _params(params):
        t, n, _ = h.split_decl(p)
        args.append(h.ctype(t, n))
    return f"CFUNCTYPE({', '.join([h.ctype(ret, ret=True)] + args)})"


def render(h):
    out = ['"""The ctypes declarations of include/ddo.h, ddo_host.h and ddo_compat.h. Generated by',
           "python/tools/gen_ffi.py; do not edit (CTest check_py_ffi fails when it differs from the",
           'headers)."""', "",
           "@IMPORTS@",
           "from typing import Any, Dict, List, Tuple, Type", "",
           "P = c_void_p", "PP = POINTER(c_void_p)", "PSIZE = POINTER(c_size_t)",
           "PCHARP = POINTER(c_char_p)", "", "",
           "class Extensible(Structure):",
           '    """A struct that grows (the ABI rule, docs/abi.md): its first field is its size, set',
           "    here to this mirror's size; every other field starts zero, as the C DDO_<NAME>_INIT",
           '    macros do."""', "",
           "    def __init__(self, *args: Any, **fields: Any) -> None:",
           "        super().__init__(*args, **fields)",
           "        self.size = sizeof(self)", ""]
    names = ["Extensible", "P", "PP", "PSIZE", "PCHARP"]
    for n, ret, params in h.fn_types:
        out += ["", f"{camel(n)} = {_cfunctype(h, ret, params)}"]
        names.append(camel(n))
    for sname, body in h.structs:
        fields, extra = [], []
        for stmt in [s.strip() for s in body.split(";") if s.strip()]:
            fp = FN_PTR.match(stmt)
            if fp:
                tname = camel(fp.group(2), "Fn")
                if tname in names:
                    raise SystemExit(f"gen_ffi: {tname} named twice")
                extra.append(f"{tname} = {_cfunctype(h, fp.group(1), fp.group(3))}")
                names.append(tname)
                fields.append((fp.group(2), tname))
                continue
            first, *rest = [p.strip() for p in stmt.split(",")]
            t, n, arr = h.split_decl(first)
            decls = [(n, arr)] + [h.split_decl(t + " " + r)[1:] for r in rest]
            for fname, farr in decls:
                ct = h.ctype(t, fname)
                if farr is not None:
                    ct = f"{ct} * {h.array_len(farr)}"
                fields.append((fname, ct))
        base = "Extensible" if fields and fields[0] == ("size", "c_size_t") else "Structure"
        out += [""] + extra + ["", ""] if extra else ["", ""]
        cls = camel(sname)
        out.append(f"class {cls}({base}):")
        out.append("    _fields_ = [")
        out += [f'        ("{f}", {t}),' for f, t in fields]
        out.append("    ]")
        names.append(cls)
    out += ["", "# Every public struct by its C name: ddo_struct_size reports the library's sizes.",
            "STRUCTS: Dict[str, Type[Structure]] = {"]
    out += [f'    "{s}": {camel(s)},' for s, _ in h.structs]
    out += ["}", "", "# Every DDO_API function: name: (restype, argtypes).",
            "FUNCTIONS: Dict[str, Tuple[Any, List[Any]]] = {"]
    for name, ret, params in h.functions:
        args = []
        for p in _params(params):
            if FN_PTR.match(p):
                args.append("P")
                continue
            t, n, arr = h.split_decl(p)
            args.append("c_char_p" if arr is not None and t.endswith("char") else h.ctype(t, n))
        out.append(f'    "{name}": ({h.ctype(ret, ret=True)}, [{", ".join(args)}]),')
    out += ["}", ""]
    names += ["STRUCTS", "FUNCTIONS"]
    out += ["__all__ = ["] + [f'    "{n}",' for n in names] + ["]", ""]
    text = "\n".join(out)
    # The ctypes names the declarations use (and those the preamble needs), one import line each
    # way a reader expects: sorted, wrapped below 100 columns.
    used = sorted(set(re.findall(r"\b(c_\w+|CFUNCTYPE|POINTER)\b", text)) |
                  {"POINTER", "Structure", "c_char_p", "c_size_t", "c_void_p", "sizeof"},
                  key=lambda n: (n[0].islower(), n))
    lines, cur = [], "from ctypes import ("
    for i, n in enumerate(used):
        piece = n + (", " if i < len(used) - 1 else ")")
        if len(cur) + len(piece.rstrip()) > 99:
            lines.append(cur.rstrip())
            cur = " " * len("from ctypes import (")
        cur += piece
    lines.append(cur)
    return text.replace("@IMPORTS@", "\n".join(lines))


def main(argv):
    h = Header("\n".join(p.read_text() for p in HEADERS))
    text = render(h)
    return _generated.write_or_check(OUT, text, argv, "the headers", "gen_ffi.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
