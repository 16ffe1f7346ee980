"""Inventory of kcm's public names, both ways: every name the docs give must exist in the code, and every name the
code offers must be in the docs. Compared: each `kcm <command>`'s options (the argparse parsers, built in-process)
with that command's options table (docs/demo.md, tail.md, sandbox.md, subscriptions.md, operator.md, bridge.md,
rollups.md; README.md for the options of every command) and the table's default column; the Prometheus metrics
the bridge and the operator register with every `kcm_...` name in the docs and the chart's alert rules (counters as
`<name>_total`, labels where a doc gives them); the bridge's YAML keys (its config dataclasses) with docs/bridge.md's
full example, and its `KCM_BRIDGE_*` variables (as its own start-up warning lists them) with the precedence
paragraph; the operator's condition reasons, Event reasons and `kcm.dev/` annotations with docs/operator.md; the
receiver plugin's `kcm.receiver.*` properties and JMX attributes (Java source) with docs/receiver.md; the rollup's
output columns (`aggregate.finish` run on a recording stand-in, plus the columns the job adds) with docs/rollups.md;
the chart's values.yaml keys with its README's values table.

Extraction is by exact rules: markdown table cells split on unescaped `|`, names taken from code spans only.
`KCM_DOCINV_ROOT` points the docs, Java and chart reads at a copy of the tree (to check the test can fail); the
Python code is whatever `kcm_*` packages import first (PYTHONPATH)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import logging
import os
import re
import types
import typing
from pathlib import Path

import pytest
import yaml

ROOT = Path(os.environ.get("KCM_DOCINV_ROOT") or Path(__file__).resolve().parents[1])
DOCS = ROOT / "docs"
CHART = ROOT / "charts" / "kafka-client-metrics"
RECEIVER_SOURCES = ROOT / "receiver" / "src" / "main" / "java" / "dev" / "kcm" / "receiver"

# Each subcommand's options table: (doc, first header cell of the table).
COMMAND_DOCS = {
    "demo": ("demo.md", "option"),
    "tail": ("tail.md", "option"),
    "sandbox": ("sandbox.md", "option"),
    "subscriptions": ("subscriptions.md", "action"),
    "operator": ("operator.md", "option"),
    "bridge": ("bridge.md", "flag"),
    "rollup": ("rollups.md", "option"),
}
# Options argparse adds by itself: not kcm's to document.
ARGPARSE_OWN = {"-h", "--help"}
# Default cells that describe rather than state a value (checked by the commands' own model tests).
NO_DEFAULT = {"—", "none", "unlimited", "random"}


# --- extraction -------------------------------------------------------------------------------------------------------

def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _cells(line: str) -> list[str]:
    inner = line.strip()[1:-1] if line.strip().endswith("|") else line.strip()[1:]
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", inner)]


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table: (header cells, body rows' cells)."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|[\s:|-]+\|?", lines[i + 1].strip()) and (
                i == 0 or not lines[i - 1].startswith("|")):
            rows = []
            for body in lines[i + 2:]:
                if not body.startswith("|"):
                    break
                rows.append(_cells(body))
            found.append((_cells(line), rows))
    return found


def table(text: str, first_header: str) -> list[list[str]]:
    """The rows of the one table whose first header cell is `first_header`."""
    matching = [rows for header, rows in tables(text) if header[0].lower() == first_header]
    assert len(matching) == 1, f"expected one table headed {first_header!r}, found {len(matching)}"
    return matching[0]


def spans(text: str) -> list[str]:
    """The code spans of `text` (a span may wrap a line; fenced blocks are not spans)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)]


