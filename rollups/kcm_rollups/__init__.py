"""The kcm rollup job: a PySpark batch job that turns the raw metrics topic into fleet-level windows."""
