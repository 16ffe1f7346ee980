"""Model test of `kcm subscriptions`: seeded random sequences of apply / describe / list / delete (and subscriptions
made by hand, as `kafka-client-metrics.sh` would) against one sandbox per sequence, checked after every step against
a reference written from docs/subscriptions.md, the CRD rules of docs/operator.md and DESIGN.md's CLIENT_METRICS
facts: which subscriptions Kafka holds and with which configs, the line `apply` prints per subscription (create /
update / unchanged and only the changed keys; metrics compare as a set, a removed match is a DELETE), all-or-nothing
refusals (every bad document named, a regex Kafka refuses quoted), what `list` and `describe` show (control
characters escaped), `delete` and its flags, and every user mistake as one line on stderr with exit code 2."""

from __future__ import annotations

import io
import json
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from kcm_cli.main import main
from kcm_common.kafka import KafkaSettings
from kcm_operator.admin import SubscriptionAdmin
from kcm_operator.reconcile import SET, Change, Op

SEEDS = (714, 715, 716, 717, 718)
STEPS = 70
DEFAULT_INTERVAL_MS = 300000                    # DESIGN.md "Apache Kafka facts", docs/operator.md "The resource"
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 100, 3600000
# docs/operator.md "The resource" (CR field) and DESIGN.md (Kafka match key), in the order DESIGN.md lists them.
MATCH_FIELDS = {"clientInstanceId": "client_instance_id", "clientId": "client_id",
                "clientSoftwareName": "client_software_name", "clientSoftwareVersion": "client_software_version",
                "clientSourceAddress": "client_source_address", "clientSourcePort": "client_source_port"}

NAMES = ("alpha", "beta", "gamma", "a.b-c")
NAMESPACES = ("team", "ops", None)              # None: the document has none, so `default`
# Kafka takes any non-empty name (docs/subscriptions.md); "team.alpha" collides with a `<namespace>.<name>` one.
SUBSCRIPTION_NAMES = ("shared", "team.alpha", "weird name_1", "ünï", "evil\x1b]0;x\x07", "two\nlines", "n" * 249)
METRICS = ("org.apache.kafka.producer.", "org.apache.kafka.consumer.", "org.apache.kafka.", "x.", "ünï.", "a b.",
           "org.apache.kafka.\x1b[31mred")
PATTERNS = ("payments-.*", "app-[0-9]+", "apache-kafka-java|librdkafka", ".*", "1\\.2\\..*", "ünï.*",
            "127\\.0\\.0\\.1", "9092|9093")
BAD_REGEXES = ("payments-(", "[abc", "*oops", "x)")   # java.util.regex refuses them; the CRD does not
INTERVALS = (MIN_INTERVAL_MS, 101, 1000, 5000, 60000, DEFAULT_INTERVAL_MS, MAX_INTERVAL_MS - 1, MAX_INTERVAL_MS)
ABSENT_NAMES = ("nobody", "team.nobody", "evil\x1bnobody")
INVALID_NAMES = ("", "\udcff")                 # Kafka refuses an empty name; a lone surrogate is not text
LINE = re.compile(r"subscription (?P<name>.*?): (?P<action>create|update|unchanged|delete)"
                  r"(?: \((?!dry run\)$)(?P<ops>.*?)\))?(?P<dry> \(dry run\))?")


def run_kcm(*args: str) -> int:
    """`kcm subscriptions ARGS` in this process; argparse's refusals end in SystemExit, as they would end `kcm`."""
    try:
        return main(["subscriptions", *args])
    except SystemExit as exit_:
        return exit_.code


def escaped(text: str) -> str:
    """docs/subscriptions.md: control characters shown escaped (`\\x1b`, `\\n`), as `kcm tail` does."""
    return "".join(c.encode("unicode_escape").decode("ascii") if ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f else c
                   for c in text)


