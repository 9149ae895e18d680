"""The wire: the protocol, its framing, the transport and its authentication.

Both the worker side (`worker.core`) and the reference hub (`worker.hub`) speak it;
neither imports the other."""
