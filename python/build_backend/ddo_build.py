"""The wheel's build backend (PEP 517, standard library only): packs the Python package with the
native files of a CMake build configured with -DDDO_STATIC_DEPS=ON (`make wheel` does both).

    python3 python/build_backend/ddo_build.py [--build-dir build-wheel] [--out dist]
    pip wheel --no-build-isolation ./python      # the same, through pip (DDO_BUILD_DIR to choose)

The wheel holds ddo/libddo.so and the tool as ddo/bin/ddo (started by the `ddo` console script
and `python -m ddo`). Both must need nothing beyond the C runtime and the dynamic loader; the
platform tag is manylinux_2_<N>_x86_64 with N the highest GLIBC_2.N symbol version they need.
A missing, dynamically linked or mismatched native file fails with one line: never a wheel
without its library.

    python3 python/build_backend/ddo_build.py --platform win_amd64 --build-dir build-win/b

packs the win_amd64 wheel from a mingw-w64 cross build instead (`make wheel-win`): ddo/libddo.dll
and ddo/bin/ddo.exe, which must be 64-bit Windows files (x86-64 PE) that import only DLLs of
Windows itself, built from the version include/ddo.h gives (the build's CMake cache says; the
tool is not run, as it would need Wine).
"""

import base64
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
PROJECT = HERE.parent                      # python/
ROOT = PROJECT.parent                      # the checkout
# What the native files may need: the C runtime and the loader (glibc's own libraries).
ALLOWED_NEEDED = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                  "ld-linux-x86-64.so.2"}
# What the Windows files may import: DLLs of Windows itself (jansson, PCRE2, libgcc and
# winpthreads are linked statically), compared case-insensitively.
WINDOWS_ALLOWED_DLLS = {"kernel32.dll", "msvcrt.dll", "advapi32.dll", "bcrypt.dll", "ntdll.dll",
                        "user32.dll", "shell32.dll", "ws2_32.dll", "ole32.dll"}
PLATFORMS = ("linux", "win_amd64")


class BuildError(SystemExit):
    """One line on stderr, exit status 1 (pip shows it as the backend's output)."""

    def __init__(self, message):
        super().__init__("ddo wheel: " + message)


def _project():
    """[project] of pyproject.toml (name, version, requires-python, extras, scripts)."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        try:
            import tomli as tomllib
        except ImportError:
            raise BuildError("reading pyproject.toml needs Python >= 3.11 (tomllib) or tomli") \
                from None
    with open(PROJECT / "pyproject.toml", "rb") as f:
        proj = tomllib.load(f)["project"]
    if "version" in proj.get("dynamic", []):
        proj["version"] = _header_version()
    return proj


def _header_version():
    """MAJOR.MINOR.PATCH from include/ddo.h, the one place the version is written."""
    text = (ROOT / "include" / "ddo.h").read_text()
    parts = [re.search(rf"^#define DDO_VERSION_{p} +(\d+)$", text, re.M) for p in
             ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise BuildError(f"no DDO_VERSION_MAJOR/MINOR/PATCH in {ROOT / 'include' / 'ddo.h'}")
    return ".".join(m.group(1) for m in parts)


def _platform(config_settings):
    given = (config_settings or {}).get("platform") or os.environ.get("DDO_WHEEL_PLATFORM")
    given = given or "linux"
    if given not in PLATFORMS:
        raise BuildError(f"unknown platform {given!r}: one of {', '.join(PLATFORMS)}")
    return given


def _build_dir(config_settings):
    given = (config_settings or {}).get("build-dir") or os.environ.get("DDO_BUILD_DIR")
    if given:
        return pathlib.Path(given).resolve()
    return ROOT / ("build-win/b" if _platform(config_settings) == "win_amd64" else "build-wheel")


def _objdump(path):
    try:
        return subprocess.run(["objdump", "-p", str(path)], capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise BuildError(f"cannot read {path} with objdump ({e}); install binutils") from None


def _glibc_minor(path):
    """Checks what path needs and returns the highest GLIBC_2.N it references (N)."""
    text = _objdump(path)
    needed = set(re.findall(r"^\s*NEEDED\s+(\S+)", text, re.M))
    extra = sorted(needed - ALLOWED_NEEDED)
    if extra:
        raise BuildError(f"{path} needs {', '.join(extra)}: configure with "
                         f"-DDDO_STATIC_DEPS=ON (`make wheel` does)")
    minors = [int(m) for m in re.findall(r"\bGLIBC_2\.(\d+)", text)]
    return max(minors) if minors else 17


def _native_files(build_dir, version):
    lib, tool = build_dir / "libddo.so", build_dir / "ddo"
    for p in (lib, tool):
        if not p.is_file():
            raise BuildError(f"{p} not found: build the library first (`make wheel`, or set "
                             f"DDO_BUILD_DIR to a build configured with -DDDO_STATIC_DEPS=ON)")
    out = subprocess.run([str(tool), "version"], capture_output=True, text=True).stdout.split()
    if out[-1:] != [version]:
        raise BuildError(f"{tool} is version {' '.join(out[1:]) or '?'} and include/ddo.h "
                         f"says {version}: rebuild (`make wheel`)")
    n = max(_glibc_minor(lib), _glibc_minor(tool))
    return lib, tool, f"manylinux_2_{n}_x86_64"


def _pe_machine(path):
    """The COFF machine field of a PE file (0x8664 for x86-64), or None if it is not one."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if head[:2] != b"MZ" or len(head) < 0x40:
        return None
    at = int.from_bytes(head[0x3C:0x40], "little")
    if head[at:at + 4] != b"PE\0\0":
        return None
    return int.from_bytes(head[at + 4:at + 6], "little")


