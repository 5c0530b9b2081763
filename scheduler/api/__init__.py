"""The gRPC edge: servicers, protobuf conversion, and the mapping of domain errors to status."""
