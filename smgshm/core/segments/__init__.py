"""Segments in the shm dir: SMG's one name grammar, reading and writing them, judging each entry
(in flight, held, leaked, ...) and reaping what is proven leaked."""
