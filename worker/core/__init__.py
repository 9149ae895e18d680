"""The worker side: connection, dispatch pipeline, ledger, scopes, telemetry, registry.

See docs/architecture.md for the life of one call."""
