"""OTLP/gRPC export to a real collector: the OTLP retry rules, partial success, call metadata."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from kcm_bridge.config import ConfigError, EndpointConfig, load
from kcm_bridge.export import open_endpoint
from kcm_common.errors import UserError
from kcm_common.otlp_export import Endpoint, RetryPolicy
from kcm_rollups.otlp import OtlpTarget
from fake_collector import FakeCollector
from payloads import client_metrics
from ports import CountingProxy

RETRY = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=1.0)


def _endpoint(collector, **options) -> Endpoint:
    return open_endpoint(EndpointConfig(endpoint=collector.endpoint, insecure=True, **options), RETRY, lambda: False)


# The OTLP specification's retryable codes: any one of them taken for a refusal would drop (and commit) a batch.
@pytest.mark.parametrize("code", [grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
                                  grpc.StatusCode.ABORTED, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAVAILABLE,
                                  grpc.StatusCode.DATA_LOSS], ids=lambda code: code.name)
def test_retryable_codes_are_retried_until_delivered(collector, code):
    collector.fail_next(code, times=2)
    outcome = _endpoint(collector).export(client_metrics().SerializeToString())
    assert outcome.delivered and outcome.attempts == 3
    assert len(collector.exports) == 1


def test_resource_exhausted_waits_the_servers_retry_delay(collector):
    collector.throttle_next(0.4)
    started = time.monotonic()
    outcome = _endpoint(collector).export(client_metrics().SerializeToString())
    assert outcome.delivered and outcome.attempts == 2
    assert time.monotonic() - started >= 0.4


def test_a_servers_retry_delay_is_honoured_only_up_to_the_backoff_cap(collector):
    # A collector or proxy asking for an hour must not hold the export (and the in-flight budget, and a drain) for it.
    collector.throttle_next(3600.0)
    endpoint = open_endpoint(EndpointConfig(endpoint=collector.endpoint, insecure=True),
                             RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.3, jitter=0.0), lambda: False)
    started, outcomes = time.monotonic(), []
    thread = threading.Thread(target=lambda: outcomes.append(endpoint.export(client_metrics().SerializeToString())),
                              daemon=True)
    thread.start()
    thread.join(5)
    assert outcomes, "the export still waits the server's delay of an hour"
    assert outcomes[0].delivered and outcomes[0].attempts == 2
    assert time.monotonic() - started >= 0.25


def test_a_retry_delay_of_zero_still_waits_the_backoff_never_retrying_back_to_back(collector):
    # RetryInfo is "wait at least": a throttling collector answering 0 s must not be sent the batch in a busy loop.
    collector.throttle_next(0.0, times=1000)
    endpoint = open_endpoint(EndpointConfig(endpoint=collector.endpoint, insecure=True),
                             RetryPolicy(initial_backoff_s=0.2, max_backoff_s=0.4, jitter=0.0), lambda: False)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (endpoint.export(client_metrics().SerializeToString()), done.set()),
                              daemon=True)
    thread.start()
    time.sleep(1.5)
    attempts = 1000 - collector.pending_faults()
    collector.clear_faults()
    assert done.wait(10)
    assert 2 <= attempts <= 6, attempts  # 0.2 + 0.4 + 0.4 + 0.4 s of waits in 1.5 s, not hundreds of calls


def test_resource_exhausted_without_retry_info_and_bad_requests_are_not_retried(collector):
    collector.fail_next(grpc.StatusCode.RESOURCE_EXHAUSTED)
    collector.fail_next(grpc.StatusCode.INVALID_ARGUMENT)
    endpoint = _endpoint(collector)
    for code in ("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"):
        outcome = endpoint.export(client_metrics().SerializeToString())
        assert (outcome.delivered, outcome.attempts, outcome.error) == (False, 1, code)
    assert collector.exports == []


def test_partial_success_is_delivered_with_the_rejected_count_logged_and_not_retried(collector, caplog):
    collector.reject_partially_next(2, message="bad unit")
    collector.reject_partially_next(0, message="a warning only")   # the OTLP spec's warning: nothing rejected
    collector.reject_partially_next(-3, message="a server bug")   # counted as nothing, never as a negative count
    endpoint = _endpoint(collector)
    try:
        with caplog.at_level("WARNING", logger="kcm"):
            outcomes = [endpoint.export(client_metrics().SerializeToString()) for _ in range(3)]
    finally:
        endpoint.close()
    assert [(o.delivered, o.attempts, o.rejected_points) for o in outcomes] == [
        (True, 1, 2), (True, 1, 0), (True, 1, 0)]
    assert [r.getMessage() for r in caplog.records if r.name == "kcm.otlp"] == [
        f"export to {collector.endpoint} partially rejected: {count} points ({why})"
        for count, why in ((2, "bad unit"), (0, "a warning only"), (0, "a server bug"))]


def test_a_shutdown_deadline_abandons_retries_without_claiming_delivery(collector):
    collector.fail_next(grpc.StatusCode.UNAVAILABLE, times=100)
    endpoint = open_endpoint(EndpointConfig(endpoint=collector.endpoint, insecure=True), RETRY, lambda: True)
    outcome = endpoint.export(client_metrics().SerializeToString())
    assert outcome.abandoned and not outcome.delivered


def test_headers_from_files_and_environment_arrive_as_call_metadata(collector, tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text("Bearer s3cret\n")
    monkeypatch.setenv("OTLP_TENANT", "kafka-team")
    endpoint = _endpoint(collector, headers={"x-static": "1"}, headers_from_files={"authorization": str(token)},
                         headers_from_env={"x-scope-orgid": "OTLP_TENANT"})
    assert endpoint.export(client_metrics().SerializeToString()).delivered
    metadata = collector.exports[0].metadata
    assert metadata["authorization"] == "Bearer s3cret"
    assert metadata["x-scope-orgid"] == "kafka-team" and metadata["x-static"] == "1"


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED])
def test_refused_credentials_are_final_but_the_next_export_reads_the_token_file_again(collector, tmp_path, code):
    token = tmp_path / "token"
    token.write_text("Bearer old-s3cret\n")
    endpoint = _endpoint(collector, headers_from_files={"authorization": str(token)})
    token.write_text("Bearer new-s3cret\n")  # the Secret rotated after the bridge started
    collector.fail_next(code)

    refused = endpoint.export(client_metrics().SerializeToString())
    delivered = endpoint.export(client_metrics().SerializeToString())

    assert (refused.delivered, refused.attempts, refused.error) == (False, 1, code.name)  # as the OTLP spec says
    assert refused.note == "; the headers were read again and have changed"
    assert delivered.delivered and delivered.attempts == 1
    assert [export.metadata["authorization"] for export in collector.exports] == ["Bearer new-s3cret"]


def test_a_refusal_says_the_headers_are_unchanged_when_the_token_file_is_as_it_was(collector, tmp_path):
    token = tmp_path / "token"
    token.write_text("Bearer s3cret\n")
    endpoint = _endpoint(collector, headers_from_files={"authorization": str(token)})
    collector.fail_next(grpc.StatusCode.UNAUTHENTICATED)
    try:
        refused = endpoint.export(client_metrics().SerializeToString())
    finally:
        endpoint.close()
    assert (refused.error, refused.note) == ("UNAUTHENTICATED", "; the headers were read again")


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED])
def test_refused_credentials_are_retried_with_the_token_file_read_again_when_asked(collector, tmp_path, code,
                                                                                    caplog):
    token = tmp_path / "token"
    token.write_text("Bearer old-s3cret\n")
    endpoint = _endpoint(collector, headers_from_files={"authorization": str(token)}, retry_refused_credentials=True)
    token.write_text("Bearer new-s3cret\n")  # the Secret rotated after the bridge started
    collector.fail_next(code, times=2)

    outcome = endpoint.export(client_metrics().SerializeToString())

    assert outcome.delivered and outcome.attempts == 3
    assert [export.metadata["authorization"] for export in collector.exports] == ["Bearer new-s3cret"]
    retries = [record.getMessage() for record in caplog.records if record.name == "kcm.otlp"]
    assert len(retries) == 2 and all(code.name in line for line in retries)
    assert f"failed with {code.name}; check the endpoint's headers (" in retries[0]
    assert "the headers were read again and have changed" in retries[0]
    assert "s3cret" not in caplog.text


def test_refused_credentials_retried_send_a_token_fixed_during_the_backoff_wait_with_the_very_next_attempt(
        collector, tmp_path, caplog):
    """The headers were read again right after the refusal, before the wait: a token fixed during the wait went
    only with the retry after next."""
    token = tmp_path / "token"
    token.write_text("Bearer old-s3cret\n")
    endpoint = open_endpoint(EndpointConfig(endpoint=collector.endpoint, insecure=True, retry_refused_credentials=True,
                                            headers_from_files={"authorization": str(token)}),
                             RetryPolicy(initial_backoff_s=1.5, max_backoff_s=1.5, jitter=0.0), lambda: False)
    collector.fail_next(grpc.StatusCode.UNAUTHENTICATED)

    def fix_the_token_once_refused() -> None:
        deadline = time.monotonic() + 10
        while "retrying in" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
        token.write_text("Bearer new-s3cret\n")   # during the 1.5 s wait

    fixer = threading.Thread(target=fix_the_token_once_refused)
    fixer.start()
    try:
        outcome = endpoint.export(client_metrics().SerializeToString())
    finally:
        fixer.join(15)
        endpoint.close()
    assert outcome.delivered and outcome.attempts == 2
    assert [export.metadata["authorization"] for export in collector.exports] == ["Bearer new-s3cret"]
    assert "s3cret" not in caplog.text


def test_refused_credentials_whose_file_cannot_be_read_again_keep_the_headers_and_go_on_retrying(collector, tmp_path,
                                                                                                  caplog):
    token = tmp_path / "token"
    token.write_text("Bearer s3cret")
    endpoint = _endpoint(collector, headers_from_files={"authorization": str(token)}, retry_refused_credentials=True)
    token.unlink()  # half-way through a rotation
    collector.fail_next(grpc.StatusCode.UNAUTHENTICATED)

    assert endpoint.export(client_metrics().SerializeToString()).delivered
    assert collector.exports[0].metadata["authorization"] == "Bearer s3cret"
    assert "the headers could not be read again" in caplog.text and "s3cret" not in caplog.text


def test_without_retrying_refused_credentials_they_are_a_refusal_for_good(collector):
    # The rollup job's exporter: a batch job stops and says why rather than wait for a new token.
    collector.fail_next(grpc.StatusCode.UNAUTHENTICATED)
    outcome = Endpoint(collector.endpoint, RETRY, lambda: False, insecure=True).export(
        client_metrics().SerializeToString())
    assert (outcome.delivered, outcome.attempts, outcome.error) == (False, 1, "UNAUTHENTICATED")


@pytest.mark.parametrize("compression, compressed", [("gzip", True), ("none", False)])
def test_compression_setting_decides_what_goes_over_the_wire(collector, compression, compressed):
    request = client_metrics().SerializeToString() * 200  # concatenated MetricsData: one larger, repetitive request
    proxy = CountingProxy(collector.endpoint)
    try:
        endpoint = open_endpoint(EndpointConfig(endpoint=proxy.endpoint, insecure=True, compression=compression),
                            RETRY, lambda: False)
        assert endpoint.export(request).delivered
        assert collector.exports[0].request.SerializeToString() == request
        assert (proxy.sent < len(request) / 4) == compressed, (proxy.sent, len(request))
    finally:
        proxy.close()


def test_garbled_status_details_from_a_server_mean_no_retry_delay_not_a_crash():
    from google.protobuf.duration_pb2 import Duration
    from google.rpc import error_details_pb2, status_pb2

    from kcm_common.otlp_export import retry_delay_s

    class Failure(grpc.RpcError):
        def __init__(self, details: bytes) -> None:
            self._details = details

        def trailing_metadata(self):
            return (("grpc-status-details-bin", self._details),)

    status = status_pb2.Status(code=8)
    status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=Duration(seconds=2, nanos=500_000_000)))
    assert retry_delay_s(Failure(status.SerializeToString())) == 2.5
    assert retry_delay_s(Failure(b"\xff\xff not a status")) is None


def test_backoff_reaches_its_cap_and_stays_there_however_long_the_outage():
    import random

    from kcm_common.retry import backoff_s

    rng = random.Random(7)
    steady = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=30.0, jitter=0.0)
    assert [backoff_s(attempt, steady, rng) for attempt in (1, 2, 6, 7, 1025, 10**9)] == [0.5, 1, 16, 30, 30, 30]
    # Days of retries, or a huge multiplier, never overflow a float: the bridge's retries and Kafka checks go on.
    assert backoff_s(3, RetryPolicy(multiplier=1e200, jitter=0.0), rng) == 30.0
    assert 24 <= backoff_s(10**6, RetryPolicy(), rng) <= 30.0


def test_every_failed_attempt_is_reported_as_it_happens(collector):
    collector.fail_next(grpc.StatusCode.UNAVAILABLE, times=2)
    collector.fail_next(grpc.StatusCode.INVALID_ARGUMENT)
    failures: list[tuple[str, bool]] = []
    endpoint = open_endpoint(EndpointConfig(endpoint=collector.endpoint, insecure=True), RETRY, lambda: False,
                             lambda code, retrying: failures.append((code, retrying)))
    try:
        outcome = endpoint.export(client_metrics().SerializeToString())
    finally:
        endpoint.close()
    assert (outcome.delivered, outcome.error) == (False, "INVALID_ARGUMENT")
    assert failures == [("UNAVAILABLE", True), ("UNAVAILABLE", True), ("INVALID_ARGUMENT", False)]


def test_a_failure_that_is_not_the_servers_answer_is_retried_not_left_behind(collector, caplog):
    failures: list[tuple[str, bool]] = []
    endpoint = open_endpoint(EndpointConfig(endpoint=collector.endpoint, insecure=True), RETRY, lambda: False,
                             lambda code, retrying: failures.append((code, retrying)))
    call, calls = endpoint._call, []

    def broken_thrice(*args, **kwargs):
        calls.append(1)
        if len(calls) <= 3:
            raise OverflowError("a bug")
        return call(*args, **kwargs)

    endpoint._call = broken_thrice
    try:
        with caplog.at_level("ERROR", logger="kcm"):
            outcome = endpoint.export(client_metrics().SerializeToString())
    finally:
        endpoint.close()
    assert (outcome.delivered, outcome.attempts) == (True, 4) and len(collector.exports) == 1
    assert failures == [("UNEXPECTED", True)] * 3
    errors = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert [f"(attempt {n}); retrying in" in r.getMessage() for n, r in enumerate(errors, 1)] == [True] * 3
    assert [bool(r.exc_info) for r in errors] == [True, False, False]   # the traceback once, not at every retry


def test_an_export_after_its_caller_gave_up_and_closed_the_channel_is_abandoned_quietly(collector, caplog):
    failures: list[tuple[str, bool]] = []
    endpoint = open_endpoint(EndpointConfig(endpoint=collector.endpoint, insecure=True), RETRY, lambda: True,
                             lambda code, retrying: failures.append((code, retrying)))
    endpoint.close()   # a shutdown: the channel is closed under an export still running
    with caplog.at_level("WARNING", logger="kcm"):
        outcome = endpoint.export(client_metrics().SerializeToString())
    assert (outcome.abandoned, outcome.delivered, outcome.error) == (True, False, "UNEXPECTED")
    assert failures == [] and [r.getMessage() for r in caplog.records if r.name == "kcm.otlp"] == []


def test_a_caller_giving_up_during_a_long_backoff_is_heard_within_a_fraction_of_a_second(collector):
    collector.fail_next(grpc.StatusCode.UNAVAILABLE, times=100)
    endpoint = open_endpoint(EndpointConfig(endpoint=collector.endpoint, insecure=True),
                             RetryPolicy(initial_backoff_s=5, max_backoff_s=5, jitter=0), lambda: False)
    started = time.monotonic()
    try:
        outcome = endpoint.export(client_metrics().SerializeToString(),
                                  give_up=lambda: time.monotonic() - started > 0.3)
    finally:
        endpoint.close()
    assert outcome.abandoned and outcome.attempts == 1
    assert time.monotonic() - started < 2.5   # not the 5 s backoff: a drain's deadline is shorter than a backoff cap


def test_a_caller_that_gave_up_during_the_backoff_gets_no_further_attempt(collector):
    collector.fail_next(grpc.StatusCode.UNAVAILABLE)
    endpoint = open_endpoint(EndpointConfig(endpoint=collector.endpoint, insecure=True),
                             RetryPolicy(initial_backoff_s=0, max_backoff_s=0), lambda: False)
    asked: list[int] = []

    def gives_up_after_its_first_answer() -> bool:
        asked.append(1)
        return len(asked) > 1

    try:
        outcome = endpoint.export(client_metrics().SerializeToString(), give_up=gives_up_after_its_first_answer)
    finally:
        endpoint.close()
    assert (outcome.abandoned, outcome.attempts) == (True, 1) and collector.exports == []


def test_a_long_many_line_unavailable_detail_is_logged_on_one_line_and_cut_short(collector, caplog):
    collector.fail_next(grpc.StatusCode.UNAVAILABLE, message="one\ntwo\r\n" + "x" * 1000)
    endpoint = _endpoint(collector)
    try:
        with caplog.at_level("WARNING", logger="kcm"):
            assert endpoint.export(client_metrics().SerializeToString()).delivered
    finally:
        endpoint.close()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "kcm.otlp"]
    assert "(one two  xxx" in line and "…)" in line
    assert "\n" not in line and "\r" not in line and len(line) < 600


def test_a_collector_slower_than_the_timeout_is_named_as_such(collector, caplog):
    collector.stall_next(1.0)
    endpoint = _endpoint(collector, timeout_s=0.3)
    try:
        with caplog.at_level("WARNING", logger="kcm"):
            outcome = endpoint.export(client_metrics().SerializeToString())
    finally:
        endpoint.close()
    assert outcome.delivered and outcome.attempts >= 2
    assert any("failed with DEADLINE_EXCEEDED (no answer within the 0.3 s timeout: if the collector is only slow, "
               "give it a longer one)" in r.getMessage() for r in caplog.records)


def test_after_a_long_outage_the_export_gets_through_soon_after_the_collector_is_back():
    """gRPC reconnects on its own backoff, up to 120 s by default, and fails calls at once meanwhile: the channel
    must reconnect within the retry policy's cap, or exports keep failing long after the collector is back."""
    from fake_collector import FakeCollector

    first = FakeCollector()
    first.start()
    port = first.port
    first.stop()
    endpoint = Endpoint(f"127.0.0.1:{port}", RetryPolicy(initial_backoff_s=0.1, max_backoff_s=0.5),
                        lambda: False, insecure=True)
    outcome: list = []
    exporting = threading.Thread(target=lambda: outcome.append(endpoint.export(client_metrics().SerializeToString())),
                                 daemon=True)
    exporting.start()
    time.sleep(12)   # gRPC's own backoff would by now wait some 6 s (1.6^6 s, ±20%) before its next attempt
    back = FakeCollector(port=port)
    back.start()
    try:
        returned = time.monotonic()
        exporting.join(timeout=30)
        assert outcome and outcome[0].delivered, outcome
        assert time.monotonic() - returned < 2.5
        assert len(back.exports) == 1
    finally:
        endpoint.close()
        back.stop()


