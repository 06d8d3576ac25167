"""ir.files: every guard of the one guarded reader gives one exact line; write_atomic leaves no
temporary file behind."""

from __future__ import annotations

import os
import stat

import pytest

from ir import files
from ir.files import (MAX_ALIASES, MAX_DEPTH, InputError, check_finite, read_csv_rows, read_json,
                      read_text, read_yaml, write_atomic)


def err(fn, *args, **kw) -> str:
    with pytest.raises(InputError) as e:
        fn(*args, **kw)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ----------------------------------------------------------------------------- read_text
def test_read_text_plain_and_bom(tmp_path):
    p = tmp_path / "a.yaml"
    p.write_bytes("\ufeffname: café\n".encode())
    assert read_text(p, "cluster") == "name: café\n"


def test_missing(tmp_path):
    p = tmp_path / "nope.yaml"
    assert err(read_text, p, "cluster") == f"{p}: cluster file not found; fix: check the path"


def test_directory(tmp_path):
    assert err(read_text, tmp_path, "cluster") == (
        f"{tmp_path}: is a directory, not a cluster file; fix: give the path of the file")


def test_device_file_is_not_read():
    assert err(read_text, "/dev/zero", "plan JSON") == (
        "/dev/zero: is not a regular file (a device, pipe or socket); fix: give a plan JSON file")


def test_fifo_is_not_read(tmp_path):
    p = tmp_path / "fifo"
    os.mkfifo(p)
    assert "is not a regular file" in err(read_text, p, "cluster")


