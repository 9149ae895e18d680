"""agentworker's headless core: protocol, connection, dispatch pipeline, actions,
scopes, telemetry, the reference hub and the CLI. Never imports the TUI."""

__version__ = "0.1.0"  # the one version source: pyproject, --version and Hello read it