def test_export_latency_buckets_reach_past_the_retries_an_outage_takes():
    """The default buckets ended at 10 s: every export that needed a retry landed in +Inf."""
    from kcm_bridge.metrics import BridgeMetrics

    metrics = BridgeMetrics()
    metrics.export_seconds.labels(endpoint="c:4317").observe(45.0)
    sample = metrics.registry.get_sample_value
    assert sample("kcm_bridge_export_seconds_bucket", {"endpoint": "c:4317", "le": "30.0"}) == 0
    assert sample("kcm_bridge_export_seconds_bucket", {"endpoint": "c:4317", "le": "60.0"}) == 1


@pytest.mark.parametrize("host", ["ipv4", "unix", "dns"])
def test_a_host_named_like_a_grpc_scheme_is_a_host_to_resolve_not_a_scheme(host):
    # gRPC reads "ipv4:9" as an ipv4: URI, an invalid target (UNKNOWN, refused for good: every batch dropped), and
    # "unix:9" as a socket path; given "dns:///" first, the name is looked up, and an unknown one is retried.
    endpoint = Endpoint(f"{host}:9", RETRY, lambda: True, insecure=True, timeout_s=5)
    try:
        outcome = endpoint.export(client_metrics().SerializeToString())
    finally:
        endpoint.close()
    assert outcome.abandoned and outcome.error in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), outcome
    assert "No such file" not in outcome.detail   # not a unix socket path