def _pe_imports(path):
    """The DLLs a PE file imports (lower case), read with the mingw-w64 objdump; None if absent."""
    for tool in ("x86_64-w64-mingw32-objdump", "objdump"):
        try:
            out = subprocess.run([tool, "-p", str(path)], capture_output=True, text=True,
                                 check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        if "DLL Name:" in out or "pei-x86-64" in out:
            return {m.lower() for m in re.findall(r"DLL Name:\s*(\S+)", out)}
    return None


def _cmake_cache(build_dir, key):
    try:
        text = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(rf"^{re.escape(key)}:[A-Z]+=(.*)$", text, re.M)
    return m.group(1).strip() if m else None


def _windows_files(build_dir, version):
    lib, tool = build_dir / "libddo.dll", build_dir / "ddo.exe"
    for p in (lib, tool):
        if not p.is_file():
            raise BuildError(f"{p} not found: cross-build for Windows first (docs/windows.md; "
                             f"`make wheel-win` packs build-win/b, WIN_BUILD to choose)")
    for p in (lib, tool):
        if _pe_machine(p) != 0x8664:
            raise BuildError(f"{p} is not a 64-bit Windows (x86-64 PE) file: build with "
                             f"tools/windows/mingw-w64-x86_64.cmake")
        imports = _pe_imports(p)
        if imports is None:
            raise BuildError(f"cannot list what {p} imports: install binutils-mingw-w64-x86-64")
        extra = sorted(imports - WINDOWS_ALLOWED_DLLS)
        if extra:
            raise BuildError(f"{p} imports {', '.join(extra)}: link jansson, PCRE2, libgcc and "
                             f"winpthreads statically (tools/windows/mingw-w64-x86_64.cmake)")
    built = _cmake_cache(build_dir, "CMAKE_PROJECT_VERSION")
    if built != version:
        raise BuildError(f"{build_dir} was configured for version {built or '?'} and "
                         f"include/ddo.h says {version}: reconfigure and rebuild")
    return lib, tool, "win_amd64"


def _stripped(src, dest, windows=False):
    """A copy without debug sections (the symbols of the interface stay)."""
    shutil.copyfile(src, dest)
    strip = "objcopy"
    if windows:
        strip = shutil.which("x86_64-w64-mingw32-objcopy")
    if strip:
        subprocess.run([strip, "--strip-debug", str(dest)], check=True)
    os.chmod(dest, 0o755)


def _metadata(proj):
    readme = (PROJECT / proj.get("readme", "README.md")).read_text()
    lines = ["Metadata-Version: 2.1", f"Name: {proj['name']}", f"Version: {proj['version']}",
             f"Summary: {proj['description']}", f"License: {proj['license']['text']}",
             f"Requires-Python: {proj['requires-python']}"]
    lines += [f"Classifier: {c}" for c in proj.get("classifiers", [])]
    lines += [f"Requires-Dist: {d}" for d in proj.get("dependencies", [])]
    for extra, reqs in proj.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + readme


def _package_files():
    """(path in the wheel, source file) of the pure-Python part."""
    out = []
    for p in sorted((PROJECT / "ddo").rglob("*")):
        rel = p.relative_to(PROJECT)
        if p.is_dir() or "__pycache__" in rel.parts or p.name.startswith("libddo.so") or \
                p.name in ("libddo.dll", "ddo.dll"):
            continue
        if rel.parts[:2] == ("ddo", "bin"):
            continue
        out.append((rel.as_posix(), p))
    for m in _project_modules():
        out.append((f"{m}.py", PROJECT / f"{m}.py"))
    return out


def _project_modules():
    return ["ddo_vmm_bootstrap"]


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write(zf, name, data, mode=0o644):
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)
    return _record_line(name, data)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    proj = _project()
    name, version = proj["name"], proj["version"]
    windows = _platform(config_settings) == "win_amd64"
    native = _windows_files if windows else _native_files
    lib, tool, platform = native(_build_dir(config_settings), version)
    lib_name, tool_name = ("libddo.dll", "ddo.exe") if windows else ("libddo.so", "ddo")
    tag = f"py3-none-{platform}"
    dist_info = f"{name}-{version}.dist-info"
    wheel_name = f"{name}-{version}-{tag}.whl"
    os.makedirs(wheel_directory, exist_ok=True)
    target = pathlib.Path(wheel_directory) / wheel_name
    record = []
    with tempfile.TemporaryDirectory() as tmp:
        slib, stool = pathlib.Path(tmp) / lib_name, pathlib.Path(tmp) / tool_name
        _stripped(lib, slib, windows)
        _stripped(tool, stool, windows)
        with zipfile.ZipFile(target, "w") as zf:
            for arc, src in _package_files():
                record.append(_write(zf, arc, src.read_bytes()))
            record.append(_write(zf, f"ddo/{lib_name}", slib.read_bytes(), 0o755))
            record.append(_write(zf, f"ddo/bin/{tool_name}", stool.read_bytes(), 0o755))
            record.append(_write(zf, f"{dist_info}/METADATA", _metadata(proj).encode()))
            record.append(_write(zf, f"{dist_info}/LICENSE", (ROOT / "LICENSE").read_bytes()))
            wheel = (f"Wheel-Version: 1.0\nGenerator: ddo_build\nRoot-Is-Purelib: false\n"
                     f"Tag: {tag}\n")
            record.append(_write(zf, f"{dist_info}/WHEEL", wheel.encode()))
            scripts = proj.get("scripts", {})
            if scripts:
                ep = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
                record.append(_write(zf, f"{dist_info}/entry_points.txt", ep.encode()))
            record.append(f"{dist_info}/RECORD,,")
            _write(zf, f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode())
    return wheel_name


def build_sdist(sdist_directory, config_settings=None):
    raise BuildError("no source distribution: the wheel is built from a checkout (`make wheel`)")


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description="Build ddo's platform wheel from a CMake build.")
    ap.add_argument("--build-dir", default=None, help="the CMake build (default: build-wheel)")
    ap.add_argument("--out", default=str(ROOT / "dist"), help="where the wheel goes")
    ap.add_argument("--platform", choices=PLATFORMS, default=None,
                    help="linux (manylinux, the default) or win_amd64 (a mingw-w64 build)")
    args = ap.parse_args(argv)
    settings = {k: v for k, v in (("build-dir", args.build_dir), ("platform", args.platform))
                if v} or None
    name = build_wheel(args.out, settings)
    print(pathlib.Path(args.out).resolve() / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