@dataclass
class Doc:
    """One ClientMetricsSubscription document and what the docs say must happen to it."""

    name: str
    namespace: str | None
    spec: dict[str, Any]
    refusal: str | None = None     # a word the CRD refusal must name (the field), or None when the CRD accepts it
    bad_regex: str | None = None   # a match pattern Kafka refuses
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def subscription(self) -> str:
        """docs/subscriptions.md: `spec.subscriptionName`, else `<namespace>.<name>` (namespace `default`)."""
        return self.spec.get("subscriptionName") or f"{self.namespace or 'default'}.{self.name}"

    def obj(self) -> dict[str, Any]:
        metadata = {"name": self.name, **({"namespace": self.namespace} if self.namespace else {}), **self.metadata}
        return {"apiVersion": "kcm.dev/v1alpha1", "kind": "ClientMetricsSubscription", "metadata": metadata,
                "spec": self.spec}

    def configs(self) -> dict[str, str]:
        """The CLIENT_METRICS configs the spec stands for (DESIGN.md: metrics and match as comma lists)."""
        configs = {"metrics": ",".join(self.spec["metrics"]),
                   "interval.ms": str(self.spec.get("intervalMs", DEFAULT_INTERVAL_MS))}
        match = self.spec.get("match") or {}
        if match:
            configs["match"] = ",".join(f"{key}={match[field_]}" for field_, key in MATCH_FIELDS.items()
                                        if field_ in match)
        return configs


def as_set(value: str | None) -> frozenset[str]:
    return frozenset(item for item in (value or "").split(",") if item)


def comparable(configs: dict[str, str]) -> dict[str, Any]:
    """Configs with `match` as a set of entries (its order is not documented)."""
    return {key: as_set(value) if key == "match" else value for key, value in configs.items()}


def expected_change(doc: Doc, actual: dict[str, str]) -> tuple[str, list[tuple[str, str | None]]]:
    """docs/subscriptions.md "apply": the difference between spec and Kafka; metrics compare as a set, a removed
    match becomes a DELETE. Returns (action, [(key, value or None for a DELETE)])."""
    wanted = doc.configs()
    ops: list[tuple[str, str | None]] = []
    if "metrics" not in actual or as_set(actual["metrics"]) != as_set(wanted["metrics"]):
        ops.append(("metrics", wanted["metrics"]))
    if actual.get("interval.ms") != wanted["interval.ms"]:
        ops.append(("interval.ms", wanted["interval.ms"]))
    if "match" in wanted:
        if as_set(actual.get("match")) != as_set(wanted["match"]):
            ops.append(("match", wanted["match"]))
    elif "match" in actual:
        ops.append(("match", None))
    return ("unchanged" if not ops else "update" if actual else "create"), ops


def parse_line(line: str) -> tuple[str, str, list[tuple[str, Any]], bool]:
    parsed = LINE.fullmatch(line)
    assert parsed, line
    ops = []
    for op in (parsed["ops"] or "").split(", ") if parsed["ops"] else ():
        if op.startswith("-"):
            ops.append((op[1:], None))
        else:
            key, value = op.split("=", 1)
            ops.append((key, as_set(value) if key == "match" else value))
    return parsed["name"], parsed["action"], ops, bool(parsed["dry"])


def random_spec(rng: random.Random) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if rng.random() < 0.3:
        spec["subscriptionName"] = rng.choice(SUBSCRIPTION_NAMES)
    spec["metrics"] = rng.choice((["*"], [], *[rng.sample(METRICS, rng.randint(1, 3)) for _ in range(4)]))
    if rng.random() < 0.7:
        spec["intervalMs"] = rng.choice(INTERVALS)
    if rng.random() < 0.5:
        fields = rng.sample(sorted(MATCH_FIELDS), rng.choice((0, 1, 1, 2, 3)))
        spec["match"] = {field_: rng.choice(PATTERNS) for field_ in fields}
    if rng.random() < 0.1:
        spec["connection"] = "prod"
    if rng.random() < 0.2:
        spec["deletionPolicy"] = rng.choice(("Delete", "Retain"))
    return spec


