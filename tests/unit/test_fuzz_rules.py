"""Fuzzing the rule loader with mutants of the shipped rule files, and the YAML safety rules.

Every mutant either loads as a whole, valid rule set or raises ``RulesInvalid`` whose every
problem is one ``FILE:LINE:COL: message`` line pointing inside the file; no other exception,
and never part of a set. The seeds are ``rules/definitions/*.yaml``. Text mutations delete,
repeat, swap and re-indent lines, cut the file, and insert YAML syntax (tags, anchors,
aliases, merge keys, flow brackets, quotes, tabs, control characters); data mutations delete,
repeat, retype, swap and rename keys and dump the result as YAML again.
"""

from __future__ import annotations

import copy
import io
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from costline.connectors.plugins import PLUGINS
from costline.rules.kinds import KINDS
from costline.rules.loader import RuleSet, RulesInvalid, load_rule_text, load_rules
from costline.rules.prices import PriceBook
from costline.rules.yaml_source import MAX_BYTES, MAX_DEPTH, SourceInvalid, load_document
from costline.streams.settings import DEFAULT_PRICES, DEFAULT_RULES
from costline.streams.worker.evaluator import RuleSource
from costline.streams.worker.health import Health

REPO = Path(__file__).resolve().parents[2]
SEEDS = {path.name: path.read_text() for path in sorted(DEFAULT_RULES.glob("*.yaml"))}
SEED_DATA = {name: load_document(name, text).data for name, text in SEEDS.items()}
FILE = "fuzzed.yaml"
PROBLEM = re.compile(r"(?P<file>[^\n]+?):(?P<line>\d+):(?P<col>\d+): (?P<message>\S[^\n\r]*)")
LINE_BREAK = re.compile("\r\n|[\n\r]")  # how YAML (and the positions) count lines
HANG_GUARD_S = 60.0  # only stops a hang from stalling the suite; not a performance target
FUZZ = settings(deadline=None, max_examples=120,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

SNIPPETS = [
    "&a ", "*a", "&a [1, 2]", "<<: *a", "!!python/object/apply:os.system ['true'] ",
    "!!python/name:os.system ", "!!str ", "!!binary ", "!local ", "!<tag:yaml.org,2002:str> ",
    "? ", "- ", ": ", "{", "}", "[", "]", "'", '"', "\t", "\n", "  ", "#", "|", ">-", "---\n",
    "...\n", "%YAML 1.1\n", "%TAG ! tag:x,2000:\n", "~", "null", "1e999", "9" * 400, "-0",
    ".inf", ".nan", "0x1F", "0o17", "2026-01-01", "yes", "\u2028", "\x85", "\ufeff", "\x00",
    "\x1b[2J", "\U0001f600", "é", "\r", "\\", "%", "@", "`",
]
ODD_VALUES: list[Any] = [
    None, True, 0, -1, 2**64, 1e308, float("inf"), "", "0s", "-5m", "7d", "1y", "*", "[",
    [], {}, [1, "a"], {"a": None}, "#chan", "route_by_tag", "dry_run", "x" * 300,
]


def yaml_text(data: Any) -> str:
    out = io.StringIO()
    YAML(typ="rt", pure=True).dump(data, out)
    return out.getvalue()


def lines_of(text: str) -> list[str]:
    return LINE_BREAK.split(text)


@st.composite
def text_mutants(draw: st.DrawFn) -> str:
    """A shipped rule file after one to four edits of its text."""
    text = SEEDS[draw(st.sampled_from(sorted(SEEDS)))]
    for _ in range(draw(st.integers(1, 4))):
        lines = text.split("\n")
        at = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(
            ["delete", "repeat", "swap", "indent", "insert", "value", "cut", "char"]))
        if op == "delete":
            del lines[at]
        elif op == "repeat":
            lines.insert(at, lines[draw(st.integers(0, len(lines) - 1))])
        elif op == "swap":
            other = draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], lines[at]
        elif op == "indent":
            lines[at] = " " * draw(st.integers(0, 7)) + lines[at].lstrip(" ")
        elif op == "insert":
            line = lines[at]
            cut = draw(st.integers(0, len(line)))
            lines[at] = line[:cut] + draw(st.sampled_from(SNIPPETS)) + line[cut:]
        elif op == "value" and ":" in lines[at]:
            key = lines[at].split(":", 1)[0]
            lines[at] = f"{key}: {yaml_text(draw(st.sampled_from(ODD_VALUES))).strip()}"
        elif op == "cut":
            return "\n".join(lines)[: draw(st.integers(0, len(text)))]
        elif op == "char":
            joined = "\n".join(lines)
            cut = draw(st.integers(0, len(joined)))
            char = draw(st.characters(codec=None, exclude_categories=()))
            lines = (joined[:cut] + char + joined[cut + 1:]).split("\n")
        text = "\n".join(lines)
    return text


