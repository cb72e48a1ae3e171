"""`Sandbox`: one local fleet of sshd nodes, described by (and stoppable from) its state dir.

It ties the parts together: state.py (sandbox.json and the lock), network.py (bridge, netns,
veths), node.py (each node's namespaces and init), sshd.py and clientfiles.py. `up` saves the
state after each step, so that `down`, from this process or another, can always clean up.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from fleet.sandbox import node as nodes_
from fleet.sandbox import sshd
from fleet.sandbox.clientfiles import ensure_client_key, write_client_files
from fleet.sandbox.defaults import DEFAULT_MAX_STARTUPS, DEFAULT_SUBNET
from fleet.sandbox.errors import SandboxError
from fleet.sandbox.host import is_ours, parallel, preflight
from fleet.sandbox.network import Network, capacity, parse_subnet, sandbox_id
from fleet.sandbox.state import Layout, NodeRecord, SandboxNode, SandboxState, StateFile


class Sandbox:
    """A fleet of sshd nodes in namespaces, described by (and stoppable from) its state dir."""

    def __init__(
        self,
        state_dir: Path,
        subnet: str | None = None,
        max_startups: str | None = None,
    ) -> None:
        """`subnet`/`max_startups` default to what the state dir recorded, else the defaults."""
        self.state_dir = _absolute(Path(state_dir))
        self.sid = sandbox_id(self.state_dir)
        self._layout = Layout(self.state_dir)
        self._state = StateFile(self._layout)
        self._network = Network(self.sid, self.state_dir)
        self.bridge = self._network.bridge
        self._subnet_arg = subnet
        if subnet is not None:
            parse_subnet(subnet)
        if max_startups is not None and not sshd.MAX_STARTUPS_RE.match(max_startups):
            raise SandboxError(
                f"bad MaxStartups {max_startups!r}", hint="write start:rate:full, e.g. 100:30:200"
            )
        self._max_startups_arg = max_startups

    # ----------------------------------------------------------------- paths

    @property
    def subnet(self) -> str:
        """The subnet this sandbox runs (or will run) on."""
        state = self._state.load()
        if state is not None and (state.status != "stopped" or self._subnet_arg is None):
            return state.subnet
        return self._subnet_arg or DEFAULT_SUBNET

    @property
    def state_path(self) -> Path:
        """The JSON state file another process uses to find and stop this sandbox."""
        return self._layout.state_path

    @property
    def inventory_path(self) -> Path:
        """Ansible-style inventory listing every node."""
        return self._layout.inventory_path

    @property
    def ssh_config_path(self) -> Path:
        """OpenSSH client config for `ssh -F` with strict host key checking."""
        return self._layout.ssh_config_path

    @property
    def known_hosts_path(self) -> Path:
        """Every node's host key, so clients can keep StrictHostKeyChecking on."""
        return self._layout.known_hosts_path

    @property
    def key_path(self) -> Path:
        """The client private key (ed25519, no passphrase) every node accepts for root."""
        return self._layout.key_path

    # ----------------------------------------------------------------- lifecycle

    def up(self, count: int, prefix: str = "node") -> list[SandboxNode]:
        """Make the sandbox exactly `prefix01..prefixNN`, all answering SSH; reuse what runs.

        Bad settings and a subnet in use are refused before the state dir is made or written.
        A failure later stops what this call started: the state says "stopped" when nothing
        ran before it, else "failed" with the nodes that ran before kept (`up` again heals)."""
        preflight()
        self._plan(count)  # early, so that a refusal leaves nothing behind
        if not nodes_.NAME_RE.match(prefix):
            raise SandboxError(
                f"bad node name prefix {prefix!r}", hint="use lowercase letters, digits, '-'"
            )
        with self._state.locked():
            state, net = self._plan(count)  # again: another `up` or `down` may have run since
            client_pub = ensure_client_key(self._layout, self.sid)
            ran_before = any(self._healthy(r) for r in state.nodes)
            try:
                self._bring_up(state, net, nodes_.node_names(count, prefix), client_pub)
            except BaseException as exc:
                left = self._after_failed_up(state, keep=ran_before)
                if isinstance(exc, SandboxError) and not exc.hint:
                    exc.hint = (
                        "nothing is left running; `fleet sandbox up` tries again"
                        if left == "stopped"
                        else "`fleet sandbox down` removes whatever was started"
                    )
                raise
            return [r.node for r in state.nodes]

    def _plan(self, count: int) -> tuple[SandboxState, ipaddress.IPv4Network]:
        """The state `up` starts from, with this call's settings; SandboxError, with nothing
        written, when they cannot run (count, subnet in use or moved under running nodes)."""
        state = self._reconcile_settings(self._state.load() or self._fresh_state())
        net = parse_subnet(state.subnet)
        if not 1 <= count <= capacity(net):
            raise SandboxError(
                f"cannot run {count} nodes in {net}: between 1 and {capacity(net)}",
                hint="pick a smaller count or a larger --subnet",
            )
        self._network.check_free(net)
        return state, net

    def _bring_up(
        self,
        state: SandboxState,
        net: ipaddress.IPv4Network,
        wanted: list[str],
        client_pub: str,
    ) -> None:
        """The steps of `up`, saving state after each so a crash leaves `down` able to clean."""
        state.status = "starting"
        self._save(state)
        self._network.ensure_bridge(net)
        keep = [r for r in state.nodes if r.node.name in wanted and self._healthy(r)]
        self._teardown([r for r in state.nodes if r not in keep])
        state.nodes = keep
        self._save(state)
        fresh = self._create_nodes(
            state, net, [n for n in wanted if n not in _names(keep)], client_pub
        )
        state.nodes = sorted(keep + fresh, key=lambda r: r.index)
        self._save(state)
        self._network.attach(state.nodes)
        sshd.ensure_all(state.nodes, state.max_startups, self._network)
        write_client_files(self._layout, state.subnet, [r.node for r in state.nodes])
        state.status = "running"
        self._save(state)

    def _after_failed_up(self, state: SandboxState, keep: bool) -> str:
        """Leave no half-started sandbox behind a failed `up`; returns the status left.

        With nothing running before it (`keep` false), everything is stopped, as `down` does.
        Otherwise, or when stopping fails too, the state says "failed": its nodes are the
        ones `up` found running plus any it started, all of which `down` stops."""
        if not keep:
            with contextlib.suppress(Exception):  # the first error is the one to report
                self._stop(state)
                return "stopped"
        with contextlib.suppress(Exception):
            state.status = "failed"
            self._save(state)
        return "failed"

    def down(self) -> bool:
        """Kill every node, remove netns, veths and bridge; keep the files, mark state stopped.

        False, with nothing made or changed, when there is no state dir: nothing to stop."""
        preflight()
        if not self._state.present():
            return False
        with self._state.locked():
            state = self._state.load()
            if state is None:
                self._stop_leftovers()
            else:
                self._stop(state)
        return True

    def _stop(self, state: SandboxState) -> None:
        """Stop every node of `state` (and anything else of this sandbox); save it stopped."""
        self._stop_leftovers(state.nodes)
        state.status = "stopped"
        state.nodes = []
        self._save(state)

    def _stop_leftovers(self, records: Sequence[NodeRecord] = ()) -> None:
        """Kill the nodes and sweep every process, netns and veth named for this sandbox."""
        self._teardown(records, sweep=True)
        self._network.delete_bridge()

    def nodes(self) -> list[SandboxNode]:
        """The nodes of the running sandbox (none once it is stopped)."""
        state = self._state.load()
        if state is None or state.status == "stopped":
            return []
        return [r.node for r in state.nodes]

    def recorded_status(self) -> str | None:
        """What the state file says of the sandbox as a whole ("starting", "running", "failed",
        "stopped"); None when there is none."""
        state = self._state.load()
        return state.status if state is not None else None

    def status(self) -> list[tuple[SandboxNode, bool, bool]]:
        """(node, pid 1 alive, sshd accepting TCP on port 22) for every node."""

        def check(node: SandboxNode) -> tuple[SandboxNode, bool, bool]:
            """Probe one node (only a live one, so a dead node costs no timeout)."""
            alive = is_ours(node.pid1, self.state_dir, node.name, "tini")
            return node, alive, alive and self._network.listening(node.address)

        return parallel(check, self.nodes())

    # ----------------------------------------------------------------- using nodes

    def run_on(
        self, node: SandboxNode | str, script: str, timeout_s: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run shell `script` as root inside the node's namespaces (no SSH), cwd /root.

        The script runs from a file (`/bin/sh /run/fleet/.run-on/<id>.sh`), so its text is not
        on any command line: `pgrep -f pattern` in it cannot match its own shell. stdin is
        /dev/null; stdout/stderr go through temporary files, not pipes, and only the shell is
        waited for, so a script that leaves a background child never hangs this call. To plant
        a process that outlives the call, detach it fully:
        `setsid my-command </dev/null >/dev/null 2>&1 &`. On timeout the call's own process
        group (not detached children) is killed and subprocess.TimeoutExpired is raised.
        """
        return nodes_.run_script(self._live_node(node), script, timeout_s)

    def stop_sshd(self, node: SandboxNode | str) -> None:
        """Stop the node's sshd listener (node stays up): port 22 then refuses connections."""
        sshd.stop(self._live_node(node), self._network)

    def start_sshd(self, node: SandboxNode | str) -> None:
        """Start the node's sshd if it is not listening, and wait until it accepts TCP."""
        target = self._live_node(node)
        if not self._network.listening(target.address):
            sshd.spawn(target)
        sshd.wait_listening([target], self._network)

    def bind_into(self, node: SandboxNode | str, host_path: Path | str, inner_path: str) -> None:
        """Bind-mount a host file or directory at `inner_path` inside one node only.

        The mount lands in the node's own mount namespace (its propagation is private), so the
        host and the other nodes never see it: how a test gives one node a service's socket
        (e.g. a private dockerd's at /run/docker.sock) or hides a file. `host_path` must be
        visible in the node, so not under the paths every node mounts privately (/tmp,
        /dev/shm, /root, /run, /usr/local/bin). A missing mount point is created (an empty
        file or a directory, like the source); a mount already there is replaced, not stacked.
        """
        script = nodes_.bind_script(host_path, inner_path)
        self._run_checked(node, script, f"bind {Path(host_path).resolve()} at {inner_path}")

    def unbind(self, node: SandboxNode | str, inner_path: str, remove: bool = False) -> None:
        """Undo `bind_into` on the node (every mount at `inner_path`); with `remove`, also delete
        the mount point left behind (for one `bind_into` created, e.g. on the node's /run)."""
        script = nodes_.unbind_script(inner_path, remove)
        self._run_checked(node, script, f"unbind {inner_path}")

    def _run_checked(self, node: SandboxNode | str, script: str, what: str) -> None:
        """run_on that raises SandboxError naming `what` and the node when the script fails."""
        result = self.run_on(node, script, timeout_s=15)
        if result.returncode != 0:
            name = node if isinstance(node, str) else node.name
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise SandboxError(
                f"{what} on {name} failed (exit {result.returncode}): "
                f"{detail[-1] if detail else 'no output'}"
            )

    def _live_node(self, node: SandboxNode | str) -> SandboxNode:
        """Resolve a node (or name) against the state file; it must be running."""
        name = node if isinstance(node, str) else node.name
        for current in self.nodes():
            if current.name == name:
                if not is_ours(current.pid1, self.state_dir, name, "tini"):
                    raise SandboxError(
                        f"sandbox node {name} is not running", hint="run `fleet sandbox up`"
                    )
                return current
        raise SandboxError(f"no sandbox node {name} in {self.state_dir}")

    # ----------------------------------------------------------------- state

    def _fresh_state(self) -> SandboxState:
        """State for a sandbox that has never run here."""
        return SandboxState(
            status="stopped",
            sid=self.sid,
            subnet=self._subnet_arg or DEFAULT_SUBNET,
            max_startups=self._max_startups_arg or DEFAULT_MAX_STARTUPS,
            nodes=[],
        )

    def _reconcile_settings(self, state: SandboxState) -> SandboxState:
        """Apply constructor settings; a running sandbox cannot move to another subnet."""
        if self._subnet_arg is not None and self._subnet_arg != state.subnet:
            if state.status != "stopped" and state.nodes:
                raise SandboxError(
                    f"sandbox {self.state_dir} runs on {state.subnet}, not {self._subnet_arg}",
                    hint="run `fleet sandbox down` first, or use another state dir",
                )
            state.subnet = self._subnet_arg
        if self._max_startups_arg is not None:
            state.max_startups = self._max_startups_arg
        return state

    def _save(self, state: SandboxState) -> None:
        """sandbox.json, with the bridge it runs on."""
        self._state.save(state, self._network.gateway(parse_subnet(state.subnet)))

    # ----------------------------------------------------------------- nodes

    def _healthy(self, rec: NodeRecord) -> bool:
        """A node worth keeping: init alive, netns and veth still there."""
        return nodes_.healthy(rec, self.state_dir)

    def _teardown(self, records: Sequence[NodeRecord], sweep: bool = False) -> None:
        """Kill nodes, then delete their veths and netns (sweep: all with our names)."""
        nodes_.kill_nodes(records, self.state_dir, sweep)
        self._network.delete_links(records, sweep)

    def _create_nodes(
        self,
        state: SandboxState,
        net: ipaddress.IPv4Network,
        names: Sequence[str],
        client_pub: str,
    ) -> list[NodeRecord]:
        """Create nodes: files and keys, netns+veth in one batch, then launch all at once."""
        if not names:
            return []
        used = {r.index for r in state.nodes}
        free = (i for i in range(capacity(net)) if i not in used)
        records = [
            nodes_.new_record(self._layout, self.sid, name, next(free), net) for name in names
        ]
        self._teardown(records)  # leftovers of a crashed run with the same names
        parallel(lambda r: nodes_.prepare_node_dir(r, client_pub), records)
        state.nodes = state.nodes + records
        self._save(state)  # recorded before anything exists, so `down` can always clean up
        self._network.create_links(records)
        prefix = f"/{net.prefixlen}"
        pids = parallel(lambda r: nodes_.launch(r, prefix, self.state_dir), records, workers=8)
        launched = [replace(r, launcher_pid=pid) for r, pid in zip(records, pids, strict=True)]
        state.nodes = [r for r in state.nodes if r not in records] + launched
        self._save(state)
        self._network.attach(launched)
        return nodes_.await_init(launched)


def _absolute(path: Path) -> Path:
    """`path` made absolute with its parent resolved but not its last part, which the state
    dir's check then sees as it is: a symlink there is refused, never followed."""
    path = Path(os.path.abspath(path))
    return path.parent.resolve() / path.name


def _names(records: Iterable[NodeRecord]) -> set[str]:
    """Node names of some records."""
    return {r.node.name for r in records}