def refuse(rng: random.Random, doc: Doc) -> None:
    """Break the document in one way the CRD (or the API server's name rules) refuses; record the field named."""
    spec = doc.spec
    kind = rng.randrange(13)
    if kind == 0:
        spec["intervalMs"] = rng.choice((MIN_INTERVAL_MS - 1, 0, -1, MAX_INTERVAL_MS + 1, 2**31, "60000"))
        doc.refusal = "spec.intervalMs"
    elif kind == 1:
        spec["metrics"] = rng.choice((["x.", "x."], [""], [" x."], ["x. "], ["x.,y."], ["m" * 1025]))
        doc.refusal = "spec.metrics"
    elif kind == 2:
        spec["metrics"] = ["*", rng.choice(METRICS)]
        doc.refusal = '"*" already means every metric'
    elif kind == 3:
        del spec["metrics"]
        doc.refusal = "'metrics' is a required property"
    elif kind == 4:
        spec["match"] = {**(spec.get("match") or {}), "clientName": "x"}
        doc.refusal = "spec.match.clientName"
    elif kind == 5:
        field_ = rng.choice(sorted(MATCH_FIELDS))
        spec["match"] = {**(spec.get("match") or {}), field_: rng.choice(("a=b", "a,b", " x", "x ", ""))}
        doc.refusal = f"spec.match.{field_}"
    elif kind == 6:
        spec["subscriptionName"] = rng.choice(("", "s" * 250))
        doc.refusal = "spec.subscriptionName"
    elif kind == 7:
        doc.name = rng.choice(("Bad_Name", "UPPER", "-x", "a" * 254))
        doc.refusal = "metadata.name"
    elif kind == 8:
        doc.namespace = rng.choice(("Bad_NS", "a.b", "x" * 64))
        doc.refusal = "metadata.namespace"
    elif kind == 9:
        spec["intervalMS"] = 1000
        doc.refusal = "spec.intervalMS"
    elif kind == 10:
        spec["deletionPolicy"] = "Keep"
        doc.refusal = "spec.deletionPolicy"
    elif kind == 11:
        spec["connection"] = ""
        doc.refusal = "spec.connection"
    else:
        spec["metrics"] = [rng.choice(METRICS)] + [f"p{i}." for i in range(1000)]
        doc.refusal = "spec.metrics"


def random_doc(rng: random.Random, refused: bool = False, bad_regex: bool = False) -> Doc:
    doc = Doc(rng.choice(NAMES), rng.choice(NAMESPACES), random_spec(rng))
    if bad_regex:
        doc.bad_regex = rng.choice(BAD_REGEXES)
        doc.spec["match"] = {**(doc.spec.get("match") or {}), rng.choice(sorted(MATCH_FIELDS)): doc.bad_regex}
    if refused:
        refuse(rng, doc)
    return doc


