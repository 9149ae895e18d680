"""Helpers for the suite: real processes, real sockets, and the far side of boundaries."""
