"""The Spark session the rollup job runs in, and which Kafka reader it has: Spark's connector or kcm's source."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession

from kcm_rollups.source import SOURCE_NAME, KafkaDataSource

REDACTED_OPTIONS = "(?i)url|password|secret|token|jaas|keystore[.]key"
# What Spark redacts in its own logs (the Kafka connector's client parameters at DEBUG) and the environment page:
# Spark's default, plus the inline private key and JAAS line kcm passes to the connector.
REDACTED_SETTINGS = "(?i)secret|password|token|access[.]?key|keystore[.]key|jaas"
_CONNECTOR_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
# A local master's JVM compiles with C1 only. The job's heavy work is Python's (decoding, the state per batch); the
# JVM merges some 30 times fewer rows, in code Spark generates afresh for each query, so C2 kept compiling (Janino
# and the generated classes) through every run: 4-7 CPU-s of a 2-core machine's 16 per run. With C1 only, 1M points
# took 14.9 s on a fresh JVM and 7.6 s on the next run, against 16.9 and 8.9 s. Prepended to
# spark.driver.extraJavaOptions, so `-XX:TieredStopAtLevel=4` there puts C2 back.
LOCAL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
# And Spark's own logging, unless the user has a log4j2 configuration of their own: see the file.
LOCAL_LOGGING = Path(__file__).with_name("log4j2-local.properties")
# The files log4j2 finds in Spark's conf directory (not Spark's `log4j2.properties.template`).
_LOG4J2_CONFIGURATION = re.compile(r"log4j2(-test)?\.(properties|xml|json|jsn|yaml|yml)")
# Spark 4.3's switch to aggregate after the shuffle only (older versions ignore an unknown key). Merging state rows
# whose keys barely repeat within a task, Spark's partial aggregation reduces nothing and costs a round of sketch
# deserialising, merging and serialising per row.
BYPASS_PARTIAL_AGGREGATION = "spark.sql.execution.bypassPartialAggregation"


def spark_session(master: str | None = None, app_name: str = "kcm-rollup",
                  config: Mapping[str, str] | None = None) -> SparkSession:
    """The active session, or a new one; `master` only applies when none is running (spark-submit sets its own)."""
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
        if master.startswith("local"):
            # Local Python workers must be this interpreter (it has kcm installed), not whatever `python3` is;
            # PySpark reads the variable when it creates the context.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            # A terminal run prints kcm's summary; Spark's progress bars would interleave with it.
            builder = builder.config("spark.ui.showConsoleProgress", "false")
            builder = builder.config("spark.driver.defaultJavaOptions", local_jvm_options())
            # Everything of a local master runs in this process: it listens on loopback only (the UI too), not on
            # whatever address the host name resolves to. Read when the JVM starts.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    # Windows are computed and written in UTC whatever the machine's zone; plans and the UI show data source
    # options, so the ones carrying secrets (a JAAS line, an inline key) are redacted beside Spark's default (url).
    spark = (builder.config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.redaction.options.regex", REDACTED_OPTIONS)
             .config("spark.redaction.regex", REDACTED_SETTINGS).getOrCreate())
    spark.dataSource.register(KafkaDataSource)
    return spark


def local_jvm_options() -> str:
    """The Java options of a local master's JVM: LOCAL_JVM_OPTIONS, and kcm's logging unless Spark's conf directory
    (SPARK_CONF_DIR, else SPARK_HOME/conf) holds a log4j2 configuration, which Spark then reads as ever (or kcm's file
    is not on disk)."""
    conf = os.environ.get("SPARK_CONF_DIR") or (os.path.join(os.environ["SPARK_HOME"], "conf")
                                                if os.environ.get("SPARK_HOME") else None)
    if conf and any(_LOG4J2_CONFIGURATION.fullmatch(path.name) for path in Path(conf).glob("log4j2*")):
        return LOCAL_JVM_OPTIONS
    if not LOCAL_LOGGING.is_file():   # kcm run from a zip: no file for the JVM to read
        return LOCAL_JVM_OPTIONS
    # A URI: the launcher splits these options at white space, which a path may hold. log4j's older property name:
    # either name in the user's own spark.driver.extraJavaOptions (which come after these) wins over it.
    return f"{LOCAL_JVM_OPTIONS} -Dlog4j.configurationFile={LOCAL_LOGGING.as_uri()}"


def kafka_format(spark: SparkSession) -> str:
    """"kafka" when Spark's Kafka connector is on the classpath, else kcm's Python source with the same options."""
    try:
        loadable = spark.sparkContext._jvm.org.apache.spark.util.Utils.classIsLoadable(_CONNECTOR_CLASS)
    except Exception:  # Spark Connect has no JVM gateway; py4j errors mean the same: use the Python source.
        loadable = False
    return "kafka" if loadable else SOURCE_NAME


@contextmanager
def session_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """`settings` in the session's SQL conf while the block runs (Spark reads them when it plans an action), then each
    key as it was before: its earlier value, or unset."""
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