class Session:
    """Runs `kcm subscriptions` in this process against one sandbox and checks each step against the model."""

    def __init__(self, sandbox, capsys, caplog, monkeypatch, directory: Path) -> None:
        self.sandbox, self.capsys, self.caplog, self.monkeypatch = sandbox, capsys, caplog, monkeypatch
        self.directory = directory
        self.model: dict[str, dict[str, str]] = {}   # what Kafka should hold: name -> configs
        self.files = 0

    def kcm(self, *args: str) -> tuple[int, str, str]:
        self.caplog.clear()
        code = run_kcm(*args, "--bootstrap-server", self.sandbox.bootstrap)
        captured = self.capsys.readouterr()
        assert "Traceback" not in captured.err, captured.err
        return code, captured.out, captured.err

    def user_mistake(self, code: int, out: str, err: str, *words: str) -> None:
        """docs/subscriptions.md "Errors": exit code 2 and one line on stderr."""
        assert code == 2, (code, out, err)
        assert len(err.strip().splitlines()) == 1 and err.endswith("\n"), err
        for word in words:
            assert word in err, (word, err)

    def check_kafka(self) -> None:
        held = {name: comparable(self.sandbox.store.configs(name)) for name in self.sandbox.store.names()}
        assert held == {name: comparable(configs) for name, configs in self.model.items()}
        for name, configs in self.model.items():   # metrics keep the order the spec gave
            assert self.sandbox.store.configs(name)["metrics"] == configs["metrics"]

    # -- steps --------------------------------------------------------------------------------------------------
    def write(self, docs: list[Doc], layout: str, extra: bool) -> list[str]:
        """The documents as files in `layout`; returns the `-f` arguments, which read them in document order."""
        self.files += 1
        objs = [doc.obj() for doc in docs]
        other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-kcm"}, "data": {"a": "b"}}
        if layout == "multi":
            path = self.directory / f"step{self.files}.yaml"
            path.write_text(yaml.safe_dump_all(objs + ([other] if extra else []), allow_unicode=True))
            return ["-f", str(path)]
        if layout == "list":
            path = self.directory / f"step{self.files}.yml"
            path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objs}, allow_unicode=True))
            return ["-f", str(path)]
        if layout == "stdin":
            text = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
            self.monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
            return ["-f", "-"]
        if layout == "dir":   # a directory's *.yaml, *.yml, *.json in name order; other files ignored
            folder = self.directory / f"step{self.files}"
            folder.mkdir()
            for index, obj in enumerate(objs):
                suffix = (".yaml", ".yml", ".json")[index % 3]
                text = json.dumps(obj) if suffix == ".json" else yaml.safe_dump(obj, allow_unicode=True)
                (folder / f"{index:02d}{suffix}").write_text(text)
            (folder / "README.md").write_text("# not a manifest: [\n")
            if extra:
                (folder / "zz-configmap.yaml").write_text(yaml.safe_dump(other))
            return ["-f", str(folder)]
        args = []   # one file per document, `-f` repeated
        for index, obj in enumerate(objs):
            path = self.directory / f"step{self.files}-{index}.json"
            path.write_text(json.dumps(obj))
            args += ["-f", str(path)]
        return args

    def apply(self, docs: list[Doc], layout: str = "multi", dry_run: bool = False, extra: bool = False) -> None:
        args = self.write(docs, layout, extra)
        code, out, err = self.kcm("apply", *args, *(["--dry-run"] if dry_run else []))
        accepted = [doc for doc in docs if doc.refusal is None]
        names = [doc.subscription for doc in accepted]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        refused = [doc for doc in docs if doc.refusal is not None]
        if refused or duplicates:
            # Every bad document with the field, two documents naming one subscription refused; nothing applied.
            self.user_mistake(code, out, err, *[doc.refusal for doc in refused],
                              *[escaped(name) for name in duplicates])
            assert out == ""
        elif any(doc.bad_regex for doc in docs):
            self.user_mistake(code, out, err, "Kafka refuses, nothing applied")
            for doc in docs:
                if doc.bad_regex:
                    assert f"subscription {escaped(doc.subscription)}:" in err and doc.bad_regex in err, err
            assert out == ""
        else:
            assert (code, err) == (0, ""), (code, err)
            lines = out.splitlines()
            assert len(lines) == len(docs), out
            for doc, line in zip(docs, lines):
                assert "\x1b" not in line and "\x07" not in line, line
                name, action, ops, dry = parse_line(line)
                want_action, want_ops = expected_change(doc, self.model.get(doc.subscription, {}))
                assert (name, action, dry) == (escaped(doc.subscription), want_action, dry_run), line
                assert ops == [(key, as_set(value) if key == "match" and value else escaped(value or "")
                                if value is not None else None) for key, value in want_ops], line
            if any("connection" in doc.spec for doc in docs):   # ignored with a warning
                assert "spec.connection" in self.caplog.text and "ignored" in self.caplog.text, self.caplog.text
            if not dry_run:   # only the difference is sent: what it leaves alone stays as Kafka held it
                for doc in docs:
                    configs = self.model.setdefault(doc.subscription, {})
                    for key, value in expected_change(doc, configs)[1]:
                        if value is None:
                            del configs[key]
                        else:
                            configs[key] = value
        self.check_kafka()

    def by_hand(self, name: str, configs: dict[str, str]) -> None:
        """A subscription no resource manages: set with IncrementalAlterConfigs, as kafka-client-metrics.sh does."""
        admin = SubscriptionAdmin(KafkaSettings(self.sandbox.bootstrap))
        try:
            errors = admin.alter([Change(name, "create", tuple(Op(key, SET, value) for key, value in configs.items()))])
        finally:
            admin.close()
        assert errors == {name: None}
        self.model.setdefault(name, {}).update(configs)
        self.check_kafka()

    def shows(self, text: str, name: str, configs: dict[str, str]) -> None:
        """What `describe` (and a `list` row) show: the name, interval, metrics and match, escaped."""
        assert escaped(name) in text, (name, text)
        assert configs["interval.ms"] in text, text
        assert escaped(configs["metrics"]) in text, text
        for entry in as_set(configs.get("match")):
            assert escaped(entry) in text, text
        assert not any(character in text for character in "\x1b\x07"), text

    def describe(self, name: str, output: str | None) -> None:
        code, out, err = self.kcm("describe", name, *(["-o", output] if output else []))
        if output not in (None, "text", "json"):
            return self.user_mistake(code, out, err, output)
        if name not in self.model:
            return self.user_mistake(code, out, err, *([escaped(name)] if name in ABSENT_NAMES else []))
        assert (code, err) == (0, ""), err
        if output == "json":
            data = json.loads(out)
            assert data.get("name", name) == name and data.get("configs", data) == self.model[name], out
        else:
            self.shows(out, name, self.model[name])
            if "match" not in self.model[name]:
                assert "client_" not in out, out

    def list(self, output: str | None) -> None:
        code, out, err = self.kcm("list", *(["-o", output] if output else []))
        if output not in (None, "table", "json"):
            return self.user_mistake(code, out, err, output)
        assert (code, err) == (0, ""), err
        if output == "json":
            data = json.loads(out)
            if isinstance(data, list):
                data = {item["name"]: item["configs"] for item in data}
            assert data == self.model, out
            return
        lines = out.splitlines()
        for name, configs in self.model.items():
            [row] = [line for line in lines if line.startswith(escaped(name) + " ")]
            self.shows(row, name, configs)
        assert len(lines) - len(self.model) in (0, 1), out   # a row per subscription, and perhaps a header

    def delete(self, name: str, dry_run: bool, ignore: bool) -> None:
        flags = [*(["--dry-run"] if dry_run else []), *(["--ignore-not-found"] if ignore else [])]
        code, out, err = self.kcm("delete", name, *flags)
        if name in INVALID_NAMES:   # no such name can exist: a mistake, not "not found", whatever the flags
            self.user_mistake(code, out, err, *(["subscription ''"] if name == "" else []))
        elif name not in self.model:
            if ignore:
                assert (code, err) == (0, "") and ": delete" not in out, (code, out, err)
            else:
                self.user_mistake(code, out, err, escaped(name))
        else:
            assert (code, err) == (0, ""), err
            [line] = out.splitlines()
            shown, action, ops, _ = parse_line(line)
            # "delete every key of one subscription, which removes it"
            assert (shown, action) == (escaped(name), "delete"), line
            assert sorted(ops) == sorted((key, None) for key in self.model[name]), line
            if not dry_run:
                del self.model[name]
        self.check_kafka()


