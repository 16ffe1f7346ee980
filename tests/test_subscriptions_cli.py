"""`kcm subscriptions` against the sandbox: what it changes in Kafka, what it prints, and how it refuses bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kcm_cli.main import main
from kcm_common.errors import UserError
from kcm_common.kafka import KafkaSettings
from kcm_operator import admin as admin_module
from kcm_operator.admin import SubscriptionAdmin
from kcm_operator.apply import apply_files
from kcm_operator.reconcile import SET, Change, Op

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DEMO_PRODUCERS = {"metrics": "org.apache.kafka.producer.", "interval.ms": "5000", "match": "client_id=.*-producer"}


def _subscription(name: str, spec: str, namespace: str = "team") -> str:
    return textwrap.dedent(f"""\
        apiVersion: kcm.dev/v1alpha1
        kind: ClientMetricsSubscription
        metadata:
          name: {name}
          namespace: {namespace}
        spec:
        """) + textwrap.indent(textwrap.dedent(spec), "  ")


def _kcm(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["subscriptions", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_demo_command_creates_its_subscriptions_exactly_and_a_second_run_changes_nothing(sandbox):
    command = [sys.executable, "-m", "kcm_cli.main", "subscriptions", "apply", "-f", str(EXAMPLES / "demo"),
               "--bootstrap-server", sandbox.bootstrap]

    first = subprocess.run(command, capture_output=True, text=True, timeout=60)
    second = subprocess.run(command, capture_output=True, text=True, timeout=60)

    assert first.returncode == 0, first.stderr
    assert "subscription demo-producers: create (" in first.stdout
    assert sandbox.store.configs("demo-producers") == DEMO_PRODUCERS
    assert sandbox.store.configs("demo-consumers")["match"] == "client_id=.*-consumer"
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == ["subscription demo-consumers: unchanged",
                                          "subscription demo-producers: unchanged"]


def test_apply_files_is_callable_directly_and_applies_only_the_difference(sandbox, tmp_path):
    settings = KafkaSettings(sandbox.bootstrap)
    path = tmp_path / "sub.yaml"
    path.write_text(_subscription("app", """\
        metrics: [a., b.]
        intervalMs: 60000
        match: {clientId: "app-.*"}
        """))
    apply_files(settings, [path])
    path.write_text(_subscription("app", """\
        metrics: [b., a.]
        intervalMs: 1000
        """))

    changes = apply_files(settings, [path])

    assert [change.describe() for change in changes] == ["subscription team.app: update (interval.ms=1000, -match)"]
    assert sandbox.store.configs("team.app") == {"metrics": "a.,b.", "interval.ms": "1000"}


def test_multi_document_file_and_dry_run_leaves_kafka_untouched(sandbox, tmp_path, capsys):
    path = tmp_path / "many.yaml"
    path.write_text(_subscription("one", "metrics: [x.]\n") + "---\n" + _subscription("two", "metrics: ['*']\n")
                    + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: ignored}\n")

    code, out, _ = _kcm(capsys, "apply", "-f", str(path), "--dry-run", "--bootstrap-server", sandbox.bootstrap)

    assert code == 0
    assert out.splitlines() == ["subscription team.one: create (metrics=x., interval.ms=300000) (dry run)",
                                "subscription team.two: create (metrics=*, interval.ms=300000) (dry run)"]
    assert sandbox.store.names() == []


def test_a_regex_kafka_refuses_applies_nothing_and_quotes_kafka(sandbox, tmp_path, capsys):
    path = tmp_path / "subs.yaml"
    path.write_text(_subscription("good", "metrics: [x.]\n") + "---\n"
                    + _subscription("bad", "metrics: [x.]\nmatch: {clientId: 'payments-('}\n"))

    code, out, err = _kcm(capsys, "apply", "-f", str(path), "--bootstrap-server", sandbox.bootstrap)

    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "Kafka refuses, nothing applied: subscription team.bad:" in err
    assert "payments-(" in err
    assert sandbox.store.names() == []


@pytest.mark.parametrize("spec, problem", [
    ("metrics: [x.]\nintervalMs: 10\n", "spec.intervalMs"),
    ("metrics: [x.]\nmatch: {clientName: x}\n", "spec.match.clientName: unknown field"),
    ("metrics: [x., x.]\n", "spec.metrics"),
    ("intervalMs: 1000\n", "'metrics' is a required property"),
])
def test_a_spec_the_crd_refuses_is_named_before_kafka_is_asked(sandbox, tmp_path, capsys, spec, problem):
    path = tmp_path / "bad.yaml"
    path.write_text(_subscription("bad", spec))

    code, out, err = _kcm(capsys, "apply", "-f", str(path), "--bootstrap-server", sandbox.bootstrap)

    assert code == 2
    assert problem in err
    assert f"ClientMetricsSubscription team/bad ({path})" in err
    assert sandbox.store.names() == []


def test_list_and_describe_show_subscriptions_no_resource_manages(sandbox, capsys):
    admin = SubscriptionAdmin(KafkaSettings(sandbox.bootstrap))
    try:
        admin.alter([Change("by-hand", "create", (Op("metrics", SET, "org.apache.kafka."),
                                                   Op("interval.ms", SET, "1000")))])
    finally:
        admin.close()

    code, listing, _ = _kcm(capsys, "list", "--bootstrap-server", sandbox.bootstrap)
    _, described, _ = _kcm(capsys, "describe", "by-hand", "--bootstrap-server", sandbox.bootstrap)

    assert code == 0
    assert listing.splitlines()[1].split() == ["by-hand", "1000", "org.apache.kafka.", "(every", "client)"]
    assert "Interval ms:  1000" in described


def test_control_characters_in_names_and_values_are_shown_escaped_never_sent_to_the_terminal(sandbox, capsys):
    # Kafka takes any non-empty CLIENT_METRICS name and any metrics text: whoever alters configs chooses them.
    name, metrics = "evil\x1b]0;pwned\x07\nfake-row", "org.apache.kafka.\x1b[31mred"
    admin = SubscriptionAdmin(KafkaSettings(sandbox.bootstrap))
    try:
        admin.alter([Change(name, "create", (Op("metrics", SET, metrics), Op("interval.ms", SET, "1000")))])
    finally:
        admin.close()

    _, listing, _ = _kcm(capsys, "list", "--bootstrap-server", sandbox.bootstrap)
    _, described, _ = _kcm(capsys, "describe", name, "--bootstrap-server", sandbox.bootstrap)
    _, deleted, _ = _kcm(capsys, "delete", name, "--bootstrap-server", sandbox.bootstrap, "--dry-run")

    for text in (listing, described, deleted):
        assert not any(character in text for character in "\x1b\x07"), text
        assert "evil\\x1b]0;pwned\\x07\\nfake-row" in text
        assert "org.apache.kafka.\\x1b[31mred" in text or text is deleted
    assert not any(line.startswith("fake-row") for line in listing.splitlines())
    assert len(described.splitlines()) == 4


def test_the_bridges_consumer_settings_in_the_shared_client_file_are_passed_over(sandbox, tmp_path, capsys):
    """The chart hands one client properties file to the operator, the bridge and the rollup job: the consumer tuning
    the bridge reads from it must not make the other commands refuse it."""
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=PLAINTEXT\nsession.timeout.ms=30000\nauto.offset.reset=earliest\n")

    code, listing, err = _kcm(capsys, "list", "--bootstrap-server", sandbox.bootstrap, "--command-config", str(config))

    assert (code, err) == (0, "")
    assert listing.splitlines()[0].split()[0] == "NAME"


@pytest.mark.timeout(60)
def test_a_name_that_is_not_utf8_is_refused_never_sent_to_hang(sandbox, tmp_path, capsys):
    """kafka-python cannot encode a lone surrogate (a stray byte on the command line, a YAML escape) and its request
    then never ends: such a name or value is refused before anything is sent."""
    code, _, err = _kcm(capsys, "describe", "\udcff", "--bootstrap-server", sandbox.bootstrap)
    assert code == 2 and "subscription name '\\udcff' is not UTF-8 text" in err
    manifest = tmp_path / "surrogate.yaml"
    manifest.write_text(_subscription("bad", """\
        subscriptionName: "x\\ud800"
        metrics: ["org.apache.kafka."]
        """))
    code, _, err = _kcm(capsys, "apply", "-f", str(manifest), "--bootstrap-server", sandbox.bootstrap)
    assert code == 2 and "is not UTF-8 text" in err, err


def test_a_request_timeout_in_the_client_properties_is_honoured_not_a_crash(sandbox, tmp_path, capsys):
    config = tmp_path / "client.properties"
    config.write_text("request.timeout.ms=15000\n")
    code, listing, err = _kcm(capsys, "list", "--bootstrap-server", sandbox.bootstrap, "--command-config", str(config))
    assert (code, err) == (0, "") and listing.splitlines()[0].split()[0] == "NAME"


def test_delete_removes_every_key_and_a_missing_subscription_is_an_error_unless_ignored(sandbox, capsys):
    apply_files(KafkaSettings(sandbox.bootstrap), [EXAMPLES / "demo"])

    code, out, _ = _kcm(capsys, "delete", "demo-producers", "--bootstrap-server", sandbox.bootstrap)
    again, _, err = _kcm(capsys, "delete", "demo-producers", "--bootstrap-server", sandbox.bootstrap)
    ignored, _, _ = _kcm(capsys, "delete", "demo-producers", "--ignore-not-found",
                         "--bootstrap-server", sandbox.bootstrap)

    assert (code, out.strip()) == (0, "subscription demo-producers: delete (-interval.ms, -match, -metrics)")
    assert sandbox.store.names() == ["demo-consumers"]
    assert again == 2 and "subscription 'demo-producers' does not exist" in err
    assert ignored == 0


def test_a_broker_without_kip714_is_unsupported(broker, capsys):
    code, _, err = _kcm(capsys, "list", "--bootstrap-server", broker.bootstrap)

    assert code == 2
    assert "needs kcm's receiver" in err


def test_a_cluster_whose_receiver_plugin_was_removed_refuses_apply_but_lists_and_deletes(sandbox, tmp_path, capsys,
                                                                                          monkeypatch):
    _kcm(capsys, "apply", "-f", str(EXAMPLES / "demo"), "--bootstrap-server", sandbox.bootstrap)
    # The brokers restart without kcm's receiver: no telemetry APIs, while their CLIENT_METRICS configs stay.
    monkeypatch.setattr(admin_module, "PUSH_TELEMETRY", 9999)

    applied, _, apply_err = _kcm(capsys, "apply", "-f", str(EXAMPLES / "demo"), "--bootstrap-server", sandbox.bootstrap)
    # The chart's NOTES give the dry run as the check that the brokers run the receiver.
    dry, _, dry_err = _kcm(capsys, "apply", "--dry-run", "-f", str(EXAMPLES / "demo"),
                           "--bootstrap-server", sandbox.bootstrap)
    listed, names, _ = _kcm(capsys, "list", "--bootstrap-server", sandbox.bootstrap)
    deleted, _, _ = _kcm(capsys, "delete", "demo-producers", "--bootstrap-server", sandbox.bootstrap)

    assert applied == 2 and "needs kcm's receiver" in apply_err
    assert dry == 2 and "needs kcm's receiver" in dry_err
    assert listed == 0 and "demo-producers" in names
    assert deleted == 0 and sandbox.store.names() == ["demo-consumers"]


def test_missing_files_and_unreachable_kafka_are_one_line_errors(tmp_path, capsys):
    missing, _, err_missing = _kcm(capsys, "apply", "-f", str(tmp_path / "nope.yaml"),
                                   "--bootstrap-server", "127.0.0.1:1")
    (tmp_path / "sub.yaml").write_text(_subscription("x", "metrics: [x.]\n"))
    down, _, err_down = _kcm(capsys, "apply", "-f", str(tmp_path), "--bootstrap-server", "127.0.0.1:1")

    assert missing == 2 and "nope.yaml: no such file or directory" in err_missing
    assert down == 2 and len(err_down.strip().splitlines()) == 1 and "127.0.0.1:1" in err_down


def test_brokers_advertising_an_address_out_of_reach_are_named_not_called_a_lost_connection(misadvertised_broker,
                                                                                           capsys):
    """The bootstrap server answers; requests go to the broker its metadata names (advertised.listeners), which
    cannot be reached from here. 'lost the connection … ECONNREFUSED' sent users looking at the wrong address."""
    broker, unreachable = misadvertised_broker
    for action in (("describe", "x"), ("delete", "x")):
        code, _, err = _kcm(capsys, *action, "--bootstrap-server", broker.bootstrap)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert (f"Kafka at {broker.bootstrap} (PLAINTEXT) answers, but its brokers advertise {unreachable}, which "
                "this client could not reach") in err, err


def test_standard_input_pipes_and_devices_are_read_as_files(tmp_path, monkeypatch):
    """`-f -` (kubectl's habit: `curl … | kcm subscriptions apply -f -`) and process substitution `<(…)`: they
    exist, so they are read, not called missing."""
    import io
    import threading

    from kcm_operator import manifests

    text = _subscription("piped", "metrics: [org.apache.kafka.producer.]\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    [(manifest, desired)] = manifests.subscriptions(manifests.load(["-"]))
    assert desired.name == "team.piped" and manifest.source == "(stdin)"
    monkeypatch.setattr(sys, "stdin", None)   # started with `<&-`
    with pytest.raises(UserError, match="standard input is closed"):
        manifests.load(["-"])
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=(text,), daemon=True)
    writer.start()
    [(manifest, desired)] = manifests.subscriptions(manifests.load([fifo]))
    writer.join(10)
    assert desired.name == "team.piped" and manifest.source == str(fifo)
    assert manifests.load(["/dev/null"]) == []
    # Bounded: a wrong path that never ends (or a huge log) is refused, not read into memory.
    (tmp_path / "big.yaml").write_text(text + "#" * manifests.MAX_MANIFEST_BYTES)
    with pytest.raises(UserError, match=r"cannot read .*big.yaml: larger than 64 MiB: is it the right file\?"):
        manifests.load([tmp_path / "big.yaml"])


def test_directories_are_read_recursively_only_with_R_and_list_has_json(sandbox, tmp_path, capsys):
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "sub.yml").write_text(_subscription("deep", "metrics: [x.]\n"))
    (tmp_path / "top.yaml").write_text(_subscription("top", "metrics: [y.]\n"))

    _, flat, _ = _kcm(capsys, "apply", "-f", str(tmp_path), "--bootstrap-server", sandbox.bootstrap)
    _, recursive, _ = _kcm(capsys, "apply", "-R", "-f", str(tmp_path), "--bootstrap-server", sandbox.bootstrap)
    _, listing, _ = _kcm(capsys, "list", "-o", "json", "--bootstrap-server", sandbox.bootstrap)

    assert [line.split(":")[0] for line in flat.splitlines()] == ["subscription team.top"]
    assert recursive.splitlines() == ["subscription team.deep: create (metrics=x., interval.ms=300000)",
                                      "subscription team.top: unchanged"]
    assert json.loads(listing) == {"team.deep": {"metrics": "x.", "interval.ms": "300000"},
                                   "team.top": {"metrics": "y.", "interval.ms": "300000"}}


def test_every_problem_of_every_file_is_on_one_line_and_a_resource_without_a_name_says_so(sandbox, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    nameless = textwrap.dedent("""\
        apiVersion: kcm.dev/v1alpha1
        kind: ClientMetricsSubscription
        metadata: {namespace: team}
        spec: {metrics: [x.]}
        """)
    path.write_text(_subscription("bad", "metrics: [x.]\nintervalMs: 10\n") + "---\n" + nameless)

    code, out, err = _kcm(capsys, "apply", "-f", str(path), "--bootstrap-server", sandbox.bootstrap)

    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "spec.intervalMs" in err and "ClientMetricsSubscription team/(no name)" in err, err
    assert sandbox.store.names() == []


def test_a_key_given_twice_in_a_manifest_is_refused_as_kubectl_does(tmp_path, capsys):
    path = tmp_path / "twice.yaml"
    path.write_text(_subscription("twice", "metrics: [org.apache.kafka.producer.]\nmetrics: [x.]\n"))

    code, _, err = _kcm(capsys, "apply", "-f", str(path), "--bootstrap-server", "127.0.0.1:1", "--dry-run")

    assert code == 2
    assert err == (f"kcm subscriptions: {path}: not valid YAML at line 8, column 3: the key `metrics` is given twice "
                   "in one mapping\n")


def test_a_yaml_error_in_a_manifest_never_quotes_the_value_it_could_not_read(tmp_path, capsys):
    # An unquoted password starting with "!" reads as a tag: PyYAML's message would quote it whole.
    path = tmp_path / "secret.yaml"
    path.write_text("apiVersion: v1\nkind: Secret\nmetadata: {name: kafka}\nstringData:\n  password: !Xk9$mP2@q\n")

    code, _, err = _kcm(capsys, "apply", "-f", str(path), "--bootstrap-server", "127.0.0.1:1", "--dry-run")

    assert code == 2
    assert err == (f"kcm subscriptions: {path}: not valid YAML at line 5, column 13: could not determine a "
                   "constructor for the tag '…' (quote a value that starts with !, * or &)\n")


@pytest.mark.parametrize("document, problem", [
    ("apiVersion: 5\nkind: ClientMetricsSubscription\n", "no ClientMetricsSubscription resources"),
    ("apiVersion:\nkind: x\n", "no ClientMetricsSubscription resources"),
    ("apiVersion: v1\nkind: List\nitems: [1, x]\n", "[0]: expected a Kubernetes resource (a mapping), found int"),
    ("apiVersion: kcm.dev/v1alpha1\nkind: ClientMetricsSubscription\nmetadata: hello\nspec: {metrics: [x.]}\n",
     "metadata: Invalid value: must be an object, not str"),
    ("apiVersion: kcm.dev/v1alpha1\nkind: [1]\n", "not kcm.dev/v1alpha1/[1]"),
    ("apiVersion: kcm.dev/v1alpha1\nkind: ClientMetricsSubscription\nmetadata: {name: x, namespace: Bad_NS}\n"
     "spec: {metrics: [x.]}\n", "metadata.namespace: Invalid value: 'Bad_NS'"),
])
def test_a_malformed_document_is_one_line_and_exit_2_never_a_traceback(tmp_path, capsys, document, problem):
    path = tmp_path / "odd.yaml"
    path.write_text(document)

    code, _, err = _kcm(capsys, "apply", "-f", str(path), "--bootstrap-server", "127.0.0.1:1", "--dry-run")

    assert (code, len(err.strip().splitlines())) == (2, 1), err
    assert problem in err, err


@pytest.mark.parametrize("tag, item", [("", "{}"), ("!!pairs ", "{{k: {}}}")])  # lists, and !!pairs' tuples
def test_a_yaml_alias_bomb_is_refused_quickly_and_briefly(tmp_path, capsys, tag, item):
    lines = [f"a: &a {tag}[{', '.join([item.format('x')] * 9)}]"]
    for previous, name in zip("abcdefg", "bcdefgh"):
        lines.append(f"{name}: &{name} {tag}[{', '.join([item.format('*' + previous)] * 9)}]")  # 9^8 values in all
    lines += ["apiVersion: kcm.dev/v1alpha1", "kind: *h"]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")

    code, _, err = _kcm(capsys, "apply", "-f", str(path), "--bootstrap-server", "127.0.0.1:1", "--dry-run")

    assert code == 2 and len(err) < 400, err[:400]
    assert "more than 1,000,000 values once its aliases are expanded" in err


def test_a_problem_quoting_a_huge_value_is_cut_short(tmp_path, capsys):
    path = tmp_path / "long.yaml"
    path.write_text(_subscription("long", f"metrics: [x.]\nintervalMs: '{'9' * 100_000}'\n"))

    code, _, err = _kcm(capsys, "apply", "-f", str(path), "--bootstrap-server", "127.0.0.1:1", "--dry-run")

    assert code == 2 and "spec.intervalMs" in err and len(err) < 1000, err[:1000]


def test_an_interval_above_kafkas_default_is_applied_with_a_warning_that_clients_get_the_default(
        sandbox, tmp_path, capsys, caplog):
    """Kafka takes any interval up to an hour, but a client is never told one above its default (300000 ms): the
    broker starts from it and takes the smallest."""
    path = tmp_path / "slow.yaml"
    path.write_text(_subscription("slow", "metrics: [x.]\nintervalMs: 600000\n")
                    + "---\n" + _subscription("usual", "metrics: [y.]\nintervalMs: 300000\n"))
    caplog.set_level("WARNING", logger="kcm.subscriptions")

    code, out, _ = _kcm(capsys, "apply", "-f", str(path), "--bootstrap-server", sandbox.bootstrap)

    assert code == 0 and sandbox.store.configs("team.slow")["interval.ms"] == "600000", out
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"ClientMetricsSubscription team/slow ({path}#1): spec.intervalMs 600000 is above 300000 ms, Kafka's default "
        "interval: clients are told to push every 300000 ms at most"]
