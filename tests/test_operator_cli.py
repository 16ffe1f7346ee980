"""`kcm operator` as a process: finds the API through KUBECONFIG, reconciles, serves metrics and liveness, stops on SIGTERM."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client, config

from ports import reserved_port
from kube_emulator import KubeServer
from test_operator_reconcile import GROUP, IN_KAFKA, NS, PLURAL, SPEC, wait_for

CRDS = sorted((Path(__file__).resolve().parents[1] / "crds").glob("*.yaml"))


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except OSError:
        return 0, ""


@pytest.fixture
def kube(tmp_path):
    server = KubeServer(tmp_path, CRDS)
    server.start()
    yield server
    server.stop()


# As in the image: uid 10001 has no passwd entry, and Kubernetes sets none of the variables getpass reads first.
_WITHOUT_A_USER = ("import pwd, sys\n"
                   "def unknown(uid): raise KeyError(f'getpwuid(): uid not found: {uid}')\n"
                   "pwd.getpwuid = unknown\n"
                   "from kcm_cli.main import main\n"
                   "sys.exit(main(sys.argv[1:]))\n")
_USER_VARIABLES = ("LOGNAME", "USER", "LNAME", "USERNAME", "POD_ID")


def test_the_operator_process_reconciles_and_serves_metrics_and_liveness(kube, sandbox, tmp_path):
    """Run as the image runs it: a uid without a passwd entry, no POD_ID, no user variables. Its kubeconfig's server
    URL carries a user name and password besides the user entry's token (kopf's HTTP client refused every request)."""
    kubeconfig = tmp_path / "operator-kubeconfig"
    kubeconfig.write_text(kube.kubeconfig.read_text().replace("http://", "http://kcm:S3cr3tPW@", 1))
    temporary = tmp_path / "tmp"   # the operator's TMPDIR: where it writes KafkaConnections' TLS material
    temporary.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kcm-test-ca", "-days",
                    "2", "-keyout", str(tmp_path / "ca.key"), "-out", str(tmp_path / "ca.pem")],
                   check=True, capture_output=True, timeout=60)
    # Reserved until the operator listens there: a port only seen free can be taken meanwhile.
    with reserved_port() as metrics_port, reserved_port() as liveness_port:
        environment = {name: value for name, value in os.environ.items() if name not in _USER_VARIABLES}
        process = subprocess.Popen(
            [sys.executable, "-c", _WITHOUT_A_USER, "operator", "--all-namespaces", "--standalone",
             "--bootstrap-server", sandbox.bootstrap, "--metrics-port", str(metrics_port),
             "--liveness-port", str(liveness_port), "--listen-address", "127.0.0.1", "--log-format", "json",
             "--drift-interval", "1"],
            env={**environment, "KUBECONFIG": str(kubeconfig), "TMPDIR": str(temporary)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            api = config.new_client_from_config(str(kube.kubeconfig))
            custom = client.CustomObjectsApi(api)
            custom.create_namespaced_custom_object(GROUP, "v1alpha1", NS, PLURAL, {
                "apiVersion": f"{GROUP}/v1alpha1", "kind": "ClientMetricsSubscription",
                "metadata": {"name": "payments"}, "spec": SPEC})

            wait_for(lambda: sandbox.store.configs("team.payments") == IN_KAFKA, "the subscription in Kafka", 30)
            # A KafkaConnection with TLS material: written to a private directory, which must go with the operator.
            client.CoreV1Api(api).create_namespaced_secret(NS, {"metadata": {"name": "kafka-ca"}, "data": {
                "ca.crt": base64.b64encode((tmp_path / "ca.pem").read_bytes()).decode()}})
            custom.create_namespaced_custom_object(GROUP, "v1alpha1", NS, "kafkaconnections", {
                "apiVersion": f"{GROUP}/v1alpha1", "kind": "KafkaConnection", "metadata": {"name": "tls"},
                "spec": {"bootstrapServers": "127.0.0.1:1", "securityProtocol": "SSL",
                         "tls": {"caSecretRef": {"name": "kafka-ca"}}}})
            custom.create_namespaced_custom_object(GROUP, "v1alpha1", NS, PLURAL, {
                "apiVersion": f"{GROUP}/v1alpha1", "kind": "ClientMetricsSubscription",
                "metadata": {"name": "orders"}, "spec": {**SPEC, "subscriptionName": "orders", "connection": "tls"}})
            wait_for(lambda: list(temporary.glob("kcm-operator-tls-*/*")), "the KafkaConnection's CA written", 30)
            # What the subscription found through it is said on the KafkaConnection too (nothing listens on port 1).
            said = wait_for(lambda: next((c for c in (custom.get_namespaced_custom_object(
                GROUP, "v1alpha1", NS, "kafkaconnections", "tls").get("status") or {}).get("conditions") or ()
                if c["type"] == "Ready" and c["reason"] != "Unused"), None), "the KafkaConnection's status", 30)
            assert (said["status"], said["reason"]) == ("False", "KafkaUnavailable")
            assert "127.0.0.1:1" in said["message"]

            assert wait_for(lambda: _get(f"http://127.0.0.1:{liveness_port}/healthz")[0] == 200, "liveness")
            # Counted once Kafka has answered, so a moment after the subscription is there.
            applied = 'kcm_operator_reconciliations_total{reason="Applied",result="applied"} 1.0'
            metrics = wait_for(lambda: (page := _get(f"http://127.0.0.1:{metrics_port}/metrics")[1]) and applied in page
                               and page, "the reconciliation counted in the metrics")
            assert "kcm_operator_managed_subscriptions 1.0" in metrics
            # Drift checks and probes go on without a line each from kopf (hundreds of resources would drown kcm's).
            unchanged = 'kcm_operator_reconciliations_total{reason="Applied",result="unchanged"} 3.0'
            wait_for(lambda: unchanged in _get(f"http://127.0.0.1:{metrics_port}/metrics")[1], "drift checks", 30)
            assert _get(f"http://127.0.0.1:{liveness_port}/healthz")[0] == 200
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                output, _ = process.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate()
        assert process.returncode == 0, output
        logged = [json.loads(line) for line in output.splitlines()]
        assert not [entry for entry in logged if entry["logger"] == "aiohttp.access"
                    or entry["message"] == "Timer 'drift' succeeded."], output
        assert list(temporary.iterdir()) == [], "the operator left TLS material behind"
        logs = [json.loads(line) for line in output.splitlines()]
        assert {"time", "level", "logger", "message"} <= set(logs[0])
        assert any(entry.get("name") == "payments" and entry.get("namespace") == NS for entry in logs)
        assert "S3cr3tPW" not in output
        assert any(entry["message"].startswith("the kubeconfig's cluster server URL carries a user name and password")
                   for entry in logs), output


@pytest.mark.parametrize("server, token, username, expected", [
    ("https://kcm:pw@10.0.0.1:6443", "t", None, "https://10.0.0.1:6443"),
    ("https://kcm:pw@10.0.0.1:6443/prefix", None, "u", "https://10.0.0.1:6443/prefix"),
    ("https://kcm:pw@10.0.0.1:6443", None, None, "https://kcm:pw@10.0.0.1:6443"),   # the URL's are the only ones
    ("https://10.0.0.1:6443", "t", None, "https://10.0.0.1:6443"),
])
def test_a_server_url_with_credentials_is_used_without_them_when_the_user_entry_gives_some(server, token, username,
                                                                                          expected):
    import kopf
    from kcm_operator.handlers import one_credential

    given = kopf.ConnectionInfo(server=server, token=token, username=username, password="p" if username else None)
    used = one_credential(given)
    assert (used.server, used.token, used.username) == (expected, token, username)
    assert one_credential(None) is None


def test_no_kubernetes_api_is_a_one_line_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "kcm_cli.main", "operator", "-n", "team", "--bootstrap-server", "127.0.0.1:9092"],
        env={**os.environ, "KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=60)

    assert result.returncode == 2
    assert result.stderr.startswith("kcm operator: cannot find the Kubernetes API")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, message", [
    (["--peering-lifetime", "0"], "kcm operator: --peering-lifetime must be from 1 second to 86400 (a day), not 0"),
    (["--peering-lifetime", "400000000000"], "--peering-lifetime must be from 1 second to 86400 (a day), not 4000"),
    (["--peering-lifetime", "1.5"], "argument --peering-lifetime: invalid int value: '1.5'"),
    (["--peering-name", "Kcm_Peers"], "--peering-name 'Kcm_Peers' is not a Kubernetes object name"),
    (["--peering-name", "kcm", "--standalone"], "--peering-name and --standalone contradict each other"),
])
def test_bad_peering_settings_are_a_one_line_error(tmp_path, flags, message):
    result = subprocess.run(
        [sys.executable, "-m", "kcm_cli.main", "operator", "-n", "team", "--bootstrap-server", "127.0.0.1:9092",
         *flags],
        env={**os.environ, "KUBECONFIG": str(tmp_path / "missing")}, capture_output=True, text=True, timeout=60)

    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _operator(tmp_path: Path, *flags: str, kubeconfig: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "kubeconfig")}
    if kubeconfig is not None:
        (tmp_path / "kubeconfig").write_text(kubeconfig)
    return subprocess.run(
        [sys.executable, "-m", "kcm_cli.main", "operator", "-n", "team", "--bootstrap-server", "127.0.0.1:9092",
         *flags], env=env, capture_output=True, text=True, timeout=60)


def _one_line(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert fragment in result.stderr, result.stderr


_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_a_kubeconfig_that_is_not_yaml_is_a_one_line_error(tmp_path):
    _one_line(_operator(tmp_path, kubeconfig="clusters: [unclosed\n  - {\n"), "the kubeconfig")


@pytest.mark.parametrize("kubeconfig", ["foo\n", "- a\n- b\n", "clusters: 3\ncurrent-context: x\n"])
def test_a_kubeconfig_that_is_yaml_but_not_a_kubeconfig_is_a_one_line_error(tmp_path, kubeconfig):
    _one_line(_operator(tmp_path, kubeconfig=kubeconfig), "the kubeconfig (KUBECONFIG or ~/.kube/config) is not a "
              "kubeconfig: it must be a mapping with clusters, users, contexts and current-context")


def test_a_kubernetes_api_that_does_not_answer_is_said_at_once_naming_it_without_credentials(tmp_path):
    """kopf retried for over a minute with a line naming only a request path (and tracebacks), then stopped."""
    (tmp_path / "kubeconfig").write_text(_KUBECONFIG.replace("https://127.0.0.1:1", "https://kcm:S3cr3tPW@127.0.0.1:1"))
    process = subprocess.Popen(
        [sys.executable, "-m", "kcm_cli.main", "operator", "-n", "team", "--bootstrap-server", "127.0.0.1:9092",
         "--metrics-port", "0", "--liveness-port", "0"],
        env={**os.environ, "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "kubeconfig")},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    said = "ERROR kcm.operator: the Kubernetes API at https://127.0.0.1:1 does not answer (NewConnectionError: " \
           "[Errno 111] Connection refused): check that the API server is up and reachable from here"
    lines: list[str] = []
    try:
        wait_for(lambda: _read_until(process, lines, said), "the line about the API server", 20)
    finally:
        process.kill()
        lines += process.communicate(timeout=10)[1].splitlines()
    assert "S3cr3tPW" not in "\n".join(lines)


def _read_until(process: subprocess.Popen, lines: list[str], fragment: str) -> bool:
    line = process.stderr.readline()
    lines.append(line)
    return fragment in line or bool(process.poll() is not None and not line and pytest.fail("\n".join(lines)))


def test_a_kubeconfig_that_is_not_text_is_a_one_line_error(tmp_path):
    (tmp_path / "kubeconfig").write_bytes(bytes(range(0xf9, 0xff)) * 100)
    _one_line(_operator(tmp_path), "the kubeconfig (KUBECONFIG or ~/.kube/config) is not UTF-8 text (byte 0)")


@pytest.mark.parametrize("field", ["certificate-authority-data", "client-key-data"])
def test_a_kubeconfig_with_data_that_is_not_base64_is_a_one_line_error_quoting_none_of_it(tmp_path, field):
    where = "cluster: {" if field.startswith("certificate") else "user: {"
    result = _operator(tmp_path, kubeconfig=_KUBECONFIG.replace(where, f'{where}{field}: "!!S3cr3t!", ', 1))
    _one_line(result, "the kubeconfig (KUBECONFIG or ~/.kube/config) holds a value that is not valid base64")
    assert "S3cr3t" not in result.stderr


def test_a_kubeconfig_server_that_is_not_a_url_is_a_one_line_error_without_the_password(tmp_path):
    result = _operator(tmp_path, kubeconfig=_KUBECONFIG.replace('"https://127.0.0.1:1"', '"not a url"').replace(
        "{token: t}", "{username: alice, password: S3cr3tPW}"))
    _one_line(result, "the kubeconfig's cluster server is not an https:// URL of the Kubernetes API; check its")
    assert "S3cr3tPW" not in result.stderr + result.stdout


@pytest.mark.parametrize("option", ["--metrics-port", "--liveness-port"])
def test_a_port_in_use_is_a_one_line_error(tmp_path, option):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        other = "--liveness-port" if option == "--metrics-port" else "--metrics-port"
        result = _operator(tmp_path, option, str(port), other, "0", "--listen-address", "127.0.0.1",
                           kubeconfig=_KUBECONFIG)

    _one_line(result, f"{option} {port}: cannot listen on it")


def test_with_json_logs_an_error_found_after_the_switch_is_one_json_line(tmp_path):
    """A log pipeline parsing JSON lines gets the error that ends the process (found once logs are JSON) as one."""
    import json
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = _operator(tmp_path, "--metrics-port", str(port), "--liveness-port", "0", "--listen-address",
                           "127.0.0.1", "--log-format", "json", kubeconfig=_KUBECONFIG)

    _one_line(result, f"--metrics-port {port}: cannot listen on it")
    entry = json.loads(result.stderr)
    assert (entry["level"], entry["message"].split(":")[0]) == ("ERROR", "kcm operator"), entry


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_client_property_file_naming_a_missing_ca_is_one_line_in_the_log_format_chosen(tmp_path, log_format):
    """The first thing the operator reads: its error was plain text under --log-format json (the bridge's is JSON)."""
    import json

    properties = tmp_path / "client.properties"
    properties.write_text(f"security.protocol=SSL\nssl.ca.location={tmp_path / 'missing-ca.pem'}\n")
    result = _operator(tmp_path, "--command-config", str(properties), "--log-format", log_format,
                       kubeconfig=_KUBECONFIG)
    _one_line(result, "client property ssl.ca.location names")
    if log_format == "json":
        assert json.loads(result.stderr)["level"] == "ERROR", result.stderr
    else:
        assert result.stderr.startswith("kcm operator: "), result.stderr


def test_the_same_port_for_metrics_and_liveness_is_a_one_line_error(tmp_path):
    _one_line(_operator(tmp_path, "--metrics-port", "19090", "--liveness-port", "19090", kubeconfig=_KUBECONFIG),
              "--metrics-port and --liveness-port are both 19090; give them different ports")


@pytest.mark.parametrize("value", ["localhost", "0.0.0.0:9090", "999.1.1.1"])
def test_a_listen_address_that_is_not_an_ip_address_is_a_one_line_error(tmp_path, value):
    _one_line(_operator(tmp_path, "--listen-address", value, kubeconfig=_KUBECONFIG),
              f"--listen-address {value!r} is not an IP address (e.g. 0.0.0.0, 127.0.0.1 or ::)")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0.5"])
def test_a_drift_interval_that_is_not_a_finite_number_of_at_least_a_second_is_refused(tmp_path, value):
    _one_line(_operator(tmp_path, "--drift-interval", value),
              f"argument --drift-interval: must be a finite number of seconds of at least 1, at most 31536000 (a year), "
              f"not {value}")