@st.composite
def data_mutants(draw: st.DrawFn) -> str:
    """A shipped rule file loaded, changed as data (keys and values), and written back."""
    data = copy.deepcopy(SEED_DATA[draw(st.sampled_from(sorted(SEEDS)))])
    rules: list[dict[str, Any]] = data["rules"]
    for _ in range(draw(st.integers(1, 4))):
        rule = rules[draw(st.integers(0, len(rules) - 1))] if rules else {}
        keys = sorted(rule)
        op = draw(st.sampled_from(
            ["delete", "retype", "swap", "rename", "unknown", "repeat", "kind", "drop_rule"]))
        if op == "delete" and keys:
            del rule[draw(st.sampled_from(keys))]
        elif op == "retype" and keys:
            rule[draw(st.sampled_from(keys))] = draw(st.sampled_from(ODD_VALUES))
        elif op == "swap" and keys:
            one, two = draw(st.sampled_from(keys)), draw(st.sampled_from(keys))
            rule[one], rule[two] = rule[two], rule[one]
        elif op == "rename" and keys:
            rule[draw(st.sampled_from(sorted(set(keys) | {"Name", "kind ", "for", "mode"})))] = (
                rule.pop(draw(st.sampled_from(keys))))
        elif op == "unknown":
            rule[draw(st.sampled_from(["limit", "window", "ratio", "exempt", "x-extra"]))] = 1
        elif op == "repeat" and rules:
            rules.append(copy.deepcopy(draw(st.sampled_from(rules))))
        elif op == "kind":
            rule["kind"] = draw(st.sampled_from([*sorted(KINDS), "Budget", "", None]))
        elif op == "drop_rule" and rules:
            rules.pop()
    return yaml_text(data)


def check(text: str) -> RuleSet | RulesInvalid:
    """The loader's promise for one file: a whole valid set, or only well-placed problems."""
    try:
        rules = load_rule_text(text, file=FILE, plugins=PLUGINS)
    except RulesInvalid as invalid:
        check_problems(invalid, {FILE: text})
        return invalid
    assert isinstance(rules, RuleSet)
    names = [rule.name for rule in rules]
    assert len(names) == len(set(names))
    assert all(rule.kind in KINDS for rule in rules)
    assert len(rules.sources) == len(rules.rules)
    return rules


def check_problems(invalid: RulesInvalid, texts: dict[str, str]) -> None:
    """Each problem is one ``FILE:LINE:COL: message`` line inside a file that was loaded."""
    assert invalid.errors
    for error in invalid.errors:
        found = PROBLEM.fullmatch(str(error))
        assert found, repr(str(error))
        assert found["file"] in texts, str(error)
        lines = lines_of(texts[found["file"]])
        line, col = int(found["line"]), int(found["col"])
        assert 1 <= line <= len(lines), str(error)
        assert 1 <= col <= len(lines[line - 1]) + 1, str(error)


