"""The YAML loader: numbers the resolver accepts and Python does not."""

from __future__ import annotations

from causalab_mini.codegen import loader


def test_a_number_the_resolver_accepts_but_python_does_not_is_text() -> None:
    # YAML's int and float patterns allow '0x_' and '._', which int() and float() refuse:
    # they were a traceback in `registry lint`; they are the text they are
    loaded, diags = loader.load_text("a: 0x_\nb: ._\nc: 0x1F\nd: 1_000\n", "x.yaml")
    assert diags == [] and loaded.data == {"a": "0x_", "b": "._", "c": 31, "d": 1000}


def test_ruamel_is_imported_only_to_parse() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import causalab_mini.codegen.loader, causalab_mini.codegen.lint; "
        "print(sorted(m for m in sys.modules if m.startswith(('ruamel', 'jsonschema'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
