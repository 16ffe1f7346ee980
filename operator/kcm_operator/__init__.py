"""The kcm operator: reconciles ClientMetricsSubscription resources into CLIENT_METRICS configs."""
