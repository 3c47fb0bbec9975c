"""From an agent config to a running bottle: images, the run, and its removal on every way out."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any, TextIO

from claude_bottle import trust, workspace
from claude_bottle.agent.mounts import check_mounts, check_workspace
from claude_bottle.agent.schema import AgentConfig, McpServer
from claude_bottle.claude_code import LATEST
from claude_bottle.credentials import Credential
from claude_bottle.display import TerminalText
from claude_bottle.errors import ConfigError, DockerError
from claude_bottle.gate.routes import CredentialRoute
from claude_bottle.gate.settings import Upstream
from claude_bottle.gate.upstream_proxy import UpstreamProxy
from claude_bottle.host_inputs import check_ca_files
from claude_bottle.relay import TerminalRelay
from claude_bottle.runtime import engine, images
from claude_bottle.runtime.engines import open_engine
from claude_bottle.runtime.files import protective_mounts
from claude_bottle.runtime.interrupts import STOP
from claude_bottle.runtime.leftovers import mark_kept, remove_left_behind
from claude_bottle.runtime.reaper import watch as watch_over
from claude_bottle.runtime.run import Run
from claude_bottle.runtime.seam import Engine
from claude_bottle.runtime.spec import RunSpec
from claude_bottle.runtime.users import bottle_user

EXTRA_CA_VARIABLE = "CLAUDE_BOTTLE_EXTRA_CA_CERTS"
HOST_CA_VARIABLE = "CLAUDE_BOTTLE_HOST_CA_CERTS"  # "0" (or no, false, off): the images do not trust the host's CAs

Progress = Callable[[str], None]
COPY_SECONDS = 5  # for what the bottle wrote last to reach the terminal once the engine's client has exited
READER_SECONDS = 1.0  # how often a run without a terminal checks that its output still has a reader
END_SECONDS = 10  # for Claude Code to end after SIGTERM or SIGHUP before its run is removed (docker stop's 10 s)
# A bottle paused while another start on its workspace mounts (runtime/stillness.py) takes no signal: one for it
# waits this long for the bottle to go on (a start holds it for a second or two).
PAUSED_SIGNAL_SECONDS = 10


def host_ca_enabled(environ: dict[str, str]) -> bool:
    value = environ.get(HOST_CA_VARIABLE, "1").strip().lower()
    if value not in ("1", "yes", "true", "on", "0", "no", "false", "off"):
        raise ConfigError(f"${HOST_CA_VARIABLE}={value!r}: use 1 (trust the host's added CA certificates, the "
                          "default) or 0 (do not)")
    return value in ("1", "yes", "true", "on")


def build_inputs(agent: AgentConfig, environ: dict[str, str] | None = None,
                 host_dirs: tuple[str, ...] = images.HOST_CA_DIRS) -> images.BuildInputs:
    """Extra CA certificates: the ones this host's administrator added to its trust store (``host_dirs``;
    unless $CLAUDE_BOTTLE_HOST_CA_CERTS=0), the agent's, and $CLAUDE_BOTTLE_EXTRA_CA_CERTS (a path list)."""
    environ = dict(os.environ) if environ is None else environ
    from_env = tuple(Path(p) for p in environ.get(EXTRA_CA_VARIABLE, "").split(os.pathsep) if p)
    for path in from_env:
        if not path.is_file():
            raise ConfigError(f"${EXTRA_CA_VARIABLE}: {path} is not a file")
    from_host = images.host_ca_files(host_dirs) if host_ca_enabled(environ) else ()
    resolved = {Path(os.path.realpath(p)) for p in from_host}
    listed = tuple(p for p in agent.extra_ca_certificates + from_env if Path(os.path.realpath(p)) not in resolved)
    return images.BuildInputs(
        claude_code_version=agent.claude_version,
        extra_ca_files=tuple(dict.fromkeys(from_host + listed)),
        extra_packages=agent.extra_packages,
    )


def build_images(engine: Engine, agent: AgentConfig, progress: Progress,
                 proxy: UpstreamProxy | None = None) -> tuple[str, str]:
    """Both images, built on ``engine`` where missing, their package downloads through ``proxy`` (the run's
    upstream proxy; never in the images); ``claude.version = "latest"`` is resolved to a release first, so the
    bottle image's tag names what it holds."""
    inputs = build_inputs(agent)
    version = images.resolve_claude_version(inputs.claude_code_version, inputs.extra_ca_files)
    if version != inputs.claude_code_version:
        progress(f"Claude Code {LATEST}: {version}")
        inputs = dataclasses.replace(inputs, claude_code_version=version)
    variables = proxy.environment() if proxy else None
    return images.build(engine, images.bottle_spec(inputs), progress, variables), \
        images.build(engine, images.gate_spec(inputs), progress, variables)