def flags_in(text: str) -> list[str]:
    """The option spellings (`--x`, `-x`) in the code spans of `text`."""
    return [flag for span in spans(text) for flag in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", span)]


def section(text: str, heading: str) -> str:
    """The body of the markdown section `heading` (up to the next heading of any level)."""
    match = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#|\Z)", text, re.S | re.M)
    assert match, f"no section {heading!r}"
    return match.group(1)


def _source(module: str) -> str:
    """The source text of a kcm module, wherever it is imported from (PYTHONPATH first), without importing it."""
    return Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8")


# --- the `kcm` command's options --------------------------------------------------------------------------------------

def _parsers() -> dict[str, argparse.ArgumentParser]:
    """`kcm`'s top-level parser ("") and each (sub-)command's, as "tail" or "subscriptions apply"."""
    from kcm_cli.main import build_parser

    found: dict[str, argparse.ArgumentParser] = {}

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        found[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(f"{name} {sub_name}".strip(), sub)

    walk("", build_parser())
    return found


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions
            if action.option_strings and not set(action.option_strings) <= ARGPARSE_OWN]


def _global_flags() -> set[str]:
    """Options README.md documents for every command: "`--log-level` is accepted before or after the subcommand"."""
    return {flag for line in _text(ROOT / "README.md").splitlines() if "before or after the subcommand" in line
            for flag in flags_in(line)}


def _top_level_flags() -> set[str]:
    """Options README.md documents for `kcm` itself: the lines naming `kcm --…`, and every command's."""
    return _global_flags() | {flag for line in _text(ROOT / "README.md").splitlines() if "`kcm --" in line
                              for flag in flags_in(line)}


def documented_flags(command: str) -> dict[str, set[str]]:
    """What the docs give each parser of `command`: the options table's flags (for `subscriptions`, each action's
    row, and the intro's flags every action takes), and README's options of every command."""
    doc, first_header = COMMAND_DOCS[command]
    text = _text(DOCS / doc)
    rows = table(text, first_header)
    if command == "subscriptions":
        intro = text.split("\n|", 1)[0]
        return {f"{command} {row[0].strip('`').split()[0]}": set(flags_in(row[0])) | set(flags_in(intro))
                | _global_flags() for row in rows}
    return {command: {flag for row in rows for flag in flags_in(row[0])} | _global_flags()}


CLI_CASES = [pytest.param(command, id=command) for command in COMMAND_DOCS]


def test_every_command_has_its_doc():
    assert sorted(name for name in _parsers() if name and " " not in name) == sorted(COMMAND_DOCS)


@pytest.mark.parametrize("command", CLI_CASES)
def test_every_option_a_command_has_is_in_its_doc(command):
    parsers = _parsers()
    for name, flags in documented_flags(command).items():
        assert name in parsers, f"{COMMAND_DOCS[command][0]} documents `kcm {name}`, which does not exist"
        undocumented = [action.option_strings for action in _options(parsers[name])
                        if not set(action.option_strings) & flags]
        assert not undocumented, f"kcm {name}: options missing from {COMMAND_DOCS[command][0]}: {undocumented}"


@pytest.mark.parametrize("command", CLI_CASES)
def test_every_long_spelling_of_an_option_is_in_its_doc(command):
    # The names an issue gives are public: a script may use `--output` where the doc shows `-o`.
    parsers = _parsers()
    for name, flags in documented_flags(command).items():
        missing = [flag for action in _options(parsers[name]) for flag in action.option_strings
                   if flag.startswith("--") and flag not in flags]
        assert missing == [], f"kcm {name}: long options missing from {COMMAND_DOCS[command][0]}: {missing}"


@pytest.mark.parametrize("command", CLI_CASES)
def test_every_option_a_commands_doc_lists_exists(command):
    parsers = _parsers()
    for name, flags in documented_flags(command).items():
        offered = {flag for action in _options(parsers[name]) for flag in action.option_strings}
        assert flags - offered == set(), f"{COMMAND_DOCS[command][0]}: kcm {name} has no {sorted(flags - offered)}"


def _default_rows() -> list[tuple[str, str, str]]:
    """(command, flag, default cell) of the options tables that have a default column."""
    found = []
    for command, (doc, first_header) in COMMAND_DOCS.items():
        for header, rows in tables(_text(DOCS / doc)):
            if header[0].lower() == first_header and len(header) > 2 and header[1].lower() == "default":
                found += [(command, flag, row[1]) for row in rows for flag in flags_in(row[0])]
    return found


def test_the_default_columns_exist():
    assert {command for command, _, _ in _default_rows()} == {"demo", "tail", "sandbox", "operator"}


@pytest.mark.parametrize("command", [c for c in COMMAND_DOCS if c in ("demo", "tail", "sandbox", "operator")])
def test_every_documented_default_is_the_parsers(command):
    parsers = _parsers()
    actions = {flag: action for action in _options(parsers[command]) for flag in action.option_strings}
    # `--log-level` after the subcommand defers to the one before it (SUPPRESS), whose default is the command's.
    actions |= {flag: action for action in _options(parsers[""]) for flag in action.option_strings
                if actions.get(flag) is not None and actions[flag].default == argparse.SUPPRESS}
    checked = 0
    for _, flag, cell in (row for row in _default_rows() if row[0] == command):
        action, value = actions[flag], cell.strip("`")
        if value == "required":
            assert action.required, f"kcm {command} {flag}: documented required"
        elif value == "off":
            assert isinstance(action, argparse._StoreTrueAction) and not action.default, f"kcm {command} {flag}"
        elif value.lower() in NO_DEFAULT or " " in value or action.default is None:
            # Described, not stated, or left to the component the option feeds (the parser passes None on).
            continue
        elif re.fullmatch(r"\d+(\.\d+)?", value):
            assert float(action.default) == float(value), f"kcm {command} {flag}: {action.default!r}, doc {value}"
        else:
            assert str(action.default) == value, f"kcm {command} {flag}: {action.default!r}, doc {value}"
        checked += 1
    assert checked >= 3


def test_the_sandbox_defaults_its_parser_leaves_open_are_the_documented_ones():
    # `--telemetry-max-bytes`, `--connections-max-idle-ms`, `--receiver-api` reach the sandbox unset (None): their
    # documented defaults are the options `kcm sandbox` builds from no flags.
    from kcm_cli.sandbox import options_from

    options = options_from(_parsers()["sandbox"].parse_args([]))
    checked = 0
    for _, flag, cell in (row for row in _default_rows() if row[0] == "sandbox"):
        value = cell.strip("`")
        if value.lower() in NO_DEFAULT or " " in value:
            continue
        field = flag.lstrip("-").replace("-", "_")
        if field == "log_level":   # every command's, not the sandbox's: test_every_documented_default_is_the_parsers
            continue
        actual = getattr(options, field)
        if field in ("listen", "compression"):   # parsed forms, checked by the sandbox's own model test
            continue
        expected = int(value) if value.isdigit() and not isinstance(actual, str) else value
        assert actual == expected, f"kcm sandbox {flag}: {actual!r}, doc {value}"
        checked += 1
    assert checked >= 6


def test_the_top_level_options_are_documented():
    documented = _top_level_flags()
    missing = [action.option_strings for action in _options(_parsers()[""]) if not set(action.option_strings)
               & documented]
    assert not missing, f"kcm's own options missing from README.md: {missing}"


# --- Prometheus metrics -----------------------------------------------------------------------------------------------

def code_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every metric kcm registers: exposed name (counters with `_total`) -> (type, label names)."""
    from prometheus_client.metrics import MetricWrapperBase

    from kcm_bridge.metrics import BridgeMetrics

    wrappers = list(vars(BridgeMetrics()).values()) + list(vars(importlib.import_module("kcm_operator.metrics"))
                                                            .values())
    found = {}
    for metric in wrappers:
        if isinstance(metric, MetricWrapperBase):
            name = metric._name + ("_total" if metric._type == "counter" else "")
            found[name] = (metric._type, tuple(metric._labelnames))
    return found


PACKAGES = {"kcm_bridge", "kcm_operator", "kcm_rollups", "kcm_common", "kcm_cli", "kcm_sandbox", "kcm_demo",
            "kcm_kafka"}   # kcm_kafka: the rollup's Spark source name (rollups.md)


def documented_metrics() -> list[tuple[str, str, tuple[str, ...] | None]]:
    """(where, name, labels or None) of every `kcm_...` metric named in the docs and the chart's alerts."""
    places = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), CHART / "README.md",
              *sorted((CHART / "templates").rglob("*.yaml"))]
    found = []
    for place in places:
        for name, labels in re.findall(r"\b(kcm_[a-z_]+)(\{[a-z_,]*\})?", _text(place)):
            if name not in PACKAGES:
                found.append((place.name, name, tuple(labels.strip("{}").split(",")) if labels else None))
    return found