def test_an_ipv6_endpoint_in_brackets_is_delivered_to():
    try:
        collector = FakeCollector(host="[::1]")
        collector.start()
    except RuntimeError:   # a machine without IPv6 loopback
        pytest.skip("no IPv6 loopback address to listen on")
    endpoint = Endpoint(f"[::1]:{collector.port}", RETRY, lambda: False, insecure=True, timeout_s=5)
    try:
        assert endpoint.export(client_metrics().SerializeToString()).delivered
    finally:
        endpoint.close()
        collector.stop()
    assert len(collector.exports) == 1


@pytest.mark.parametrize("name", ["content-type", "te", "content-length", "user-agent", "connection", "keep-alive",
                                  "proxy-connection", "transfer-encoding", "upgrade"])
def test_a_header_grpc_sets_itself_or_http2_forbids_is_refused_at_start(name):
    # gRPC drops or replaces the first four without a word; a strict server refuses a request with the others.
    with pytest.raises(ConfigError, match=f"endpoints.0..headers.{name}: header '{name}' is one gRPC sets itself"):
        load(env={}, overrides={("kafka", "bootstrap_servers"): "k:9092",
                                ("endpoints",): [{"endpoint": "c:4317", "headers": {name: "x"}}]})
    with pytest.raises(UserError, match=f"header '{name}' is one gRPC sets itself"):
        OtlpTarget("c:4317", header_files=((name, __file__),))