@pytest.fixture
def session(sandbox, capsys, caplog, monkeypatch, tmp_path) -> Session:
    return Session(sandbox, capsys, caplog, monkeypatch, tmp_path)


def random_step(rng: random.Random, session: Session) -> None:
    roll = rng.random()
    known = sorted(session.model)
    if roll < 0.45:
        docs = [random_doc(rng) for _ in range(rng.randint(1, 4))]
        trouble = rng.random()
        if trouble < 0.15:
            for doc in rng.sample(docs, rng.choice((1, 1, 2)) if len(docs) > 1 else 1):
                refuse(rng, doc)
        elif trouble < 0.25:
            docs[rng.randrange(len(docs))] = random_doc(rng, bad_regex=True)
        elif trouble < 0.3 and known:   # the same subscription twice
            docs.append(Doc("twin", "team", {"subscriptionName": docs[0].subscription, "metrics": ["x."]}))
        elif trouble < 0.45 and known:  # what Kafka already holds, metrics reordered: unchanged
            name = rng.choice(known)
            configs = session.model[name]
            if "interval.ms" in configs and all(
                    key in ("metrics", "interval.ms") for key in configs) and "\x1b" not in configs["metrics"]:
                metrics = sorted(as_set(configs["metrics"]), reverse=True)
                docs = [Doc("again", "team", {"subscriptionName": name, "metrics": metrics,
                                              "intervalMs": int(configs["interval.ms"])})]
        layout = rng.choice(("multi", "list", "stdin", "dir", "files"))
        session.apply(docs, layout, dry_run=rng.random() < 0.25, extra=rng.random() < 0.3)
    elif roll < 0.55:
        configs = {"metrics": ",".join(rng.sample(METRICS[:5], rng.randint(1, 2))),
                   "interval.ms": str(rng.choice(INTERVALS))}
        if rng.random() < 0.5:
            configs["match"] = f"client_id={rng.choice(PATTERNS)}"
        session.by_hand(rng.choice(SUBSCRIPTION_NAMES + ("by-hand",)), configs)
    elif roll < 0.7:
        name = rng.choice(known + list(ABSENT_NAMES) + list(INVALID_NAMES)) if known else rng.choice(ABSENT_NAMES)
        session.describe(name, rng.choice((None, "text", "json", "json", "table", "yaml")))
    elif roll < 0.8:
        session.list(rng.choice((None, "table", "json", "json", "text", "yaml")))
    else:
        pool = known * 2 + list(ABSENT_NAMES) + list(INVALID_NAMES)
        session.delete(rng.choice(pool), dry_run=rng.random() < 0.25, ignore=rng.random() < 0.4)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_sequences_keep_kafka_and_every_output_as_the_docs_say(session, seed):
    rng = random.Random(seed)
    for _ in range(STEPS):
        random_step(rng, session)
    session.list("json")
    for name in sorted(session.model):
        session.delete(name, dry_run=False, ignore=False)
    assert session.sandbox.store.names() == []


def directed(name: str, spec: dict[str, Any], namespace: str = "team") -> Doc:
    return Doc(name, namespace, spec)


