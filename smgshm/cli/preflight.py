"""``smgshm preflight``: before SMG's gateway starts, reclaim its previous incarnation's segments and
check that it may start; as a wrapper, then become the gateway (exec: same pid). Standalone (an NPD
check) it is read-only unless told ``--reclaim``."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import signal
import sys
import time
from typing import NoReturn

import click

from smgshm.cli import preflight_view as view
from smgshm.cli.app import App
from smgshm.cli.exitcodes import ExitCode
from smgshm.cli.fmt import display
from smgshm.cli.params import BYTES, DURATION, shm_dir_option
from smgshm.cli.signals import unwind_on_signals


@click.command(context_settings={"allow_interspersed_args": False})
@click.option(
    "--init-container",
    is_flag=True,
    help="Run as the pod's init container: no SMG process of the pod "
    "runs yet, so every SMG name in its tmpfs is a previous incarnation's (refused when another process "
    "uses the tmpfs; list it before any native sidecar).",
)
@click.option(
    "--pod-private",
    is_flag=True,
    help="Wrapper in a container: every process that writes SMG names in "
    "this tmpfs is in this pid namespace (the operator's word; needed to reclaim by pid there).",
)
@click.option(
    "--inflight-bytes",
    type=BYTES,
    default=0,
    help="Free space the gateway needs after reclaiming (e.g. its --multimodal-max-inflight-bytes).",
)
@click.option(
    "--tensor-bytes",
    type=BYTES,
    multiple=True,
    help="A tensor size the gateway writes (repeatable): the largest must fit too.",
)
@click.option(
    "--min-age",
    type=DURATION,
    default="10m",
    show_default=True,
    help="Names judged by gc's rules (not by preflight's proof) are reclaimed only when older, as by gc --delete "
    "(a leaked one whose producer gc proves dead, at any age).",
)
@click.option(
    "--timeout",
    type=DURATION,
    default="10s",
    show_default=True,
    help="Give up (exit 3, preflight_timeout) when the checks take longer.",
)
@click.option(
    "--reclaim",
    is_flag=True,
    help="Without a command or --init-container: reclaim what the run proves leaked (read-only without it: "
    "it reports what it would reclaim). The wrapper and --init-container always reclaim.",
)
@click.option("--all-users", is_flag=True, help="As root, also reclaim other users' segments (as gc --all-users).")
@click.option(
    "--require-shm",
    is_flag=True,
    help="Make the checks a gate: when one fails (SHM would be off), exit 3 and do not exec the gateway. Without "
    "it a failed check only degrades: SMG serves inline, so the gateway starts (exit 0) and the cause is reported.",
)
# The default since --require-shm; kept (hidden) so that command lines written for the old gate still run.
@click.option("--start-anyway", is_flag=True, hidden=True)
@click.option(
    "--textfile",
    "textfile_path",
    type=click.Path(dir_okay=False),
    help="Write what the run reclaimed "
    "and kept, and whether it succeeded, in node_exporter textfile format (smgshm_preflight_*).",
)
@click.option(
    "--npd",
    is_flag=True,
    help="node-problem-detector plugin: one line of at most 80 characters, exit 0 OK, 1 problem, 2 unknown.",
)
@shm_dir_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def preflight(
    app: App,
    init_container: bool,
    pod_private: bool,
    inflight_bytes: int,
    tensor_bytes: tuple[int, ...],
    min_age: float,
    timeout: float,
    reclaim: bool,
    all_users: bool,
    require_shm: bool,
    start_anyway: bool,
    textfile_path: str | None,
    npd: bool,
    shm_dir: str,
    command: tuple[str, ...],
) -> None:
    """Reclaim the segments of SMG's previous incarnation, then check that its gateway may start.

    A memory emptyDir at /dev/shm outlives container restarts, and SMG's gateway never
    sweeps names carrying its own pid: restarted as pid 1, it leaves every
    smg-tokenspeed-1-* of its last life, and a leftover smg-tokenspeed-probe-1 turns
    its SHM off. preflight reclaims by proof, not by age:

    \b
    - wrapper (`preflight [opts] -- smg launch ...`): preflight is pid P, writes
      nothing, and execs the gateway, which keeps P. So every name carrying P was
      written by an earlier, dead process holding P in this pid namespace. That
      holds only if every process writing SMG names in the tmpfs is in this pid
      namespace: in a container say so with --pod-private; preflight still
      reclaims nothing by pid when a process it can see in another pid namespace
      reaches the tmpfs, or the container shares the host's IPC namespace
      (--ipc=host, hostIPC).
    - --init-container: run before any app container of the pod, so every SMG name
      in the pod's tmpfs is a previous incarnation's; refused when any process but
      preflight and its parents uses the tmpfs.
    - neither: gc's rules only, and read-only (a check, as --npd runs it, never
      deletes): it says what it would reclaim; --reclaim reclaims it.

    Other pids are judged by gc's rules. Only SMG names, regular files held by
    nobody, are unlinked, by gc's set-aside-verify-unlink steps, and only the
    caller's own unless root says --all-users (gc's owner rule). Then: the namespace
    id must be readable, the gateway's probe file (wrapper) absent, the dir writable,
    and its free space must hold --inflight-bytes and the largest --tensor-bytes.

    A failed check degrades, it does not stop the gateway: SMG falls back to inline
    when its probe or SHM writes fail, which costs speed, not service. So by default
    the wrapper execs the gateway and --init-container exits 0, and the headline says
    SHM will be off and why (the cause and its fix follow; --textfile's
    smgshm_preflight_shm_degraded says it too). --require-shm makes the checks a gate.

    Exit 0: the gateway may start (verdict ok; unknown: something could not be
    judged and is listed; fail without --require-shm: SHM will be off); 3: with
    --require-shm, a check failed and the gateway must not start (a wrapper does not
    exec it); 5: the shm dir cannot be read; 2: usage. --npd: 0 ok, 1 a failed
    check (SHM off), 2 unknown. A wrapper's exec that fails after its verdict
    was written (its document says the command is exec'd next, exec_next, not
    that it ran): 127 when exec says ENOENT (the command or its #! interpreter
    is not there), 126 for any other refusal (ETXTBSY, E2BIG, EACCES), said in
    one line on stderr, never a second document. Idempotent; bounded by --timeout.

    \b
    Examples:
      smgshm preflight --pod-private --inflight-bytes 1GiB -- \\
          smg launch --port 30000
      smgshm preflight --init-container --inflight-bytes 1GiB
      smgshm preflight --init-container --require-shm --inflight-bytes 1GiB
      smgshm preflight --npd --inflight-bytes 1GiB
      smgshm preflight --reclaim --inflight-bytes 1GiB
      smgshm preflight --textfile /var/lib/node_exporter/smgshm-preflight.prom \\
          -- smg launch
    """
    from smgshm.core.host.runnable import exec_refusal
    from smgshm.core.node.preflight import Mode, PreflightRequest, degraded_by, run_preflight

    app.npd = npd
    if npd:
        app.quiet = True
        if command or app.json:
            raise click.UsageError("--npd is a check: it takes no command and no --json")
    if init_container and (command or pod_private):
        raise click.UsageError("--init-container runs no command and needs no --pod-private")
    if start_anyway and not command:
        raise click.UsageError("--start-anyway needs a command to start (after --)")
    if start_anyway and require_shm:
        raise click.UsageError("--start-anyway contradicts --require-shm (without --require-shm the gateway starts)")
    if command and (why := exec_refusal(command[0], command)):  # before anything is reclaimed (core/host/runnable.py)
        raise click.UsageError(f"the command to exec {why}: {command[0]}")
    mode: Mode = "wrapper" if command else "init_container" if init_container else "standalone"
    req = PreflightRequest(
        shm_dir,
        mode,
        pod_private,
        inflight_bytes,
        tensor_bytes,
        min_age,
        timeout,
        reclaim=reclaim,
        all_users=all_users,
        require_shm=require_shm,
    )
    if textfile_path:
        from smgshm.core.segments import textfile

        textfile.check_writable(textfile_path, "--textfile")  # exit 5 before anything is reclaimed
    started = time.time()
    with unwind_on_signals():  # SIGTERM/SIGHUP as Ctrl-C: a reclaim batch under way settles (run_preflight)
        report = run_preflight(req)
    if textfile_path:
        record = textfile.RunRecord(
            "preflight", display(shm_dir), started, time.time(), report._done, degraded_by(report)
        )
        textfile.write_textfile(textfile_path, record, "--textfile")  # a failure (exit 5) stops the gateway too
    if npd:
        click.get_current_context().exit(view.npd(report))
    code = ExitCode.OK if report.may_start else ExitCode.CHECK_FAILED
    if command and report.may_start:  # a failed check without --require-shm: the headline says SHM is off
        report = dataclasses.replace(report, exec_next=command[0])
    app.emit(view.doc(report), lambda a, _r: view.human(a, report), code)
    if report.exec_next is not None:
        _exec(command)
    click.get_current_context().exit(code)


def _exec(command: tuple[str, ...]) -> NoReturn:
    """Become the command: same pid (in a container the gateway stays pid 1), signals as a fresh process has them.

    The verdict is written by now (stdout: its one document, or its lines), and says the command is exec'd
    next, not that it runs: what exec_refusal foresaw was refused before anything was done, but an exec can
    still fail here (the interpreter removed since, the file opened for writing by another process: ETXTBSY;
    a missing ELF loader). A second document, or an error routed through the usual error path (which under
    --json writes one), would break the one-channel contract and contradict nothing the first says: so the
    failure is one line on stderr and the shell's exit code (127 ENOENT, 126 any other), as env(1) and
    timeout(1) report a command they could not run. The document already written stays true: preflight's
    checks passed, and the command was to be exec'd next."""
    sys.stdout.flush()
    sys.stderr.flush()
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(command[0], command)  # noqa: S606 - the operator's own command line, as given, no shell
    except OSError as err:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a closed stderr must not kill it: the exit code stands
        code = ExitCode.NOT_FOUND if err.errno == errno.ENOENT else ExitCode.CANNOT_EXEC
        name = errno.errorcode.get(err.errno or 0, "?")
        with contextlib.suppress(OSError):  # a closed stderr keeps the exit code
            os.write(
                2, f"smgshm preflight: cannot exec {command[0]!r}: {err.strerror} ({name})\n".encode(errors="replace")
            )
        click.get_current_context().exit(code)  # nothing more is written: the document stands