def _exposed(name: str, metrics: dict[str, tuple[str, tuple[str, ...]]]) -> str | None:
    """The registered metric a scraped series name belongs to (a histogram's `_bucket`/`_sum`/`_count` too)."""
    if name in metrics:
        return name
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    return base if metrics.get(base, ("",))[0] == "histogram" else None


def test_every_metric_the_docs_name_exists_with_those_labels():
    metrics = code_metrics()
    named = documented_metrics()
    assert {name for _, name, _ in named} >= {"kcm_bridge_lag", "kcm_operator_reconcile_duration_seconds"}
    for where, name, labels in named:
        assert _exposed(name, metrics), f"{where} names metric {name}, which kcm does not register"
        if labels is not None:
            assert sorted(labels) == sorted(metrics[_exposed(name, metrics)][1]), f"{where}: {name}{labels}"


def test_every_metric_kcm_registers_is_documented():
    documented = {name for where, name, _ in documented_metrics() if where.endswith(".md")}   # not the alerts
    metrics = code_metrics()
    assert len(metrics) >= 19
    assert sorted(set(metrics) - documented) == []


# --- the bridge's configuration ---------------------------------------------------------------------------------------

def _fields(cls: type, prefix: str = "") -> set[str]:
    """Dotted YAML keys of a config dataclass; a list of dataclasses adds its items' keys, a free mapping is one."""
    found = set()
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        path, kind = prefix + field.name, hints[field.name]
        found.add(path)
        if typing.get_origin(kind) is list and dataclasses.is_dataclass(typing.get_args(kind)[0]):
            kind = typing.get_args(kind)[0]
        if dataclasses.is_dataclass(kind):
            found |= _fields(kind, path + ".")
    return found


