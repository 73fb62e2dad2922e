"""The daemon: wire framing and protocol (no I/O), the poller loop, request handlers."""
