"""`kcm rollup`: run the Spark rollup job over the metrics topic (local master by default, or under spark-submit)."""

from __future__ import annotations

import argparse
import json
import math
import os
from datetime import datetime, timedelta

from kcm_cli.arguments import kafka_connection, topic
from kcm_common.errors import UserError
from kcm_common.names import DEFAULT_METRICS_TOPIC

MAX_TOP = 100_000  # rows printed at the end; more belongs in the Parquet output
MAX_MIN_PARTITIONS = 100_000  # Spark tasks a run may be split into; each costs scheduling, however small
HELP = "roll the metrics topic up into fleet-level windows (PySpark, Parquet output)"
DESCRIPTION = ("Read the metrics topic, decode it in Spark and write 1m/1h rollups (count, min, max, avg, last, "
               "p50/p95/p99, instances, increase, rate) as Parquet partitioned by resolution and date. Re-running a "
               "range replaces exactly its windows. Runs locally by default; the same command runs under "
               "spark-submit and in a SparkApplication.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kafka_connection(parser)
    parser.add_argument("--topic", default=DEFAULT_METRICS_TOPIC, type=topic, help="metrics topic (default: %(default)s)")
    parser.add_argument("--from", dest="start", metavar="TIME",
                        help="first record time (Kafka timestamp), ISO 8601 or epoch seconds; widened to a window start")
    parser.add_argument("--to", dest="end", metavar="TIME",
                        help="end of the range, exclusive (default: now); widened to a window end")
    parser.add_argument("--last", metavar="DURATION", help="the range [now - DURATION, now), e.g. 1h or 30m")
    parser.add_argument("--starting-offsets", default="earliest", metavar="OFFSETS",
                        help='earliest or Spark\'s JSON {"topic":{"0":23}} (default: %(default)s)')
    parser.add_argument("--ending-offsets", default="latest", metavar="OFFSETS",
                        help='latest or Spark\'s JSON {"topic":{"0":42}} (default: %(default)s)')
    parser.add_argument("--resolution", default="1m,1h", metavar="SIZES",
                        help="window sizes; each coarser one is merged from the finer (default: %(default)s)")
    parser.add_argument("--group-by", metavar="COLUMNS",
                        help="dimensions besides metric and type (default: "
                             "client_id,client_software_name,client_software_version,attributes)")
    parser.add_argument("--lookback", default="5m", metavar="DURATION",
                        help="read this much before --from to find each cumulative counter's previous value; longer "
                             "than the longest push interval (default: %(default)s)")
    parser.add_argument("--output", required=True, metavar="PATH",
                        help="Parquet directory: local path or any Hadoop filesystem URI (s3a://, gs://, hdfs://)")
    parser.add_argument("--master", metavar="URL",
                        help="Spark master (default: the one spark-submit gives, else local[*])")
    parser.add_argument("--min-partitions", type=int, metavar="N",
                        help="split the offset ranges into at least N Spark partitions")
    parser.add_argument("--top", type=int, default=10, metavar="N",
                        help="print N rows of the latest coarsest window (default: %(default)s; 0 for none)")
    parser.add_argument("--otlp-endpoint", metavar="HOST:PORT",
                        help="also send the rows written to this OTLP/gRPC receiver as gauges, after the write "
                             "(plaintext unless a TLS option below is given)")
    parser.add_argument("--otlp-tls", action="store_true",
                        help="connect to --otlp-endpoint with TLS, trusting the system's CA certificates")
    parser.add_argument("--otlp-ca-file", metavar="FILE", help="TLS to --otlp-endpoint, trusting this PEM CA")
    parser.add_argument("--otlp-cert-file", metavar="FILE",
                        help="client certificate (PEM) for mutual TLS; needs --otlp-key-file")
    parser.add_argument("--otlp-key-file", metavar="FILE", help="the client certificate's private key (PEM)")
    parser.add_argument("--otlp-header-file", action="append", default=[], metavar="NAME=FILE",
                        help="send gRPC metadata NAME with the content of FILE, e.g. a token from a mounted "
                             "Secret (repeatable; never logged)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="kcm's log lines on stderr as text, or one JSON object each (default: %(default)s)")


_FORMAT_WORDS = ("json", "jsonl", "table", "text", "live")


def run(args: argparse.Namespace) -> int:
    from kcm_common.logs import use_json
    from kcm_rollups.job import parse_dimensions, run_rollup
    from kcm_rollups.windows import parse_duration, parse_time

    if args.log_format == "json":   # first: a mistake below is a JSON line too, for a scheduled run's log pipeline
        use_json()
    if args.output.lower() in _FORMAT_WORDS and not os.path.exists(args.output):
        # Every other kcm command's --output is a format: `--output json` here would make a directory named json.
        raise UserError(f"--output is the Parquet directory, not a format: {args.output!r} would be a new directory "
                        f"here; for the summary as JSON give --json, and to write to that directory, "
                        f"--output ./{args.output}")
    if args.last and (args.start or args.end):
        raise UserError("--last cannot be combined with --from/--to; give one or the other")
    if args.end and not args.start:
        raise UserError("--to needs --from")
    options = {}
    if args.group_by:
        options["dimensions"] = parse_dimensions(args.group_by)
    if args.min_partitions is not None:
        if not 1 <= args.min_partitions <= MAX_MIN_PARTITIONS:
            raise UserError(f"--min-partitions must be from 1 to {MAX_MIN_PARTITIONS:,}, not {args.min_partitions}")
        options["min_partitions"] = args.min_partitions
    if not 0 <= args.top <= MAX_TOP:
        raise UserError(f"--top must be from 0 to {MAX_TOP:,}, not {args.top}")
    tls_options = (args.otlp_tls, args.otlp_ca_file, args.otlp_cert_file, args.otlp_key_file, args.otlp_header_file)
    if args.otlp_endpoint:
        from kcm_rollups.otlp import OtlpTarget, parse_header_file

        options["otlp"] = OtlpTarget(args.otlp_endpoint, args.otlp_tls, args.otlp_ca_file, args.otlp_cert_file,
                                     args.otlp_key_file, tuple(parse_header_file(h) for h in args.otlp_header_file))
    elif any(tls_options):
        raise UserError("--otlp-tls, --otlp-ca-file, --otlp-cert-file, --otlp-key-file and --otlp-header-file "
                        "need --otlp-endpoint")
    result = run_rollup(
        args.bootstrap_server, args.topic, args.output,
        start=parse_time(args.start, "--from") if args.start else None,
        end=parse_time(args.end, "--to") if args.end else None,
        last=timedelta(seconds=parse_duration(args.last, "--last")) if args.last else None,
        resolutions=args.resolution, command_config=args.command_config, master=args.master,
        starting_offsets=args.starting_offsets, ending_offsets=args.ending_offsets,
        lookback_seconds=parse_duration(args.lookback, "--lookback"), top=args.top, **options)
    if args.json:
        span = [moment.isoformat() for moment in result.window_range] if result.window_range else None
        print(json.dumps({"window_range": span, "input_records": result.input_records,
                          "decode_errors": result.decode_errors,
                          "points": result.points, "rows_written": result.rows_written, "windows": result.windows,
                          "seconds": round(result.seconds, 3),
                          "stage_seconds": {k: round(v, 3) for k, v in result.stage_seconds.items()},
                          "otlp": dict(zip(("endpoint", "sent", "rejected"), result.exported))
                          if result.exported else None,
                          "top": [{name: _json_value(value) for name, value in row.items()}
                                  for row in result.top_rows]}, allow_nan=False, default=str))
        return 0
    for row in result.top_rows:
        print("  ".join(f"{name}={_cell(value)}" for name, value in row.items() if value is not None))
    for line in result.summary_lines():
        print(line)
    return 0


def _cell(value: object) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _json_value(value: object) -> object:
    """A top row's value in standard JSON: times in ISO 8601, NaN and infinities null (as the demo's summary)."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
