"""The daemon: the poller loop, the HTTP gateway, request handlers and settings. The wire
format it speaks (frames and messages, no I/O) is uma.wire, shared with uma.client."""