def _yaml_keys(value: object, prefix: str = "", free: frozenset[str] = frozenset()) -> set[str]:
    found = set()
    if isinstance(value, list):
        for item in value:
            found |= _yaml_keys(item, prefix, free)
    elif isinstance(value, dict):
        for key, inner in value.items():
            found.add(prefix + key)
            if prefix + key not in free:
                found |= _yaml_keys(inner, prefix + key + ".", free)
    return found


def _free_mappings(cls: type, prefix: str = "") -> frozenset[str]:
    """The config's mapping-valued settings (their keys are the user's, not kcm's)."""
    found = set()
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if typing.get_origin(kind) is list and dataclasses.is_dataclass(typing.get_args(kind)[0]):
            kind = typing.get_args(kind)[0]
        if typing.get_origin(kind) is dict:
            found.add(prefix + field.name)
        elif dataclasses.is_dataclass(kind):
            found |= _free_mappings(kind, prefix + field.name + ".")
    return frozenset(found)


def _bridge_example() -> set[str]:
    from kcm_bridge.config import BridgeConfig

    block = re.search(r"```yaml\n(.*?)```", section(_text(DOCS / "bridge.md"), "Full example configuration"), re.S)
    return _yaml_keys(yaml.safe_load(block.group(1)), free=_free_mappings(BridgeConfig))


