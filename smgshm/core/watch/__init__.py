"""watch: follow the shm dir live, judge each segment's life, export the figures."""
