"""The wheel's build backend (PEP 517, standard library only): packs the Python package with the
native files of a CMake build configured with -DDDO_STATIC_DEPS=ON (`make wheel` does both).

    python3 python/build_backend/ddo_build.py [--build-dir build-wheel] [--out dist]
    pip wheel --no-build-isolation ./python      # the same, through pip (DDO_BUILD_DIR to choose)

The wheel holds ddo/libddo.so and the tool as ddo/bin/ddo (started by the `ddo` console script
and `python -m ddo`). Both must need nothing beyond the C runtime and the dynamic loader; the
platform tag is manylinux_2_<N>_x86_64 with N the highest GLIBC_2.N symbol version they need.
A missing, dynamically linked or mismatched native file fails with one line: never a wheel
without its library.
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


def _build_dir(config_settings):
    given = (config_settings or {}).get("build-dir") or os.environ.get("DDO_BUILD_DIR")
    return pathlib.Path(given).resolve() if given else ROOT / "build-wheel"


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


def _stripped(src, dest):
    """A copy without debug sections (the symbols of the interface stay)."""
    shutil.copyfile(src, dest)
    subprocess.run(["objcopy", "--strip-debug", str(dest)], check=True)
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
        if p.is_dir() or "__pycache__" in rel.parts or p.name.startswith("libddo.so"):
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
    lib, tool, platform = _native_files(_build_dir(config_settings), version)
    tag = f"py3-none-{platform}"
    dist_info = f"{name}-{version}.dist-info"
    wheel_name = f"{name}-{version}-{tag}.whl"
    os.makedirs(wheel_directory, exist_ok=True)
    target = pathlib.Path(wheel_directory) / wheel_name
    record = []
    with tempfile.TemporaryDirectory() as tmp:
        slib, stool = pathlib.Path(tmp) / "libddo.so", pathlib.Path(tmp) / "ddo"
        _stripped(lib, slib)
        _stripped(tool, stool)
        with zipfile.ZipFile(target, "w") as zf:
            for arc, src in _package_files():
                record.append(_write(zf, arc, src.read_bytes()))
            record.append(_write(zf, "ddo/libddo.so", slib.read_bytes(), 0o755))
            record.append(_write(zf, "ddo/bin/ddo", stool.read_bytes(), 0o755))
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
    args = ap.parse_args(argv)
    settings = {"build-dir": args.build_dir} if args.build_dir else None
    name = build_wheel(args.out, settings)
    print(pathlib.Path(args.out).resolve() / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