def workspace_of(path: str | None) -> Path:
    given, told = (Path(path).expanduser().absolute(), True) if path else _logical_cwd()
    workspace = given.resolve()
    if not workspace.is_dir():
        raise ConfigError(f"--workspace {workspace}: not a directory")
    _refuse_a_planted_way_out(given, workspace)
    if not told:
        _refuse_a_planted_way_in(workspace)
    if workspace == Path("/") or workspace == Path.home():
        raise ConfigError(f"refusing to mount {workspace} as the workspace: run from a project directory "
                          "or pass --workspace DIR")
    return workspace


def _logical_cwd() -> tuple[Path, bool]:
    """The current directory as the shell reached it (``$PWD``, symbolic links kept), and True; where ``$PWD``
    names another folder (a program that changed directory without setting it: an Agent SDK's ``cwd``), the
    directory's real path, and False."""
    physical = Path(os.getcwd())
    logical = os.environ.get("PWD", "")
    if logical.startswith("/") and Path(logical).resolve() == physical:
        return Path(logical), True
    return physical, False


def _refuse_a_planted_way_in(workspace: Path) -> None:
    """Where the way here is unknown, refuse a folder that a symlink in a workspace where bottles have run leads
    to (``trust.planted_link_to``): a program may have followed one a bottle made (``docs`` -> ``~/.ssh``)."""
    if found := trust.planted_link_to(workspace):
        link, earlier = found
        raise ConfigError(
            f"{workspace} is where {link} leads, a symbolic link in {earlier}, where bottles have run and could "
            f"have made it, and $PWD does not say how this process got here. If you mean {workspace}, start "
            f"from it with PWD={workspace} in the environment (an Agent SDK's env option), or pass --workspace "
            f"{workspace}")


def _refuse_a_planted_way_out(given: Path, workspace: Path) -> None:
    """Refuse a path that leaves an earlier workspace through a symbolic link in it: a bottle may have made
    that link (``docs`` -> ``~/.ssh``), and the user who follows it would mount its target into the next one."""
    parts = given.parts
    for depth in range(2, len(parts) + 1):
        link = Path(*parts[:depth])
        if not link.is_symlink():
            continue
        earlier = trust.workspace_holding(link.parent.resolve())
        if earlier and not link.resolve().is_relative_to(earlier):
            raise ConfigError(
                f"{given} goes through {link}, a symbolic link that leaves {earlier}: bottles have run in "
                f"that workspace and could have made it. If you mean its target, pass --workspace {workspace}")


@dataclass(frozen=True)
class Launch:
    agent: AgentConfig
    workspace: Path
    credential: Credential
    upstream: Upstream | None = None  # overrides the agent's
    upstream_networks: tuple[str, ...] = ()
    upstream_ca_files: tuple[Path, ...] = ()  # stand-ins' CAs the gate trusts (RunSpec.upstream_ca_files)
    learn: bool = False  # learn mode: what the allowlist does not name passes, audited as would_deny
    ask: bool = False  # ask mode: what the allowlist does not name waits for the user's answer (gate/ask.py)
    routes: tuple[CredentialRoute, ...] = ()  # the agent's credentials with their values (tokens.routes_for)
    upstream_proxy: UpstreamProxy | None = None  # the gate's way out (agent/upstream_proxy.py); None: direct


# Arguments by which a caller chooses how Claude Code asks for permission (an Agent SDK's permission callback is
# ``--permission-prompt-tool stdio``): then the bottle does not impose bypass mode over that choice.
PERMISSION_CHOICES = ("--permission-mode", "--permission-prompt-tool", "--dangerously-skip-permissions")


def claude_command(agent: AgentConfig, *extra: str) -> list[str]:
    """Claude Code in bypass mode, the bottle's reason to be, unless the agent's arguments or ``extra`` choose a
    permission mode themselves: the bottle holds either way, and a caller that decides on each tool keeps that.
    The bypass-mode warning is accepted in the bottle's read-only ~/.claude/settings.json
    (``runtime.files.CLAUDE_SETTINGS``)."""
    model = ["--model", agent.model] if agent.model else []
    arguments = [*model, *agent.claude_args, *extra]
    chosen = any(argument.split("=", 1)[0] in PERMISSION_CHOICES for argument in arguments)
    return ["claude", *([] if chosen else ["--dangerously-skip-permissions"]), *arguments]


def interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def on_stop_signals(handler: Callable[[int, FrameType | None], None] | signal.Handlers) -> Iterator[None]:
    """Handle Ctrl-C, SIGTERM and SIGHUP with ``handler`` inside the block.

    ``interrupt``: SIGTERM and SIGHUP unwind like Ctrl-C, so a run's finally-block removes what it created.
    ``SIG_IGN``: removal runs to the end; a second Ctrl-C (or a SIGTERM after a SIGHUP) cannot cut it short.
    """
    previous = {sig: signal.signal(sig, handler) for sig in STOP}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_spec(launch: Launch, bottle_image: str, gate_image: str, user: str,
             protected: tuple[str, ...] = workspace.PROTECTED) -> RunSpec:
    """``user``: uid:gid from ``bottle_user``; ``protected``: the workspace paths to mount read-only where they
    exist (``workspace.protected_paths``). What differs between engines (Podman's) is the engine's own."""
    agent = launch.agent
    routes = {route.spec.name: route for route in launch.routes}
    if missing := [c.name for c in agent.credentials if c.name not in routes]:
        raise ConfigError(f"credentials {', '.join(missing)} of agent {agent.name} have no value for this run")
    return RunSpec(
        agent=agent.name, workspace=launch.workspace, bottle_image=bottle_image, gate_image=gate_image,
        credential=launch.credential, user=user, upstream=launch.upstream or agent.upstream,
        allow=agent.egress_allowlist, allow_tcp=agent.allow_tcp, allow_private=agent.allow_private,
        env=agent.env,
        resources=agent.resources, upstream_networks=launch.upstream_networks,
        upstream_ca_files=launch.upstream_ca_files,
        mounts=tuple((m.source, m.target, m.read_only) for m in agent.mounts),
        mcp_servers={s.name: mcp_entry(s, routes) for s in agent.mcp_servers}, mcp_rules=agent.mcp_rules,
        server_tools=agent.server_tools, protected=protected, request_policy=agent.egress, dlp=agent.dlp,
        runtime=agent.runtime,
        learn=launch.learn,
        ask=launch.ask,
        ask_timeout=agent.ask_timeout,
        routes=launch.routes,
        upstream_proxy=launch.upstream_proxy,
        route_env={variable: routes[config.name].spec.sentinel for config in agent.credentials
                   for variable in config.bottle_env},
        git_routes=tuple(routes[config.name].spec for config in agent.credentials if config.git),
    )


def mcp_entry(server: McpServer, routes: dict[str, CredentialRoute]) -> dict[str, Any]:
    """Claude Code's ``mcpServers`` entry for ``server``: a stdio command, or a remote URL whose credential, if
    it has one, is the route's sentinel (the gate replaces it with the real value on the way out)."""
    if server.command:
        return {"type": "stdio", "command": server.command[0], "args": list(server.command[1:])}
    entry: dict[str, Any] = {"type": server.transport, "url": server.url}
    if server.credential:
        entry["headers"] = {"Authorization": f"Bearer {routes[server.credential].spec.sentinel}"}
    return entry


