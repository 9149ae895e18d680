"""agentworker's headless core: protocol, connection, dispatch pipeline, actions,
scopes, telemetry, the reference hub and the CLI. Never imports the TUI."""