def test_every_key_of_the_full_bridge_example_is_a_setting():
    from kcm_bridge.config import BridgeConfig

    example = _bridge_example()
    assert {"kafka.bootstrap_servers", "endpoints.tls.ca_file", "enrich.rules.action"} <= example
    assert sorted(example - _fields(BridgeConfig)) == []


def test_every_bridge_setting_is_in_the_full_example_or_named_in_the_doc():
    from kcm_bridge.config import BridgeConfig

    # A setting the example leaves out (a rule's `salt`, `salt_env`: "# or salt / salt_env") is documented when
    # bridge.md names it, by its path or its key, in a code span.
    named = set(spans(_text(DOCS / "bridge.md")))
    missing = [path for path in sorted(_fields(BridgeConfig) - _bridge_example())
               if path not in named and path.rsplit(".", 1)[-1] not in named]
    assert missing == []


def _bridge_variables_documented() -> set[str]:
    paragraph = re.search(r"^Precedence:.*?(?=^Any|\Z)", _text(DOCS / "bridge.md"), re.S | re.M).group(0)
    names = set()
    for span in spans(paragraph):
        if re.fullmatch(r"KCM_BRIDGE_[A-Z_]+", span):
            names.add(span)
        elif re.fullmatch(r"_[A-Z][A-Z_]+", span):
            names.add("KCM_BRIDGE" + span)
    return names


def _bridge_variables_read(caplog) -> set[str]:
    """The variables the bridge reads, as its warning about a misspelt one lists them ("the variables are ...")."""
    from kcm_bridge import config

    settings = config.load(env={"KCM_BRIDGE_BOOTSTRAP_SERVERS": "127.0.0.1:9092", "KCM_BRIDGE_ENDPOINTS": "c:4317"})
    with caplog.at_level(logging.WARNING):
        config.warn_of_unknown_variables(settings, {"KCM_BRIDGE_NOT_A_SETTING": "1"})
    message = " ".join(record.getMessage() for record in caplog.records)
    listed = re.search(r"the variables are ([A-Z_, ]+)", message)
    assert listed, message
    return {name.strip() for name in listed.group(1).split(",")}


def test_the_bridge_variables_are_the_documented_ones(caplog):
    documented = _bridge_variables_documented()
    assert len(documented) >= 10
    assert sorted(_bridge_variables_read(caplog) ^ documented) == []


def test_every_bridge_flag_table_row_feeds_a_setting():
    # The flags table and the config model meet in `--config`'s model: each flag's dotted setting is a field.
    from kcm_bridge.config import BridgeConfig

    fields = {path.rsplit(".", 1)[-1] for path in _fields(BridgeConfig)}
    aliases = {"--config": None, "--topic": "topics", "--endpoint": "endpoints", "--kafka-client": "client",
               "--bootstrap-server": "bootstrap_servers"}
    for flag in documented_flags("bridge")["bridge"] - _global_flags():
        setting = aliases.get(flag, flag.lstrip("-").replace("-", "_"))
        assert setting is None or setting in fields, f"bridge.md flag {flag}: no setting {setting}"


# --- the operator's reasons and annotations ---------------------------------------------------------------------------

OPERATOR_MODULES = ("kcm_operator.handlers", "kcm_operator.connections", "kcm_operator.errors")