@contextlib.contextmanager
def started(launch: Launch, progress: Progress, keep: bool = False, review: Progress | None = None,
            notice: Progress | None = None) -> Iterator[Run]:
    """Build what is missing, start the gate, and yield the run; on the way out, remove all of it.

    ``progress`` hears the steps; ``notice`` (by default ``progress``) what the user must hear even where the
    steps are not shown: warnings, what a crashed run left and is removed, a run kept.
    Before anything is created, the workspace is refused while runs' changes to its protected files wait for
    review, or while its .git is unsafe to mount; after the run, whatever changed there is reported and
    recorded for review (``claude_bottle.trust``), and told to ``review`` (by default ``notice``).

    The run is bound to this process: its gate stops when this process ends, however (runtime/lifeline.py),
    and a reaper removes the run if this process dies without doing it (runtime/reaper.py). A gate gone while
    the run goes on removes the bottle, and the block ends in a GateError saying so."""
    notice = notice or progress
    with on_stop_signals(interrupt):
        agent = launch.agent
        check_workspace(launch.workspace)
        trust.check(launch.workspace)
        check_mounts(agent.mounts, launch.workspace)
        check_ca_files(build_inputs(agent).extra_ca_files, launch.workspace, agent.mounts)
        user = bottle_user(os.getuid(), os.getgid(), launch.workspace)
        found = workspace.protected_paths(launch.workspace)
        protective_mounts(launch.workspace, found.mounted)  # a .git that cannot be mounted safely fails here
        opened = open_engine()
        about = opened.describe()
        engine.check_runtime(about, agent.runtime, f"agent {agent.name}: runtime")
        if limits := engine.unenforced_limits(about):
            notice(f"warning: {limits}")
        remove_left_behind(opened, launch.workspace, notice)  # what a crashed host left here
        began = time.monotonic()
        bottle_image, gate_image = build_images(opened, agent, progress, launch.upstream_proxy)
        progress(f"images ready ({time.monotonic() - began:.1f} s)")
        run = Run(run_spec(launch, bottle_image, gate_image, user, tuple(found.mounted)), opened)
        watch = trust.Watch(launch.workspace, run.id)
        reaper = watch_over(run.id, launch.workspace)  # removes the run if this process dies without doing it
        try:
            watch.begin(found)
            progress(f"starting gate for agent {agent.name}")
            began = time.monotonic()
            run.start_gate()
            if run.engine.bridges_on_host:
                run.check_host_unreachable()
            progress(f"networks and gate created ({time.monotonic() - began:.1f} s)")
            try:
                with ask_watching(run, agent.ask_command, notice):
                    yield run
            except DockerError:
                run.check_gate()  # the bottle it was about, removed because the gate is gone: say that
                raise
            run.check_gate()
        finally:
            with on_stop_signals(signal.SIG_IGN):
                if keep:
                    # Kept stopped: a bottle left running (the start ended by a signal while its agent held
                    # Claude Code stopped) would go on writing the workspace after the check below.
                    with contextlib.suppress(DockerError):
                        run.engine.stop(run.names.bottle, timeout=0)
                    mark_kept(run.id)
                    notice(f"kept run {run.id}: remove it with `claude-bottle stop {agent.name}`")
                else:
                    run.remove()
                reaper.release()
                watch.end(review or notice)


def ask_watching(run: Run, hook: tuple[str, ...], notice: Progress) -> contextlib.AbstractContextManager[object]:
    """A run in ask mode has its gate's questions watched from this process for the run's length: a desktop
    notification for each, and the agent's ``ask_command`` hook (runtime/ask_watch.py). Else nothing."""
    from claude_bottle.runtime.ask_watch import notifier, watching

    gate = run.engine.container(run.names.gate) if run.spec.ask else None
    if gate is None:
        return contextlib.nullcontext()
    return watching(run.engine, gate, hook, run.spec.ask_timeout, notice, notifier())


@contextlib.contextmanager
def forwarded_signals(engine: Engine, container: str) -> Iterator[None]:
    """Inside the block, SIGINT, SIGTERM and SIGHUP go to ``container``'s Claude Code (the bottle's init hands
    them on, as a host would); an engine that cannot take them ends the run instead. SIGTERM and SIGHUP end the
    run: a bottle still there ``END_SECONDS`` after the first is ended from here (KeyboardInterrupt, the run
    removed), as ``docker stop`` would. The agent is Claude Code's user and can stop it (SIGSTOP), and a
    stopped Claude Code never takes the signal: its run, gate and credential would stay for as long as the
    caller waits. SIGINT is a key Claude Code reads (it ends a turn, not the run): only passed on. A bottle paused
    for another start's mounts gets the signal once it goes on."""

    def forward(signum: int, frame: FrameType | None) -> None:
        # The run's end is counted from the signal, not from its delivery: a bottle held paused meanwhile
        # must not stretch it.
        if signum != signal.SIGINT and not signal.getitimer(signal.ITIMER_REAL)[0]:
            signal.setitimer(signal.ITIMER_REAL, END_SECONDS)
        try:
            deadline = time.monotonic() + PAUSED_SIGNAL_SECONDS
            while (found := engine.container(container)) is not None and found.status == "paused" and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            engine.kill(container, signum)
        except DockerError:
            raise KeyboardInterrupt from None

    def overdue(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, overdue)
    try:
        with on_stop_signals(forward):
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_attached(launch: Launch, command: list[str], progress: Progress, notice: Progress | None = None) -> int:
    """``command`` in a bottle without a terminal, its standard streams this process's own: standard input
    (unless a terminal) streamed in, standard output and error out by the engine's own client
    (``Engine.attach_command``), byte for byte, or where one is a terminal, with its control characters shown
    as escapes (``shown_on``); signals forwarded; its exit code returned. Nothing else is written to standard
    output."""
    stdin = not sys.stdin.isatty()
    with started(launch, progress, notice=notice) as run:
        engine, bottle = run.engine, run.names.bottle
        run.create_held_bottle(command, stdin)
        # Started now, its entrypoint waits for the gate meanwhile. In a session of its own: a Ctrl-C at the
        # terminal reaches this process only, which forwards it once.
        with engine_client(engine.attach_command(bottle, interactive=stdin), start_new_session=True) as client:
            run.release()
            with forwarded_signals(engine, bottle):
                while_read(client, sys.stdout.fileno())
        info = engine.container(bottle)
        if info is not None and info.status == "created":
            raise DockerError(f"cannot start the bottle: `{' '.join(engine.attach_command(bottle, stdin))}` "
                              f"exited with {client.returncode}")
        # Claude Code has exited, its connections closed: the gate stops while the engine finishes the bottle.
        with ThreadPoolExecutor(1) as pool:
            pool.submit(run.stop_gate)
            return engine.wait(bottle)


