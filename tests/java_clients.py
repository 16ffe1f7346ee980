"""Java test clients for pytest: the implementation lives in kcm_sandbox.java_clients (the demo uses it too)."""

from kcm_sandbox.java_clients import JavaClient

__all__ = ["JavaClient"]
