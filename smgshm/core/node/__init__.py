"""A node's view: every pod's /dev/shm tmpfs, tied to its pod and judged in the pid namespaces that use it."""
