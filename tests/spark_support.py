"""The one SparkSession of the test suite (local[2], few shuffle partitions, no UI): import `spark` as a fixture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator:
    from kcm_rollups.session import spark_session

    # C2 kept for the tests: their hundreds of tiny queries ran 151 s with it, 182 s with C1 only (the local default,
    # kcm_rollups.session.LOCAL_JVM_OPTIONS, which pays off on real volumes).
    session = spark_session("local[2]", "kcm-tests", {
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
        "spark.driver.memory": "1g", "spark.python.worker.reuse": "true", "spark.driver.defaultJavaOptions": ""})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