def test_interval_bounds_are_inclusive_and_a_step_beyond_is_refused_before_kafka(session):
    session.apply([directed("low", {"metrics": ["x."], "intervalMs": MIN_INTERVAL_MS}),
                   directed("high", {"metrics": ["x."], "intervalMs": MAX_INTERVAL_MS})])
    for interval in (MIN_INTERVAL_MS - 1, MAX_INTERVAL_MS + 1):
        session.apply([Doc("low", "ops", {"metrics": ["y."], "intervalMs": interval}, "spec.intervalMs")])
        session.apply([directed("ok", {"metrics": ["y."]}),
                       Doc("beyond", "team", {"metrics": ["y."], "intervalMs": interval}, "spec.intervalMs")])
    session.describe("team.low", None)
    session.describe("team.high", "json")


def test_updates_send_only_the_difference_and_a_removed_match_is_a_delete(session):
    spec = {"metrics": ["a.", "b."], "intervalMs": 60000, "match": {"clientId": "app-.*", "clientSourcePort": "9092"}}
    session.apply([directed("app", spec)])
    session.apply([directed("app", {**spec, "metrics": ["b.", "a."]})])                  # unchanged: a set
    session.apply([directed("app", {**spec, "intervalMs": 1000})])                       # update interval.ms only
    session.apply([directed("app", {**spec, "intervalMs": 1000, "match": {"clientId": "other-.*"}})])
    session.apply([directed("app", {"metrics": ["a.", "b."], "intervalMs": 1000, "match": {}})])   # -match
    session.apply([directed("app", {"metrics": [], "intervalMs": 1000})])                # [] = none
    session.apply([directed("app", {"metrics": [], "intervalMs": 1000})])
    session.apply([directed("app", {"metrics": ["*"]})], dry_run=True)
    session.list(None)


def test_a_regex_kafka_refuses_applies_nothing_even_in_a_dry_run(session):
    good = directed("good", {"metrics": ["x."]})
    for regex in BAD_REGEXES:
        bad = directed("bad", {"metrics": ["x."], "match": {"clientId": regex}})
        bad.bad_regex = regex
        for dry_run in (False, True):
            session.apply([good, bad], dry_run=dry_run)
    strange = Doc("named", "team", {"subscriptionName": "two\nlines", "metrics": ["x."],
                                    "match": {"clientSoftwareName": "(x"}}, bad_regex="(x")
    session.apply([strange])


def test_two_documents_naming_one_subscription_are_refused(session):
    session.apply([directed("alpha", {"metrics": ["x."]}),
                   Doc("other", "ops", {"subscriptionName": "team.alpha", "metrics": ["y."]})])
    session.apply([directed("alpha", {"metrics": ["x."]}, None),
                   Doc("alpha", "default", {"metrics": ["y."]})], layout="dir")


def test_delete_of_an_absent_subscription_is_exit_2_unless_ignored_and_dry_run_keeps_it(session):
    session.apply([directed("gone", {"metrics": ["x."], "match": {"clientId": "a"}})])
    session.delete("team.gone", dry_run=True, ignore=False)
    session.delete("team.gone", dry_run=False, ignore=False)
    for dry_run in (False, True):
        for ignore in (False, True):
            session.delete("team.gone", dry_run=dry_run, ignore=ignore)
    session.describe("team.gone", None)


def test_names_and_metrics_with_control_characters_are_escaped_everywhere(session):
    session.apply([Doc("evil", "team", {"subscriptionName": "evil\x1b]0;x\x07\nrow",
                                        "metrics": ["org.apache.kafka.\x1b[31mred"]})])
    session.by_hand("two\nlines", {"metrics": "x.", "interval.ms": "1000"})
    session.list(None)
    session.list("json")
    session.describe("evil\x1b]0;x\x07\nrow", None)
    session.describe("two\nlines", "json")
    session.delete("evil\x1b]0;x\x07\nrow", dry_run=True, ignore=False)


@pytest.mark.parametrize("args, word", [
    (("list", "-o", "yaml"), "yaml"),
    (("list", "-o", "text"), "text"),
    (("describe", "x", "-o", "table"), "table"),
    (("describe",), "name"),
    (("delete",), "name"),
    (("apply",), "-f"),
])
def test_a_wrong_output_format_or_missing_argument_is_one_line_exit_2(capsys, args, word):
    code = run_kcm(*args, "--bootstrap-server", "127.0.0.1:1")
    err = capsys.readouterr().err
    assert (code, len(err.strip().splitlines())) == (2, 1), err
    assert word in err and "Traceback" not in err, err
