"""The tensor transport itself: SMG's inline-or-SHM decision, tensors, the wire messages, the
gRPC channel and receipt verification."""