def while_read(client: subprocess.Popen[bytes], out: int) -> int:
    """Wait for ``client``, its exit code; but once nobody can read what it writes on ``out`` (a pipe or socket
    whose reading end is closed: the program driving the drop-in gone, even killed outright), end the run
    (KeyboardInterrupt). A host's claude would die of SIGPIPE at its next write; a bottle chooses when it writes,
    and until then its run, gate and credential would outlive that program. Checked every ``READER_SECONDS``."""
    try:
        kind = os.fstat(out).st_mode
    except OSError:
        kind = 0
    watched = select.poll()
    if stat.S_ISFIFO(kind) or stat.S_ISSOCK(kind):
        watched.register(out, 0)  # POLLERR (a pipe without a reader) and POLLHUP (a closed peer) come regardless
    while True:
        try:
            return client.wait(READER_SECONDS)
        except subprocess.TimeoutExpired:
            if watched.poll(0):
                raise KeyboardInterrupt from None


@contextlib.contextmanager
def engine_client(command: list[str], start_new_session: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    """The engine's client ``command`` with this process's standard streams, byte for byte, but an output that
    is a terminal gets the bottle's bytes through ``shown_on``; killed on the way out if still running, and its
    last output shown."""
    out, err = sys.stdout.isatty(), sys.stderr.isatty()
    process = subprocess.Popen(command, stdout=subprocess.PIPE if out else None,
                               stderr=subprocess.PIPE if err else None, start_new_session=start_new_session)
    copies = [shown_on(pipe, stream) for pipe, stream in ((process.stdout, sys.stdout), (process.stderr, sys.stderr))
              if pipe is not None]
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for copy in copies:
            copy.join(COPY_SECONDS)


def shown_on(pipe: IO[bytes], terminal: TextIO) -> threading.Thread:
    """Copy what the bottle writes on ``pipe`` to ``terminal`` as it comes, its control characters shown as
    escapes (display.py's ``TerminalText``): the terminal shows them and obeys none. In a thread of its own,
    ended by the pipe's end."""
    shown = TerminalText()

    def show(text: str) -> None:
        terminal.buffer.write(text.encode(terminal.encoding or "utf-8", "backslashreplace"))
        terminal.flush()

    def copy() -> None:
        with pipe, contextlib.suppress(OSError):
            while data := os.read(pipe.fileno(), 65536):
                show(shown.feed(data))
            show(shown.feed(b"", final=True))

    thread = threading.Thread(target=copy, name="terminal-copy", daemon=True)
    thread.start()
    return thread


def run_in_terminal(launch: Launch, command: list[str], progress: Progress, keep: bool = False,
                    notice: Progress | None = None) -> int:
    """``command`` in a bottle in this terminal: the engine's client on a terminal this process relays
    (relay.py: keys in as typed, Ctrl-C one of them; the interface out without what reaches past the screen);
    signals sent to this process forwarded. Its exit code."""
    with started(launch, progress, keep=keep, notice=notice) as run:
        engine, bottle = run.engine, run.names.bottle
        run.create_bottle(command, tty=True)
        progress(f"starting Claude Code in {launch.workspace}")
        return attached_on_terminal(engine.attach_command(bottle, interactive=sys.stdin.isatty()),
                                    forwarded_signals(engine, bottle))


def attached_on_terminal(client: list[str], signals: contextlib.AbstractContextManager[object]) -> int:
    """The engine's ``client`` command on this terminal, through a relay where standard output is one (else
    ``engine_client``), ``signals`` handled meanwhile. Its exit code."""
    if not sys.stdout.isatty():
        with engine_client(client) as process, signals:
            return process.wait()
    with TerminalRelay(client) as relay, signals:
        return relay.wait()
