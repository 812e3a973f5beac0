"""Safe YAML with positions: every problem is reported as FILE:LINE:COL, 1-based."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from costline.rules.yaml_source import MAX_BYTES, SourceError, SourceInvalid, load_document

NESTED = """\
top:
  name: costline
  items:
    - name: x
    - name: y
      value: 3
"""


def problems(text: str) -> list[SourceError]:
    with pytest.raises(SourceInvalid) as caught:
        load_document("f.yaml", text)
    return caught.value.errors


def only_problem(text: str) -> SourceError:
    [error] = problems(text)
    return error


def only_problem_of_path(path: Path) -> SourceError:
    with pytest.raises(SourceInvalid) as caught:
        load_document(path)
    [error] = caught.value.errors
    return error


def test_a_document_loads_as_plain_dicts_and_lists():
    doc = load_document("f.yaml", NESTED)
    assert doc.data == {"top": {"name": "costline",
                                "items": [{"name": "x"}, {"name": "y", "value": 3}]}}
    assert type(doc.data) is dict
    assert type(doc.data["top"]["items"]) is list
    assert doc.file == "f.yaml"


@pytest.mark.parametrize(
    ("loc", "position"),
    [
        ((), (1, 1)),
        (("top",), (1, 1)),
        (("top", "name"), (2, 3)),
        (("top", "items"), (3, 3)),
        (("top", "items", 0), (4, 7)),
        (("top", "items", 1), (5, 7)),
        (("top", "items", 1, "value"), (6, 7)),
    ],
)
def test_positions_are_one_based_line_and_column(loc, position):
    assert load_document("f.yaml", NESTED).position(loc) == position


@pytest.mark.parametrize(
    ("loc", "position"),
    [
        (("top", "missing"), (1, 1)),
        (("top", "items", 7), (3, 3)),
        (("top", "items", 1, "value", "deeper"), (6, 7)),
    ],
)
def test_a_position_that_does_not_exist_falls_back_to_the_nearest_ancestor(loc, position):
    assert load_document("f.yaml", NESTED).position(loc) == position


def test_flow_mappings_have_positions_too():
    doc = load_document("f.yaml", "a:\n  b: {c: 1, d: 2}\n")
    assert doc.position(("a", "b", "d")) == (2, 13)


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    value: int = 0


class Items(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[Item]


def test_validation_errors_are_reported_at_the_field_they_are_about():
    doc = load_document("rules.yaml", "items:\n  - name: a\n  - name: b\n    value: many\n"
                                      "  - name: c\n    colour: red\n")
    with pytest.raises(ValidationError) as caught:
        Items.model_validate(doc.data)
    errors = doc.errors_from(caught.value)
    assert [str(e) for e in errors] == [
        "rules.yaml:4:5: items.1.value: Input should be a valid integer, "
        "unable to parse string as an integer",
        "rules.yaml:6:5: items.2.colour: Extra inputs are not permitted",
    ]


def test_errors_from_can_prefix_a_location_inside_the_document():
    doc = load_document("f.yaml", NESTED)
    with pytest.raises(ValidationError) as caught:
        Item.model_validate(doc.data["top"]["items"][1] | {"value": "x"})
    [error] = doc.errors_from(caught.value, base=("top", "items", 1))
    assert (error.line, error.col) == (6, 7)
    assert error.message.startswith("top.items.1.value: ")


def test_a_source_error_prints_as_file_line_col_message():
    assert str(SourceError("a.yaml", 3, 14, "boom")) == "a.yaml:3:14: boom"


def test_source_invalid_carries_every_error_and_prints_one_per_line():
    errors = [SourceError("a.yaml", 1, 1, "one"), SourceError("a.yaml", 2, 5, "two")]
    invalid = SourceInvalid(errors)
    assert invalid.errors == errors
    assert str(invalid) == "a.yaml:1:1: one\na.yaml:2:5: two"


@pytest.mark.parametrize(
    ("text", "position", "key"),
    [
        ("a: 1\nb: 2\na: 3\n", (3, 1), '"a"'),
        ("outer:\n  x: 1\n  y: 2\n  x: 1\n", (4, 3), '"x"'),
        ("rules:\n  - {name: n, name: m}\n", (2, 15), '"name"'),
    ],
)
def test_a_duplicate_key_is_refused_at_its_second_occurrence(text, position, key):
    error = only_problem(text)
    assert (error.line, error.col) == position
    assert "duplicate key" in error.message
    assert key in error.message


def test_keys_that_become_the_same_string_are_refused_as_duplicates():
    problems("prices:\n  1: first\n  '1': second\n")


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("a: &x 1\nb: *x\n", (2, 4)),
        ("base: &b {p: 1}\nthing:\n  <<: *b\n", (3, 7)),
        ("- &s [1, 2]\n- *s\n", (2, 3)),
    ],
)
def test_an_alias_is_refused_where_it_is_used(text, position):
    error = only_problem(text)
    assert (error.line, error.col) == position
    assert error.message == "YAML aliases are not allowed"


def test_a_billion_laughs_document_is_refused_without_expanding():
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        text += f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
    error = only_problem(text)
    assert error.line == 2
    assert error.message == "YAML aliases are not allowed"


def test_a_syntax_error_is_reported_with_its_position():
    error = only_problem("a: [1, 2\nb: 3\n")
    assert error.file == "f.yaml"
    assert error.line >= 2
    assert "expected ',' or ']'" in error.message


def test_a_tab_indentation_error_is_reported_with_its_position():
    error = only_problem("a:\n\tb: 1\n")
    assert (error.line, error.col) == (2, 1)
    assert error.message


def test_a_file_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("team: équipe\n".encode("latin-1"))
    with pytest.raises(SourceInvalid) as caught:
        load_document(path)
    assert [str(e) for e in caught.value.errors] == [f"{path}:1:1: not UTF-8 text"]


def test_a_utf8_file_with_accents_loads(tmp_path):
    path = tmp_path / "utf8.yaml"
    path.write_text("team: équipe\n", encoding="utf-8")
    assert load_document(path).data == {"team": "équipe"}


def test_a_file_larger_than_one_mebibyte_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    body = b"a: 1\n#"
    path.write_bytes(body + b"x" * (MAX_BYTES + 1 - len(body)))
    assert path.stat().st_size == MAX_BYTES + 1
    error = only_problem_of_path(path)
    assert (error.line, error.col) == (1, 1)
    assert error.message == f"larger than {MAX_BYTES} bytes"


def test_a_file_of_exactly_one_mebibyte_loads(tmp_path):
    path = tmp_path / "edge.yaml"
    body = b"a: 1\n#"
    path.write_bytes(body + b"x" * (MAX_BYTES - len(body)))
    assert path.stat().st_size == MAX_BYTES
    assert load_document(path).data == {"a": 1}


def test_a_missing_file_is_reported_as_unreadable(tmp_path):
    path = tmp_path / "absent.yaml"
    error = only_problem_of_path(path)
    assert str(error).startswith(f"{path}:1:1: cannot read: ")


PLAIN = (dict, list, str, int, float, bool, type(None), date)


def is_plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(type(k) is str and is_plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(is_plain(v) for v in value)
    return type(value) in PLAIN


def load_or_none(text: str) -> Any:
    try:
        return load_document("f.yaml", text).data
    except SourceInvalid:
        return None


@pytest.mark.parametrize(
    "template",
    [
        "a: !!python/object/apply:os.mkdir ['{path}']\n",
        "a: !!python/object/apply:os.mkdir\n  args: ['{path}']\n",
        "a: !!python/object/new:os.mkdir\n  args: ['{path}']\n",
        "!!python/object/apply:os.mkdir ['{path}']\n",
        "a: !!python/object:pathlib.Path {{path: '{path}'}}\n",
    ],
)
def test_a_python_tag_is_never_constructed(tmp_path, template):
    target = tmp_path / "made-by-yaml"
    data = load_or_none(template.format(path=target))
    assert not target.exists()
    assert data is None or is_plain(data)


@pytest.mark.parametrize("text", ["a: !!python/name:os.system\n", "a: !!python/str hello\n",
                                  "a: !custom hello\n"])
def test_a_tagged_scalar_is_refused_or_kept_as_plain_data(text):
    data = load_or_none(text)
    assert data is None or is_plain(data)
