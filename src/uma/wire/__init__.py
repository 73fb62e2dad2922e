"""The wire format of the daemon's Unix socket, shared by uma.client and uma.server: frames
(framing: length-prefixed msgpack maps, cut from a byte stream) and messages (protocol: the
requests a client sends, checked field by field, and the events the daemon answers with).
Data in, data out: no sockets, no threads, no clocks, so both sides speak exactly the same
format and a client needs nothing of the daemon to speak it."""