@pytest.fixture
def two_addresses(monkeypatch):
    """Two collectors on the same port of two loopback addresses, and an endpoint name that resolves to both (as a
    headless Service's name does to its pods): gRPC's `ipv4:` resolver stands in for DNS, which has no such name
    here."""
    first = FakeCollector("127.0.0.1")
    first.start()
    second = FakeCollector("127.0.0.2", first.port)
    try:
        second.start()
    except BaseException:
        first.stop()
        raise
    monkeypatch.setattr("kcm_common.otlp_export._target", lambda endpoint: (
        f"ipv4:127.0.0.1:{first.port},127.0.0.2:{first.port}" if endpoint == "collectors:4317" else endpoint))
    try:
        yield first, second
    finally:
        first.stop()
        second.stop()


@pytest.mark.parametrize("balancing", ["pick_first", "round_robin"])
def test_round_robin_balancing_spreads_exports_over_every_address_of_the_name(two_addresses, balancing):
    first, second = two_addresses
    endpoint = open_endpoint(EndpointConfig(endpoint="collectors:4317", insecure=True, balancing=balancing), RETRY,
                             lambda: False)
    try:
        assert all(endpoint.export(client_metrics().SerializeToString()).delivered for _ in range(20))
        counts = sorted((len(first.exports), len(second.exports)))
        # round_robin takes each address in turn once connected (the first calls may all go to the first ready).
        assert counts == [0, 20] if balancing == "pick_first" else counts[0] >= 5, counts
        # The busier address gone (a collector pod stopped): either policy goes on with the other, nothing lost.
        (first if len(first.exports) >= len(second.exports) else second).stop()
        outcomes = [endpoint.export(client_metrics().SerializeToString()) for _ in range(10)]
    finally:
        endpoint.close()
    assert all(outcome.delivered for outcome in outcomes)
    assert len(first.exports) + len(second.exports) == 30