def operator_names() -> dict[str, set[str]]:
    """Condition reasons (by condition type, and the KafkaConnection's), Event reasons and annotations, read from
    the literals the operator passes to its status and event calls."""
    handlers, connections, errors = (_source(module) for module in OPERATOR_MODULES)
    conditions: dict[str, set[str]] = {}
    for kind, _, reason in re.findall(r'status\.set\("(\w+)", "(\w+)", "(\w+)"', handlers):
        conditions.setdefault(kind, set()).add(reason)
    errors_reasons = set(re.findall(r'return "(\w+)"', errors.split("def reason_of", 1)[1]))
    held = set(re.findall(r'_held\(body, patch, .*?, retry, "(\w+)"', handlers))
    conditions["Ready"] |= errors_reasons | held
    connection = set(re.findall(r'report\([^"]*?"(?:True|False|Unknown)", "(\w+)"', handlers + connections))
    events = set(re.findall(r'kopf\.event\([^)]*?reason="(\w+)"', handlers, re.S))
    if re.search(r"kopf\.event\([^)]*?reason=reason\b", handlers, re.S):
        events |= errors_reasons   # "a Warning event whenever that condition changes", with its reason
    annotations = set(re.findall(r'"(kcm\.dev/[a-z-]+)"', handlers))
    return {"conditions": conditions, "connection": connection | errors_reasons, "events": events,
            "annotations": annotations}


def _operator_doc() -> str:
    return _text(DOCS / "operator.md")


def test_the_operator_inventory_is_found():
    names = operator_names()
    assert {"Applied", "Conflict", "InvalidSpec"} <= names["conditions"]["Ready"]
    assert {"Connected", "Unused"} <= names["connection"]
    assert {"Applied", "Drift", "NotRemoved"} <= names["events"]
    assert "kcm.dev/paused" in names["annotations"]


def test_every_ready_reason_the_operator_sets_is_documented():
    documented = set(spans(_operator_doc()))
    assert sorted(operator_names()["conditions"]["Ready"] - documented) == []


def test_every_paused_reason_the_operator_sets_is_documented():
    documented = set(spans(_operator_doc()))
    assert sorted(operator_names()["conditions"]["Paused"] - documented) == []


def test_the_ready_reasons_the_doc_lists_are_the_operators():
    status = re.search(r"conditions `Ready` \(reasons (.*?)\) and", _operator_doc(), re.S).group(1)
    listed = set(spans(status)) - {"Unknown"}
    assert len(listed) >= 8
    assert sorted(listed ^ operator_names()["conditions"]["Ready"]) == []


def test_the_kafkaconnection_reasons_are_documented():
    text = section(_operator_doc(), "KafkaConnection")
    assert sorted(operator_names()["connection"] - set(spans(text)) - set(spans(_operator_doc()))) == []
    for reason in ("Connected", "Unused"):
        assert f"`{reason}`" in text and reason in operator_names()["connection"]


def test_every_event_reason_is_documented_and_every_documented_event_is_posted():
    text = _operator_doc()
    documented = set(re.findall(r"event `(\w+)`", text)) | set(re.findall(r"Warning event `(\w+)`", text))
    events = operator_names()["events"]
    assert {"Applied", "Drift", "NotRemoved", "Conflict"} <= documented
    assert sorted(documented - events) == []
    assert sorted(events - set(spans(text))) == []


def test_the_kcm_dev_annotations_are_the_documented_ones():
    documented = {name for span in spans(_operator_doc()) for name in re.findall(r"^(kcm\.dev/[a-z-]+)", span)}
    documented -= {"kcm.dev/v1alpha1"}   # the API group/version, not an annotation
    assert sorted(documented ^ operator_names()["annotations"]) == []


# --- the receiver plugin ----------------------------------------------------------------------------------------------

def receiver_properties() -> set[str]:
    source = _text(RECEIVER_SOURCES / "ReceiverConfig.java")
    prefix = re.search(r'String PREFIX = "([^"]+)"', source).group(1)
    return {prefix + suffix + ("*" if suffix.endswith(".") else "")
            for suffix in re.findall(r'= PREFIX \+ "([^"]+)"', source)}


def receiver_attributes() -> set[str]:
    return set(re.findall(r'\badd\("([a-z-]+)"', _text(RECEIVER_SOURCES / "ReceiverMetrics.java")))


