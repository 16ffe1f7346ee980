"""`kcm bridge`: forward the metrics topic to OTLP/gRPC collectors, at least once."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Callable

from kcm_cli.arguments import kafka_connection, topic
from kcm_cli.signals import SAME_SIGNAL_S, StopRequests, on_stop_signals
from kcm_common.logs import where_blocked
from kcm_common.names import DEFAULT_METRICS_TOPIC

log = logging.getLogger("kcm.bridge")
# Past the drain's own bound and a Kafka check the signal may have found under way (kafka-python building its client
# is not cut short): the commit and the consumer's close.
_STOP_MARGIN_S = 5.0

# The settings flags give (`--endpoint` and `--insecure` apart), so that an error about one names its flag.
_FLAGS = {
    ("kafka", "bootstrap_servers"): "--bootstrap-server",
    ("kafka", "command_config"): "--command-config",
    ("kafka", "topics"): "--topic",
    ("kafka", "group_id"): "--group-id",
    ("kafka", "client"): "--kafka-client",
    ("routing",): "--routing",
    ("delivery", "dead_letter_topic"): "--dead-letter-topic",
    ("metrics_port",): "--metrics-port",
    ("log_format",): "--log-format",
}

HELP = "forward client metrics from the metrics topic to OTLP/gRPC collectors"
DESCRIPTION = ("Consume the metrics topic as a consumer group, add the contract headers as resource attributes "
               "and export to OTLP/gRPC collectors; offsets are committed only after export (at least once). "
               "Settings come from --config YAML, then KCM_BRIDGE_* variables, then these flags.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="bridge configuration YAML (see docs/bridge.md)")
    kafka_connection(parser, required=False,
                     properties="client properties file: TLS/SASL and consumer settings (session.timeout.ms, ...)")
    parser.add_argument("--topic", action="append", metavar="TOPIC", type=topic,
                        help=f"topic to read (repeatable; default: {DEFAULT_METRICS_TOPIC})")
    parser.add_argument("--group-id", help="consumer group (default: kcm-bridge)")
    parser.add_argument("--endpoint", action="append", metavar="HOST:PORT",
                        help="OTLP/gRPC collector (repeatable; replaces the config file's endpoints)")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="plaintext gRPC to every endpoint (no TLS)")
    parser.add_argument("--routing", choices=("fanout", "hash"),
                        help="fanout: every endpoint gets everything; hash: each client sticks to one endpoint")
    parser.add_argument("--kafka-client", choices=("confluent-kafka", "kafka-python"),
                        help="consumer implementation (default: confluent-kafka)")
    parser.add_argument("--dead-letter-topic", metavar="TOPIC", type=topic,
                        help="write undecodable records, and records a collector refuses as invalid, here "
                             "(default: count and log them)")
    parser.add_argument("--log-format", choices=("text", "json"),
                        help="json: one object per line (time, level, logger, message); default text")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus /metrics, /healthz and /readyz on this port")


def run(args: argparse.Namespace) -> int:
    """Run the bridge until SIGTERM/SIGINT, then drain and exit 0."""
    from kcm_bridge import config as bridge_config
    from kcm_bridge.pipeline import Bridge, tune_interpreter
    from kcm_common.logs import use_json

    overrides = {where: getattr(args, flag[2:].replace("-", "_")) for where, flag in _FLAGS.items()}
    # JSON asked by the flag or the variable (not only the file): an error in the rest of the configuration is then
    # a JSON line too.
    json_first = (args.log_format or os.environ.get(bridge_config.ENV_PREFIX + "LOG_FORMAT", "").strip()) == "json"
    if json_first:
        use_json()
    config = bridge_config.load(args.config, env=os.environ, overrides=overrides, endpoints=args.endpoint,
                                insecure=args.insecure, flags=_FLAGS)
    if config.log_format == "json" and not json_first:
        use_json()
    bridge_config.warn_of_unknown_variables(config, os.environ)   # in the chosen format, as every line after it
    tune_interpreter()
    bridge = Bridge(config)

    requests = StopRequests()

    def stop(signum: signal.Signals) -> None:
        if requests.is_copy(signum):
            log.info("%s received again within %gs: taken as the same request (a process-group kill sends it "
                     "twice), still draining", signum.name, SAME_SIGNAL_S)
            return
        if bridge.stopping:
            log.warning("%s received again: stopping without waiting for exports (what was exported is committed; "
                        "the rest is read again when a bridge next consumes those partitions)", signum.name)
            bridge.stop(at_once=True)
            return
        log.info("%s received: draining (at most %gs; a second signal stops at once)", signum.name,
                 config.delivery.shutdown_timeout_s)
        bridge.stop()
        _exit_unless_stopped(stopped, config.delivery.shutdown_timeout_s + config.kafka.connect_timeout_s
                             + _STOP_MARGIN_S, threading.main_thread())

    stopped = threading.Event()
    on_stop_signals(stop)
    try:
        return bridge.run()
    finally:
        stopped.set()


def _exit_unless_stopped(stopped: threading.Event, within_s: float, loop: threading.Thread,
                         exit_process: Callable[[int], object] = os._exit) -> threading.Thread:
    """The drain bounds its own waits; a call into the Kafka client that never returns (a commit or close waiting
    for a broker that died mid-request) would still hold the process until Kubernetes kills it, saying nothing. Past
    `within_s` of the first signal: say where the loop is blocked, and exit 1 without it. Nothing is lost: offsets
    are committed only after export, so what was exported and not committed is read again."""
    def watch() -> None:
        if stopped.wait(within_s):
            return
        log.error("the bridge did not stop within %gs of being asked (delivery.shutdown_timeout_s + "
                  "kafka.connect_timeout_s + %gs): exiting without waiting further; what was exported and not "
                  "committed is read again. It was blocked at:\n%s", within_s, _STOP_MARGIN_S, where_blocked(loop))
        exit_process(1)

    watcher = threading.Thread(target=watch, name="kcm-stop-watchdog", daemon=True)
    watcher.start()
    return watcher