def test_over_size_limit(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text("x" * 101)
    assert err(read_text, p, "cluster", max_bytes=100) == (
        f"{p}: cluster file is 101 bytes, over the 100-byte limit; fix: give the right file "
        f"(a cluster file is far smaller)")
    p.write_text("x" * 100)
    assert read_text(p, "cluster", max_bytes=100) == "x" * 100


def test_nul_byte_is_a_binary_file(tmp_path):
    p = tmp_path / "a.out"
    p.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00")
    assert err(read_text, p, "cluster") == (
        f"{p}: cluster file has a NUL byte at offset 7: a binary file, not text; "
        f"fix: give the cluster as UTF-8 text")


def test_not_utf8_names_the_offset(tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes("name: caf".encode() + b"\xe9\n")
    assert err(read_text, p, "device profile") == (
        f"{p}: device profile file is not UTF-8 (byte 0xe9 at offset 9); fix: save it as UTF-8 text")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_unreadable(tmp_path):
    p = tmp_path / "secret.yaml"
    p.write_text("a: 1\n")
    p.chmod(0)
    assert err(read_text, p, "cluster") == (
        f"{p}: cannot read the cluster file (Permission denied); fix: check its permissions")


# ----------------------------------------------------------------------------- YAML
def write(tmp_path, text: str, name: str = "f.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_yaml_good_with_a_few_aliases(tmp_path):
    p = write(tmp_path, "a: &x {b: 1}\nc: *x\nd: [*x, 2.5]\n")
    assert read_yaml(p, "cluster") == {"a": {"b": 1}, "c": {"b": 1}, "d": [{"b": 1}, 2.5]}


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    p = write(tmp_path, "meshes: [ {name: a, device: h100-sxm\n")
    assert err(read_yaml, p, "cluster") == (
        f"{p}: malformed YAML at line 2, column 1 (expected ',' or '}}', but got '<stream end>'); "
        f"fix: correct the YAML syntax")


def test_yaml_unsafe_tag_is_refused(tmp_path):
    p = write(tmp_path, "a: !!python/object/apply:os.system ['true']\n")
    msg = err(read_yaml, p, "cluster")
    assert msg.startswith(f"{p}: malformed YAML at line 1, column 4 (could not determine a constructor")


def test_yaml_deep_flow_nesting_fails_fast(tmp_path):
    p = write(tmp_path, "a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert err(read_yaml, p, "cluster") == (
        f"{p}: cluster nests deeper than {MAX_DEPTH} levels at line 1, column {4 + MAX_DEPTH - 1}; "
        f"fix: give a real cluster file (they nest a few levels)")


def test_yaml_deep_block_nesting(tmp_path):
    p = write(tmp_path, "".join(" " * i + f"k{i}:\n" for i in range(2000)))
    assert "nests deeper than 32 levels at line 32, column 32" in err(read_yaml, p, "cluster")


def test_yaml_depth_limit_is_inclusive(tmp_path):
    p = write(tmp_path, "[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert read_yaml(p, "cluster") is not None
    p = write(tmp_path, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    assert "nests deeper" in err(read_yaml, p, "cluster")


def test_yaml_too_many_aliases(tmp_path):
    p = write(tmp_path, "a: &x 1\nb: [" + ", ".join(["*x"] * (MAX_ALIASES + 1)) + "]\n")
    assert err(read_yaml, p, "cluster") == (
        f"{p}: cluster uses more than {MAX_ALIASES} YAML aliases at line 2, column "
        f"{5 + 4 * MAX_ALIASES}; fix: write the values out instead of '*alias' references")


def test_yaml_billion_laughs(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    p = write(tmp_path, "\n".join(lines) + "\n")
    assert err(read_yaml, p, "cluster") == (
        f"{p}: cluster expands to more than 100000 values through its 72 YAML aliases "
        f"(an alias bomb); fix: write the values out")


def test_yaml_recursive_alias(tmp_path):
    p = write(tmp_path, "a: &x [1, *x]\n")
    assert err(read_yaml, p, "cluster") == (
        f"{p}: cluster alias *x at line 1, column 11 refers to a node that contains it; "
        f"fix: remove the self-reference")


@pytest.mark.parametrize("text,where,shown", [
    ("a: {b: [1, .inf]}\n", "a.b[1]", "inf"),
    ("a: -.inf\n", "a", "-inf"),
    ("meshes:\n- {latency_us: .nan}\n", "meshes[0].latency_us", "nan"),
    ("a: 1.0e+999\n", "a", "inf"),
])
def test_yaml_non_finite_names_the_key_path(tmp_path, text, where, shown):
    p = write(tmp_path, text)
    assert err(read_yaml, p, "cluster") == (
        f"{p}: {where} = {shown} is not a finite number; fix: use a finite number")


def test_yaml_huge_integer(tmp_path):
    p = write(tmp_path, "a: " + "9" * 5000 + "\n")
    assert err(read_yaml, p, "cluster").startswith(
        f"{p}: cluster has a value that cannot be read (Exceeds the limit (4300 digits)")


def test_yaml_control_character(tmp_path):
    p = write(tmp_path, "a: b\x07\n")
    assert err(read_yaml, p, "cluster") == (
        f"{p}: malformed YAML (unacceptable character #x0007: special characters are not "
        f"allowed in \"<unicode string>\", position 4); fix: correct the YAML syntax")


# ----------------------------------------------------------------------------- JSON
FIX = "regenerate it with 'mpmd plan'"


def test_json_good(tmp_path):
    p = write(tmp_path, '{"a": [1, 2.5, {"b": null}]}', "p.json")
    assert read_json(p, "plan JSON") == {"a": [1, 2.5, {"b": None}]}


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1E+400"])
def test_json_non_finite(tmp_path, literal):
    p = write(tmp_path, '{"a": %s}' % literal, "p.json")
    assert err(read_json, p, "plan JSON", fix=FIX) == (
        f"{p}: plan JSON holds the non-finite number {literal}; fix: {FIX}")


def test_json_malformed_names_line_and_column(tmp_path):
    p = write(tmp_path, '{\n "a": }', "p.json")
    assert err(read_json, p, "plan JSON", fix=FIX) == (
        f"{p}: malformed JSON at line 2, column 7 (Expecting value); fix: {FIX}")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_json_deep_nesting(tmp_path, depth):
    p = write(tmp_path, "[" * depth + "]" * depth, "p.json")
    assert err(read_json, p, "plan JSON") == (
        f"{p}: plan JSON nests deeper than {MAX_DEPTH} levels; "
        f"fix: give a real plan JSON file (they nest a few levels)")


def test_json_depth_limit_is_inclusive(tmp_path):
    p = write(tmp_path, "[" * MAX_DEPTH + "]" * MAX_DEPTH, "p.json")
    assert read_json(p, "plan JSON") is not None


def test_json_huge_integer(tmp_path):
    p = write(tmp_path, '{"a": %s}' % ("9" * 5000), "p.json")
    assert "plan JSON has a value that cannot be read (Exceeds the limit" in err(read_json, p, "plan JSON")


# ----------------------------------------------------------------------------- CSV
def test_csv_rows(tmp_path):
    p = write(tmp_path, "a,b\n1,x\n2\n", "v.csv")
    assert read_csv_rows(p, "validation CSV") == [{"a": "1", "b": "x"}, {"a": "2", "b": None}]


def test_csv_without_header(tmp_path):
    p = write(tmp_path, "", "v.csv")
    assert err(read_csv_rows, p, "validation CSV") == (
        f"{p}: validation CSV file has no header line; fix: start it with the column names")


def test_csv_field_over_the_csv_module_limit(tmp_path):
    p = write(tmp_path, "a,b\n1," + "x" * 200_000 + "\n", "v.csv")
    assert err(read_csv_rows, p, "validation CSV") == (
        f"{p}: malformed CSV at line 2 (field larger than field limit (131072)); fix: correct that line")


def test_csv_binary(tmp_path):
    p = tmp_path / "v.csv"
    p.write_bytes(b"a,b\n1,\x00\n")
    assert "NUL byte at offset 6" in err(read_csv_rows, p, "validation CSV")


# ----------------------------------------------------------------------------- check_finite
def test_check_finite_walks_iteratively_and_names_keys():
    deep: list = [float("nan")]
    for _ in range(5000):           # deeper than Python's recursion limit
        deep = [deep]
    with pytest.raises(InputError) as e:
        check_finite({"x": deep}, "w")
    assert str(e.value).startswith("w: x[0][0]") and "= nan is not a finite number" in str(e.value)
    check_finite({"a": [1, 2.0, "inf", {"b": -3e300}]}, "w")   # strings are not numbers


def test_check_finite_key():
    with pytest.raises(InputError, match=r"w: key inf under a is not a finite number"):
        check_finite({"a": {float("inf"): 1}}, "w")


# ----------------------------------------------------------------------------- write_atomic
def test_write_atomic_and_permissions(tmp_path):
    out = tmp_path / "sub" / "o.json"
    old = os.umask(0o022)
    try:
        write_atomic(out, "hello")
    finally:
        os.umask(old)
    assert out.read_text() == "hello"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert sorted(p.name for p in out.parent.iterdir()) == ["o.json"]


def test_write_atomic_failure_leaves_nothing(tmp_path):
    out = tmp_path / "o.json"
    with pytest.raises(TypeError):
        write_atomic(out, 123)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_leaf_module_imports_no_project_package():
    import ast

    tree = ast.parse(open(files.__file__).read())
    mods = {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    mods |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert mods <= {"__future__", "csv", "io", "json", "math", "os", "stat", "tempfile", "pathlib",
                    "typing", "yaml"}


def test_output_reexports_write_atomic():
    from mpmd.cli.output import write_atomic as old

    assert old is write_atomic
