"""The client jobs: probe a worker, send tensors, benchmark the two transports, what-ifs."""
