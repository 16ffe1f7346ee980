"""The kcm bridge: consumes the metrics topic and forwards OTLP/gRPC to OpenTelemetry collectors."""
