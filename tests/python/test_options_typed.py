"""DynamicOffloadConfig's typed fields (python/ddo/_options.py, generated from src/config/options.def by
python/tools/gen_options.py): the file is current, it names exactly the library's options in
catalog order, and each declared type holds the library's default. Edit a row of options.def
without regenerating, or give a row a type the generator maps wrongly, and this fails."""

import importlib.util
import pathlib
import subprocess
import sys

import ddo
from ddo import config

ROOT = pathlib.Path(__file__).resolve().parents[2]
GEN = ROOT / "python" / "tools" / "gen_options.py"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_options", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_file_is_current():
    r = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_rows_are_the_librarys_options_in_order():
    rows = _gen().rows((ROOT / "src" / "config" / "options.def").read_text())
    assert [r[0] for r in rows] == list(config.catalog())
    assert [r[0] for r in rows] == ddo.DynamicOffloadConfig.fields()


def test_declared_types_hold_the_defaults():
    gen = _gen()
    defaults = config._catalog()[0]
    cfg = ddo.DynamicOffloadConfig()
    for key, typ, choices, _help in gen.rows((ROOT / "src" / "config" / "options.def").read_text()):
        v = getattr(cfg, key)
        assert v == (tuple(defaults[key]) if isinstance(defaults[key], list) else defaults[key])
        if typ == "BOOL":
            assert isinstance(v, bool), key
        elif typ in ("INT", "KB"):
            assert isinstance(v, int) and not isinstance(v, bool), key
        elif typ in ("GB", "MB", "FLOAT"):
            assert isinstance(v, (int, float)) and not isinstance(v, bool), key
        elif typ == "STRING":
            assert isinstance(v, str), key
        elif typ == "ENUM":
            assert v in choices.split("|"), (key, v, choices)
        else:
            assert typ == "LIST" and isinstance(v, tuple) and \
                all(isinstance(x, str) for x in v), key


def test_the_fields_add_no_instance_dict():
    # OptionFields declares its fields for type checkers only: instances keep __slots__.
    assert not hasattr(ddo.DynamicOffloadConfig(), "__dict__")