def within(limit_s: float, work: Callable[[], Any]) -> Any:
    """``work()``'s result or exception, or a failure if it is still running after ``limit_s``."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the test below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"still running after {limit_s}s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# ── fuzzing ─────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_every_seed_loads_as_a_valid_rule_set(name):
    assert len(check(SEEDS[name])) >= 1


@FUZZ
@given(text_mutants())
@example("rules:\n  - name: a\x00b\n")
@example("rules:\n  - name: x\n    kind: budget\n    limit: 1\n\x85\u2028    period: \x07\n")
@example("rules: " + "[" * 200)
def test_text_mutants_load_whole_or_fail_with_positioned_problems(text):
    check(text)


@settings(FUZZ, max_examples=80)
@given(data_mutants())
def test_data_mutants_load_whole_or_fail_with_positioned_problems(text):
    check(text)


@settings(FUZZ, max_examples=25)
@given(text_mutants(), st.sampled_from(sorted(SEEDS)), st.booleans())
def test_a_directory_with_one_bad_file_loads_nothing_and_reports_all_its_problems(
        bad_text, good_name, bad_first):
    assume(not any("\ud800" <= char <= "\udfff" for char in bad_text))  # not writable as UTF-8
    alone = check(bad_text)
    assume(isinstance(alone, RulesInvalid))
    with tempfile.TemporaryDirectory() as folder:
        good = Path(folder, ("b-" if bad_first else "a-") + good_name)
        bad = Path(folder, ("a-" if bad_first else "b-") + "mutant.yaml")
        good.write_text(SEEDS[good_name])
        bad.write_bytes(bad_text.encode())
        with pytest.raises(RulesInvalid) as caught:
            load_rules([folder], plugins=PLUGINS)
    texts = {str(good): SEEDS[good_name], str(bad): bad_text}
    check_problems(caught.value, texts)
    assert {problem(e) for e in alone.errors} <= {
        problem(e) for e in caught.value.errors if e.file == str(bad)}


def problem(error: Any) -> tuple[int, int, str]:
    """Where and what, without the file a repeated name was first defined in."""
    return error.line, error.col, error.message.split(" (first defined at ")[0]


def test_a_reload_with_a_bad_file_keeps_the_last_good_set_and_says_why(tmp_path):
    for name, text in SEEDS.items():
        (tmp_path / name).write_text(text)
    health = Health()
    source = RuleSource(tmp_path, "UTC", PriceBook.load(DEFAULT_PRICES), health)
    before = source.rules()
    assert len(before) == sum(len(load_rule_text(t, plugins=PLUGINS)) for t in SEEDS.values())
    (tmp_path / "zz-broken.yaml").write_text(SEEDS["budgets.yaml"].replace("limit: 1500",
                                                                          "limit: [1500"))
    assert source.rules() is before
    assert "rules" in health.problems and source.error and "zz-broken.yaml:" in source.error


def test_a_large_valid_file_loads_every_rule():
    rule = SEEDS["reliability.yaml"].split("rules:\n", 1)[1]
    text = "rules:\n" + "".join(rule.replace("fault-waste-share", f"share-{i}")
                                for i in range(150))
    assert len(within(HANG_GUARD_S, lambda: check(text))) == 150


def test_a_large_file_of_repeated_names_reports_every_repeat():
    rule = SEEDS["reliability.yaml"].split("rules:\n", 1)[1]
    text = "rules:\n" + rule * 150
    invalid = within(HANG_GUARD_S, lambda: check(text))
    assert isinstance(invalid, RulesInvalid)
    assert len(invalid.errors) == 149
    assert all("duplicate rule name 'fault-waste-share'" in e.message for e in invalid.errors)


def test_a_file_over_the_size_limit_is_refused_before_parsing(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("rules: []\n" + "#" * MAX_BYTES)
    with pytest.raises(RulesInvalid) as caught:
        within(HANG_GUARD_S, lambda: load_rules([path], plugins=PLUGINS))
    [error] = caught.value.errors
    assert (error.line, error.col) == (1, 1) and "larger than" in error.message


# ── YAML safety ─────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("template", [
    "rules: !!python/object/apply:os.mkdir ['{path}']\n",
    "rules:\n  - !!python/object/new:os.mkdir\n    args: ['{path}']\n",
    "rules:\n  - name: x\n    kind: !!python/object/apply:os.mkdir ['{path}']\n",
    "!!python/object/apply:os.mkdir ['{path}']\n",
    "rules: !!python/object/apply:subprocess.check_call [[mkdir, '{path}']]\n",
    "%TAG !p! tag:yaml.org,2002:python/object/apply:\n---\nrules: !p!os.mkdir ['{path}']\n",
])
def test_a_python_tag_in_a_rule_or_price_file_is_refused_and_never_run(tmp_path, template):
    target = tmp_path / "made-by-yaml"
    text = template.format(path=target)
    rules_file, prices_file = tmp_path / "rules.yaml", tmp_path / "prices.yaml"
    rules_file.write_text(text)
    prices_file.write_text(text.replace("rules:", "prices:"))
    with pytest.raises(RulesInvalid) as caught:
        load_rules([rules_file], plugins=PLUGINS)
    with pytest.raises(SourceInvalid):
        PriceBook.load(prices_file)
    assert not target.exists()
    assert any("YAML tags are not allowed" in e.message for e in caught.value.errors)


def billion_laughs(levels: int = 12) -> str:
    lines = ['a0: &a0 ["lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nrules: *a{levels - 1}\n"


@pytest.mark.parametrize("text", [
    billion_laughs(),
    "base: &b {kind: budget, period: day, limit: 1}\nrules:\n  - <<: *b\n    name: x\n",
    "rules:\n  - &r\n    name: x\n    kind: budget\n    period: day\n    limit: 1\n  - *r\n",
    "x: &x [*x]\nrules: []\n",
], ids=["billion-laughs", "merge-key", "repeated-rule", "self-reference"])
def test_aliases_are_refused_where_they_stand_without_being_expanded(text):
    with pytest.raises(RulesInvalid) as caught:
        within(HANG_GUARD_S, lambda: load_rule_text(text, file=FILE, plugins=PLUGINS))
    [error] = caught.value.errors
    assert error.message == "YAML aliases are not allowed"
    line = lines_of(text)[error.line - 1]
    assert line[error.col - 1] == "*"


@pytest.mark.parametrize("opener, closer", [("[", "]"), ("{a: ", "}"), ("- ", "")])
def test_nesting_past_the_limit_is_refused_at_its_position(opener, closer):
    if opener == "- ":
        deep = "".join(" " * (2 * i) + "-\n" for i in range(MAX_DEPTH + 200))
        text = "rules:\n" + deep
    else:
        text = "rules: " + opener * 200_000 + closer * 200_000 + "\n"
    with pytest.raises(RulesInvalid) as caught:
        within(HANG_GUARD_S, lambda: load_rule_text(text, file=FILE, plugins=PLUGINS))
    [error] = caught.value.errors
    assert error.message == f"nested deeper than {MAX_DEPTH} levels"
    check_problems(caught.value, {FILE: text})


def test_nesting_up_to_the_limit_is_still_yaml():
    text = "rules: []\nx: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"
    with pytest.raises(RulesInvalid) as caught:
        load_rule_text(text, file=FILE, plugins=PLUGINS)
    assert [e.message for e in caught.value.errors] == [
        "x: Extra inputs are not permitted"]


@pytest.mark.parametrize("text, position", [
    ("rules: []\nrules: []\n", (2, 1)),
    ("rules:\n  - name: a\n    kind: budget\n    name: b\n", (4, 5)),
    ("rules:\n  - name: a\n    notify: {slack: '#a', slack: '#b'}\n", (3, 27)),
    ("rules:\n  - name: a\n    'name': b\n", (3, 5)),
    ("rules:\n  - 1: a\n    '1': b\n", (3, 5)),
], ids=["top", "rule", "flow", "quoted", "number-and-text"])
def test_duplicate_keys_are_refused_at_the_repeat(text, position):
    with pytest.raises(RulesInvalid) as caught:
        load_rule_text(text, file=FILE, plugins=PLUGINS)
    [error] = caught.value.errors
    assert (error.line, error.col) == position and "duplicate key" in error.message


@pytest.mark.parametrize("limit", ["__import__('os').getcwd()", "2**40", "1e3 * 2", "'{{7*7}}'"])
def test_an_expression_in_a_rule_is_refused_as_text_not_evaluated(limit):
    text = SEEDS["budgets.yaml"].replace("limit: 1500", f"limit: \"{limit}\"")
    with pytest.raises(RulesInvalid) as caught:
        load_rule_text(text, file=FILE, plugins=PLUGINS)
    assert [e.message.split(":")[0] for e in caught.value.errors] == ["rules.1.limit"]


# A call, not a method of that name being defined (a Faust schema defines ``compile``).
CODE_EXECUTION = re.compile(r"(?<![\w.])(?<!def )(eval|exec|compile|__import__)\s*\(")
UNSAFE_LOADERS = re.compile(
    r"^\s*(import|from)\s+(pickle|marshal|shelve|yaml)\b|typ\s*=\s*['\"]unsafe['\"]"
    r"|\bLoader\s*=|\bunsafe_load\b", re.M)


def test_no_code_evaluates_text_or_loads_yaml_unsafely():
    sources = sorted(path for folder in ("rules", "connectors", "streams")
                     for path in (REPO / folder).rglob("*.py"))
    assert len([path for path in sources if path.parts[-2] == "rules"]) > 10
    found = [f"{path.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}"
             for path in sources for text in [path.read_text()]
             for m in [*CODE_EXECUTION.finditer(text), *UNSAFE_LOADERS.finditer(text)]]
    assert found == []


def test_the_code_scan_finds_what_it_looks_for():
    planted = "x = eval(s)\nexec (code)\nc = compile(s, 'f', 'exec')\nimport pickle\n" \
              "YAML(typ='unsafe')\nre.compile('ok')\nmodel.eval()\n" \
              "    def compile(self, app):\n"
    hits = [m.group(0) for m in [*CODE_EXECUTION.finditer(planted),
                                 *UNSAFE_LOADERS.finditer(planted)]]
    assert len(hits) == 5
