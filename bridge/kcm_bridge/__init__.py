"""The kcm data path: the metrics-topic contract codec and (later) the OTLP bridge."""
