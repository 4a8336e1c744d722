"""smgshm: diagnostics and admin for SMG's same-host /dev/shm tensor transport."""

__version__ = "0.1.0"
