"""``python -m smgshm``."""

from smgshm.cli import main

main()