def test_the_receiver_properties_are_the_documented_ones():
    documented = {span for row in table(_text(DOCS / "receiver.md"), "property") for span in spans(row[0])}
    assert "kcm.receiver.topic" in documented and "kcm.receiver.producer.*" in documented
    assert sorted(documented ^ receiver_properties()) == []


def test_the_receiver_jmx_attributes_are_the_documented_ones():
    documented = {span for row in table(_text(DOCS / "receiver.md"), "attribute") for span in spans(row[0])}
    assert len(documented) >= 8
    assert sorted(documented ^ receiver_attributes()) == []


# --- rollup output columns --------------------------------------------------------------------------------------------

class _Recording:
    """A stand-in for a DataFrame and pyspark.sql.functions: every call returns itself; selectExpr is recorded."""

    def __init__(self) -> None:
        self.selected: list[str] = []

    def __getattr__(self, name: str):
        if name == "selectExpr":
            return lambda *columns: self.selected.extend(columns) or self
        return lambda *args, **kwargs: self


def rollup_columns() -> set[str]:
    """`aggregate.finish`'s projection (its `AS` names and bare columns) and what the job adds with `withColumn`."""
    aggregate = importlib.import_module("kcm_rollups.aggregate")
    state = _Recording()
    saved = aggregate.F
    aggregate.F = _Recording()
    try:
        # histograms=False: the same projection, without the histogram branch's Column arithmetic.
        aggregate.finish(state, types.SimpleNamespace(label="1m", seconds=60), aggregate.DEFAULT_DIMENSIONS, False)
    finally:
        aggregate.F = saved
    columns = set()
    for expression in state.selected:
        alias = re.search(r"\bAS `?(\w+)`?\s*$", expression) or re.fullmatch(r"`?(\w+)`?", expression.strip())
        assert alias, f"cannot name the column of {expression!r}"
        columns.add(alias.group(1))
    job = _source("kcm_rollups.job")
    return columns | {name for name in re.findall(r'\.withColumn\(\s*"(\w+)"', job) if not name.startswith("_")}


def _rollup_column_docs() -> tuple[set[str], set[str]]:
    """(the column table's names, every name the row and output sections and the --group-by row give)."""
    text = _text(DOCS / "rollups.md")
    table_names = {span for row in table(text, "column") for span in spans(row[0])}
    group_by = [row for row in table(text, "option") if "`--group-by`" in row[0]]
    named = set(spans(section(text, "What each row holds"))) | set(spans(section(text, "Output and re-runs")))
    named |= {name for span in spans(group_by[0][1]) for name in span.split(",")}
    return table_names, named


def test_every_column_of_the_rollup_table_is_written():
    table_names, _ = _rollup_column_docs()
    assert {"count", "p99", "instances"} <= table_names
    assert sorted(table_names - rollup_columns()) == []


def test_every_rollup_column_is_documented():
    columns = rollup_columns()
    assert {"partial", "date", "window_end", "rate"} <= columns
    _, named = _rollup_column_docs()
    assert sorted(columns - named) == []


# --- chart values -----------------------------------------------------------------------------------------------------

def _leaves(values: object, prefix: str = "") -> set[str]:
    if isinstance(values, dict) and values:
        return {leaf for key, inner in values.items() for leaf in _leaves(inner, f"{prefix}{key}.")}
    return {prefix.rstrip(".")}


def test_every_chart_value_is_in_the_readme_table_and_every_row_is_a_value():
    values = yaml.safe_load(_text(CHART / "values.yaml"))
    rows = {span for header, body in tables(_text(CHART / "README.md")) if header[0].lower() == "value"
            for row in body for span in spans(row[0])[:1]}
    assert len(rows) >= 50
    for key in sorted(rows):
        node = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"chart README lists {key}, not in values.yaml"
            node = node[part]
    covered = [leaf for leaf in _leaves(values) if not any(leaf == key or leaf.startswith(key + ".") for key in rows)]
    assert covered == [], f"values.yaml keys missing from the chart README: {covered}"
